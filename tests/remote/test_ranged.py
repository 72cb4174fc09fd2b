"""Sample indexes in a bucket: written at pack time, and an epoch's first batch read by ranged reads
while the whole shards are still held back."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import threading
import time

import shardstream
from shardstream.dataset import ShardDataset
from shardstream.dataset.shards import ranged
from shardstream.formats.tar_index import parse_index
from shardstream.manifest.side_names import index_name

from .data import image_folder


def _pack(bucket, tmp_path, **kw):
    image_folder(tmp_path / "src")
    shardstream.pack(
        tmp_path / "src", tmp_path / "local", samples_per_shard=4, progress=False, **kw
    )
    return shardstream.pack(
        tmp_path / "src",
        bucket.url("ds"),
        storage_options=bucket.storage_options,
        samples_per_shard=4,
        progress=False,
        **kw,
    ).manifest


def test_a_pack_to_a_bucket_writes_a_checked_index_per_shard(s3_bucket, tmp_path):
    manifest = _pack(s3_bucket, tmp_path)
    local = ShardDataset(str(tmp_path / "local")).manifest
    # the shards themselves are the same bytes as a local pack's
    assert manifest.sha256 == local.sha256
    # and the same indexes as a local pack's
    assert local.index_sha256 == manifest.index_sha256
    assert len(manifest.index_sha256) == manifest.num_shards
    for i, path in enumerate(manifest.paths):
        raw = s3_bucket.read(f"ds/{index_name(path)}")
        assert hashlib.sha256(raw).hexdigest() == manifest.index_sha256[i]
        shard = s3_bucket.read(f"ds/{path}")
        index = parse_index(raw, path, int(manifest.stored_counts[i]), len(shard))
        for j in range(len(index)):
            start, end = index.span(j)
            index.check(j, shard[start:end], path)
            with tarfile.open(fileobj=io.BytesIO(shard[start:end] + bytes(1024))) as t:
                # one sample per span
                assert len({m.name.split(".")[0] for m in t.getmembers()}) == 1


def _whole(range_header: str | None, sizes: dict[str, int], target: str) -> bool:
    """Whether a GET asks for a whole shard (not one sample of it)."""
    found = re.search(r"(shard-\d+-[0-9a-f]{16}\.tar)$", target)
    if found is None or range_header is None:
        return found is not None
    first, last = map(int, re.fullmatch(r"bytes=(\d+)-(\d+)", range_header).groups())
    return first == 0 and last + 1 == sizes[found.group(1)]


def test_the_first_batch_comes_by_ranged_reads_while_whole_shards_are_held(
    s3_bucket, proxied, tmp_path, monkeypatch
):
    # a busy machine's slow GET must not turn ranged reads off
    monkeypatch.setattr(ranged, "PROBE_SECONDS", 30.0)
    manifest = _pack(s3_bucket, tmp_path)
    sizes = dict(zip(manifest.paths, manifest.nbytes.tolist()))
    bucket = proxied(s3_bucket)
    release = threading.Event()

    def hold_whole_shards(seen) -> None:
        if seen.method == "GET" and _whole(seen.range, sizes, seen.target):
            # released by the test once the first batch is out (60 s: a failing test ends)
            release.wait(60)

    bucket.proxy.inject("delay", seconds=0, method="GET", callback=hold_whole_shards)
    remote = ShardDataset(
        bucket.url("ds"),
        decode=None,
        seed=3,
        storage_options=bucket.storage_options,
        cache_dir=str(tmp_path / "cache"),
    )
    local = ShardDataset(str(tmp_path / "local"), decode=None, seed=3)
    expected = [(k, bytes(v)) for b in local.loader(4, 0) for k, v in zip(b["__key__"], b["jpg"])]
    it = iter(remote.loader(4, 0))
    try:
        first = next(it)
        delivered = [
            x for x in bucket.proxy.log if x.method == "GET" and _whole(x.range, sizes, x.target)
        ]
        # no whole shard has been delivered (all are held)
        assert not delivered and not release.is_set()
    finally:
        release.set()
    batches = [first, *it]
    got = [(k, bytes(v)) for b in batches for k, v in zip(b["__key__"], b["jpg"])]
    assert got == expected  # the plan's order and the packed bytes, whichever way each sample came
    singles = [
        s
        for s in bucket.proxy.log
        if s.method == "GET"
        and s.range
        and not _whole(s.range, sizes, s.target)
        and s.target.endswith(".tar")
    ]
    assert len(singles) >= 4  # the first batch's samples, one ranged GET each


def _read_through(bucket, tmp_path, manifest, batch: int):
    sizes = dict(zip(manifest.paths, manifest.nbytes.tolist()))
    remote = ShardDataset(
        bucket.url("ds"),
        decode=None,
        seed=3,
        storage_options=bucket.storage_options,
        cache_dir=str(tmp_path / "cache"),
    )
    local = ShardDataset(str(tmp_path / "local"), decode=None, seed=3)
    expected = [k for b in local.loader(batch, 0) for k in b["__key__"]]
    assert [k for b in remote.loader(batch, 0) for k in b["__key__"]] == expected
    singles = [
        s
        for s in bucket.proxy.log
        if s.method == "GET" and s.target.endswith(".tar") and not _whole(s.range, sizes, s.target)
    ]
    wholes = bucket.proxy.count("GET", r"\.tar$") - len(singles)
    return len(singles), wholes


def test_a_slow_link_keeps_ranged_reads(s3_bucket, proxied, tmp_path):
    manifest = _pack(s3_bucket, tmp_path)
    bucket = proxied(s3_bucket)
    # latency: one GET and eight at once alike
    bucket.proxy.inject("delay", seconds=0.3, method="GET")
    singles, wholes = _read_through(bucket, tmp_path, manifest, 12)
    # the first batch by ranged reads, every shard once
    assert singles >= 12 and wholes == manifest.num_shards


def test_a_server_that_serves_ranged_gets_one_by_one_gets_a_few_then_whole_shards(
    s3_bucket, proxied, tmp_path
):
    manifest = _pack(s3_bucket, tmp_path)
    sizes = dict(zip(manifest.paths, manifest.nbytes.tolist()))
    bucket = proxied(s3_bucket)
    one_at_a_time = threading.Lock()

    def serially(
        seen,
    ) -> None:  # as moto does: each ranged GET works alone, at the cost of a whole object
        if (
            seen.method == "GET"
            and seen.target.endswith(".tar")
            and not _whole(seen.range, sizes, seen.target)
        ):
            with one_at_a_time:
                time.sleep(0.1)

    bucket.proxy.inject("delay", seconds=0, method="GET", callback=serially)
    singles, wholes = _read_through(bucket, tmp_path, manifest, 12)
    assert singles == 1 + ranged.PROBE_WAVE  # one, then a wave that took several times one: no more
    assert wholes == manifest.num_shards


def test_a_damaged_sample_is_never_returned(s3_bucket, tmp_path):
    manifest = _pack(s3_bucket, tmp_path)
    path = manifest.paths[0]
    shard = bytearray(s3_bucket.read(f"ds/{path}"))
    # inside the first sample's first member: its data no longer matches the index
    shard[700] ^= 0xFF
    s3_bucket.write(f"ds/{path}", bytes(shard))
    ds = ShardDataset(
        s3_bucket.url("ds"),
        decode=None,
        shuffle=False,
        storage_options=s3_bucket.storage_options,
        cache_dir=str(tmp_path / "cache"),
    )
    try:
        list(ds.loader(4, 0))
    except shardstream.ShardstreamError as exc:
        # the whole shard, read instead, says what is wrong
        assert "sha256" in str(exc) and path in str(exc)
    else:
        raise AssertionError("a shard whose bytes differ from the manifest was read")
