"""Transient faults between shardstream and a bucket, injected by the proxy: reads and uploads get through with
exactly the source's bytes; a fault that does not go away ends in an error naming the shard."""

from __future__ import annotations

import re

import pytest

import shardstream
from tests.sample_datasets import RUN

from .data import image_folder
from .proxy import gcs_error, s3_error

SHARD = rf"shard-000001{RUN}\.tar"  # shard names carry the token of the run that wrote them


def pack_into(bucket, tmp_path, prefix: str = "ds", index: bool = False):
    """A dataset in the bucket; without sample indexes unless asked: these tests count whole-shard GETs."""
    files = image_folder(tmp_path / prefix)
    url = bucket.url(prefix)
    result = shardstream.pack(
        tmp_path / prefix,
        url,
        storage_options=bucket.storage_options,
        samples_per_shard=4,
        workers=1,
        progress=False,
        index=index,
    )
    return files, url, result


def throttled(bucket) -> dict:
    """The service asking the client to slow down: S3 503 SlowDown, GCS 429 rateLimitExceeded."""
    if bucket.kind == "s3":
        return {"status": 503, "body": s3_error("SlowDown", "Please reduce your request rate.")}
    return {
        "status": 429,
        "body": gcs_error(429, "The rate of change requests is too high", "rateLimitExceeded"),
    }


def unavailable(bucket) -> dict:
    if bucket.kind == "s3":
        return {
            "status": 503,
            "body": s3_error("ServiceUnavailable", "Service is unable to handle request."),
        }
    return {"status": 503, "body": gcs_error(503, "Backend Error", "backendError")}


FAULTS = {
    "503": lambda b: {"kind": "status", **unavailable(b)},
    "throttled": lambda b: {"kind": "status", **throttled(b)},
    "reset": lambda b: {"kind": "reset"},
    "reset-mid-body": lambda b: {"kind": "truncate", "nbytes": 3000, "rst": True},
    "truncated": lambda b: {"kind": "truncate", "nbytes": 3000},
    "shortened": lambda b: {
        "kind": "short",
        "nbytes": 3000,
    },  # the client sees a complete, shorter object
    "stall": lambda b: {"kind": "stall", "seconds": 30},
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_transient_read_fault_is_retried(bucket, tmp_path, proxied, fault):
    files, url, _ = pack_into(bucket, tmp_path)
    via = proxied(bucket)
    spec = FAULTS[fault](bucket)
    rule = via.proxy.inject(spec.pop("kind"), method="GET", path=SHARD, times=1, **spec)
    ds = shardstream.ShardDataset(
        url,
        storage_options=via.storage_options,
        decode=None,
        shuffle=False,
        retries=2,
        timeout=1.0 if fault == "stall" else 30.0,
    )
    got = {s["__key__"]: bytes(s["jpg"]) for s in ds}
    assert got == files
    assert rule.applied == 1
    assert via.proxy.count("GET", SHARD) >= 2  # fetched again after the fault


def test_a_fault_that_persists_ends_in_an_error_naming_the_shard(bucket, tmp_path, proxied):
    _, url, _ = pack_into(bucket, tmp_path)
    via = proxied(bucket)
    # every download of it comes back short
    via.proxy.inject("short", nbytes=3000, method="GET", path=SHARD)
    ds = shardstream.ShardDataset(
        url, storage_options=via.storage_options, decode=None, shuffle=False, retries=1
    )
    with pytest.raises(shardstream.ShardstreamError, match=f"{re.escape(url)}/{SHARD}") as err:
        list(ds)
    assert "\n" not in str(err.value)
    # retries + 1 downloads (S3 may check a checksum on the way)
    assert 2 <= via.proxy.count("GET", SHARD) <= 4


@pytest.mark.parametrize(
    "fault",
    [{"kind": "short", "nbytes": 3000}, {"kind": "reset"}, {"kind": "status", "status": 503}],
)
def test_faulty_ranged_reads_never_give_wrong_samples(s3_bucket, tmp_path, proxied, fault):
    # S3 only: gcsfs retries each failing request itself for about 30 s, a minute per case here
    bucket = s3_bucket
    files, url, _ = pack_into(bucket, tmp_path, index=True)
    via = proxied(bucket)
    # each GET of that shard, not its index
    rule = via.proxy.inject(method="GET", path=SHARD + r"(\?|$)", **fault)
    ds = shardstream.ShardDataset(
        url,
        storage_options=via.storage_options,
        decode=None,
        retries=1,
        seed=2,
        cache_dir=str(tmp_path / "cache"),
    )
    try:
        got = {k: bytes(v) for b in ds.loader(4, 0) for k, v in zip(b["__key__"], b["jpg"])}
    except shardstream.ShardstreamError as exc:  # the whole shard never arrives: an error naming it
        assert re.search(f"{re.escape(url)}/{SHARD}", str(exc)) and "\n" not in str(exc)
    else:
        raise AssertionError(f"a shard that never arrives whole was read: {len(got)} samples")
    assert rule.applied >= 1
    rule.remove()
    # (the old cache remembers the failure)
    again = shardstream.ShardDataset(
        url,
        storage_options=via.storage_options,
        decode=None,
        seed=2,
        cache_dir=str(tmp_path / "fresh"),
    )
    assert {
        k: bytes(v) for b in again.loader(4, 0) for k, v in zip(b["__key__"], b["jpg"])
    } == files


def test_a_transient_upload_fault_is_retried_and_the_result_is_exact(bucket, tmp_path, proxied):
    via = proxied(bucket)
    files = image_folder(tmp_path / "src")
    if bucket.kind == "s3":  # S3 names the object in the path of a PUT, GCS in the body of a POST
        first, third = (
            {"method": "PUT", "path": rf"/ds/shard-000001{RUN}\.tar$"},
            {"method": "PUT", "path": rf"/ds/shard-000002{RUN}\.tar$"},
        )
    else:
        first, third = (
            {"method": "POST", "content": rf"ds/shard-000001{RUN}\.tar"},
            {"method": "POST", "content": rf"ds/shard-000002{RUN}\.tar"},
        )
    failed = via.proxy.inject("status", times=1, **unavailable(bucket), **first)
    # stored, but the answer never arrives
    lost = via.proxy.inject("reset", forward=True, times=1, **third)
    result = shardstream.pack(
        tmp_path / "src",
        bucket.url("ds"),
        storage_options=via.storage_options,
        samples_per_shard=4,
        workers=2,
        progress=False,
    )
    clean = shardstream.pack(
        tmp_path / "src",
        bucket.url("clean"),
        storage_options=bucket.storage_options,
        samples_per_shard=4,
        workers=2,
        progress=False,
    )
    assert (failed.applied, lost.applied) == (1, 1)
    assert result.manifest.sha256 == clean.manifest.sha256
    ds = shardstream.ShardDataset(
        bucket.url("ds"), storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == files


def test_latency_on_every_request_changes_nothing(bucket, tmp_path, proxied):
    files, url, _ = pack_into(bucket, tmp_path)
    via = proxied(bucket)
    via.proxy.inject("delay", seconds=0.02)
    ds = shardstream.ShardDataset(
        url, storage_options=via.storage_options, decode=None, shuffle=True, seed=1
    )
    got = {
        k: bytes(v)
        for batch in ds.loader(batch_size=4, num_workers=2)
        for k, v in zip(batch["__key__"], list(batch["jpg"]))
    }
    assert got == files
    assert via.proxy.count("GET", rf"shard-00000\d{RUN}\.tar") >= 4


def test_a_shard_in_ranged_parts_with_a_fault_on_one_part(bucket, tmp_path, proxied, monkeypatch):
    """A shard read whole in several ranged GETs (parts made small here): the one part that fails is
    fetched again and the shard is exact."""
    from shardstream.storage import fsspec_store

    monkeypatch.setattr(fsspec_store, "PART_SIZE", 4096)  # ~13 KB shards: 3 or 4 parts each
    files, url, result = pack_into(bucket, tmp_path)
    via = proxied(bucket)
    # the shard's 2nd GET only
    rule = via.proxy.inject("reset", method="GET", path=SHARD, after=1, times=1)
    ds = shardstream.ShardDataset(
        url, storage_options=via.storage_options, decode=None, shuffle=False, retries=2, prefetch=0
    )
    assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == files
    assert rule.applied == 1
    size = int(result.manifest.nbytes[1])
    ranges = {
        s.range
        for s in via.proxy.log
        if s.method == "GET" and "shard-000001" in s.target and s.status
    }
    expected = {f"bytes={start}-{min(start + 4096, size) - 1}" for start in range(0, size, 4096)}
    assert ranges == expected  # every part asked for once successfully, nothing more
