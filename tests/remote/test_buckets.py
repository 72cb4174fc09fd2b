"""Datasets in real buckets, on each store (``[s3]``: moto; ``[gcs]``: fake-gcs-server).

Pack through the Python API and the command line, read back with ``ShardDataset`` and its
loader (every sample once, bytes equal to the source, exact resume, decoded images), inspect
and verify with the command line, index WebDataset tars already in a bucket, and the
guarantees about what a bucket shows while and after a pack fails or is overwritten.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import shardstream
from shardstream.manifest import dataset_store
from shardstream.manifest.side_names import version_name
from tests.folders import indexed
from tests.sample_datasets import RUN, without_run

from .clitools import invoke, ok, one_line_error
from .data import CLASSES, class_of, image_folder, parquet_table, wds_tars

SHARDS = ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar", "shard-000003.tar"]
WITH_INDEXES = indexed(*SHARDS)  # packs to a bucket index samples
COUNTS = [4, 4, 4, 2]  # 14 images, 4 per shard


def published(bucket, prefix: str, shards: list[str] = WITH_INDEXES) -> list[str]:
    """What a finished image pack at ``prefix`` holds: its manifest, the images' recorded sizes (the side
    file that manifest names) and ``shards``, run tokens left out."""
    m = shardstream.load_manifest(dataset_store(bucket.url(prefix), bucket.storage_options))
    sizes = [f"{prefix}/{m.image_sizes.reference['file']}"] if m.image_sizes is not None else []
    return sorted([f"{prefix}/_manifest.json", *sizes, *(f"{prefix}/{s}" for s in shards)])


def pack_images(bucket, tmp_path, prefix: str = "ds", **kwargs):
    """Pack a fresh 14-image ImageFolder into ``bucket/prefix``; returns ({key: jpeg bytes}, PackResult)."""
    files = image_folder(tmp_path / "src")
    kwargs.setdefault("workers", 2)
    kwargs.setdefault("shuffle", False)  # the checks below read the shards in source order
    result = shardstream.pack(
        tmp_path / "src",
        bucket.url(prefix),
        storage_options=bucket.storage_options,
        samples_per_shard=4,
        progress=False,
        **kwargs,
    )
    return files, result


def upload_rule(bucket, key: str) -> dict:
    """Proxy filters for the upload of object ``key``: S3 PUTs name it in the path, GCS uploads in the body."""
    if bucket.kind == "s3":
        return {"method": "PUT", "path": f"/{bucket.name}/{key}$"}
    return {"method": "POST", "content": f'"name": ?"{key}"'}


# -- packing and reading through the Python API ------------------------------------------------------------------


def test_pack_publishes_shards_and_manifest_and_nothing_else(bucket, tmp_path):
    files, result = pack_images(bucket, tmp_path)
    assert (result.samples, result.shards, result.url) == (14, 4, bucket.url("ds"))
    keys = bucket.keys("ds")  # no marker, no temporaries; shards named with the run's token
    assert [without_run(k) for k in keys] == published(bucket, "ds")
    m = shardstream.load_manifest(dataset_store(bucket.url("ds"), bucket.storage_options))
    assert m.image_sizes is not None  # the images' recorded sizes, in the side file it names
    assert [without_run(p) for p in m.paths] == SHARDS and m.stored_counts.tolist() == COUNTS
    assert m.classes == list(CLASSES) and all(f"ds/{p}" in keys for p in m.paths)
    keys = []
    for i, name in enumerate(m.paths):
        data = bucket.read(f"ds/{name}")
        assert len(data) == m.nbytes[i] and hashlib.sha256(data).hexdigest() == m.sha256[i]
        with tarfile.open(
            fileobj=io.BytesIO(data)
        ) as tar:  # a plain tar, as WebDataset writes them
            members = tar.getmembers()
            keys += [n.name[: -len(".jpg")] for n in members if n.name.endswith(".jpg")]
            for member in members:
                key, ext = member.name.split(".", 1)
                value = tar.extractfile(member).read()
                assert value == (files[key] if ext == "jpg" else str(class_of(key)).encode())
    assert keys == list(files)


def test_read_back_in_the_main_process(bucket, tmp_path):
    files, _ = pack_images(bucket, tmp_path)
    ds = shardstream.ShardDataset(
        bucket.url("ds"), storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    assert len(ds) == 14
    samples = list(ds)
    assert [s["__key__"] for s in samples] == list(files)
    for s in samples:
        assert bytes(s["jpg"]) == files[s["__key__"]]
        assert int(bytes(s["cls"])) == class_of(s["__key__"])


def test_loader_with_two_workers_reads_every_sample_once(bucket, tmp_path):
    files, _ = pack_images(bucket, tmp_path)
    ds = shardstream.ShardDataset(
        bucket.url("ds"), storage_options=bucket.storage_options, decode=None, shuffle=True, seed=5
    )
    loader = ds.loader(batch_size=3, num_workers=2)
    seen: dict[str, bytes] = {}
    batches = 0
    for batch in loader:
        batches += 1
        for key, jpg in zip(batch["__key__"], list(batch["jpg"])):
            assert key not in seen
            seen[key] = bytes(jpg)
    assert batches == 5 and seen == files


def test_resume_mid_epoch_continues_exactly_without_reading_consumed_shards(
    bucket, tmp_path, proxied
):
    _, _ = pack_images(bucket, tmp_path)
    url, opts = bucket.url("ds"), bucket.storage_options

    def loader(storage_options, cache: str, workers: int, shuffle: bool = False):
        ds = shardstream.ShardDataset(
            url,
            storage_options=storage_options,
            decode=None,
            shuffle=shuffle,
            seed=9,
            cache_dir=tmp_path / cache,
        )
        return ds.loader(batch_size=4, num_workers=workers)

    whole = [k for b in loader(opts, "c0", 2, shuffle=True) for k in b["__key__"]]
    first = loader(opts, "c1", 2, shuffle=True)
    it = iter(first)
    head = [k for _ in range(2) for k in next(it)["__key__"]]
    state = first.state_dict()
    del it
    resumed = loader(opts, "c2", 1, shuffle=True)  # another worker count, a cold cache
    resumed.load_state_dict(state)
    rest = [k for b in resumed for k in b["__key__"]]
    assert head + rest == whole and len(whole) == 14

    # unshuffled, the first two batches are shards 0 and 1: after the resume they are never downloaded
    plain = loader(opts, "c3", 0)
    it = iter(plain)
    head = [k for _ in range(2) for k in next(it)["__key__"]]
    state = plain.state_dict()
    del it
    seen = proxied(bucket)
    resumed = loader(seen.storage_options, "c4", 1)
    resumed.load_state_dict(state)
    rest = [k for b in resumed for k in b["__key__"]]
    assert len(head) == 8 and len(rest) == 6 and not set(head) & set(rest)
    assert seen.proxy.count("GET", rf"shard-00000[01]{RUN}\.tar") == 0
    assert seen.proxy.count("GET", rf"shard-00000[23]{RUN}\.tar") >= 2


def test_decode_torch_gives_the_images(bucket, tmp_path):
    files, _ = pack_images(bucket, tmp_path)
    ds = shardstream.ShardDataset(
        bucket.url("ds"), storage_options=bucket.storage_options, decode="torch", shuffle=False
    )
    batches = list(ds.loader(batch_size=7, num_workers=2))
    assert len(batches) == 2
    for batch in batches:
        images, labels = batch["jpg"], batch["cls"]
        assert images.dtype == torch.uint8
        assert tuple(images.shape) == (7, 3, 24, 32)
        for key, image, label in zip(batch["__key__"], images, labels.tolist()):
            expected = np.asarray(Image.open(io.BytesIO(files[key])).convert("RGB")).transpose(
                2, 0, 1
            )
            diff = np.abs(image.numpy().astype(np.int16) - expected.astype(np.int16))
            assert diff.max() <= 8 and diff.mean() < 1.0  # Pillow or simplejpeg
            assert label == class_of(key)


def test_table_to_arrow_shards_and_back(bucket, tmp_path):
    table = parquet_table(tmp_path / "t.parquet", rows=40)
    result = shardstream.pack(
        tmp_path / "t.parquet",
        bucket.url("tab"),
        storage_options=bucket.storage_options,
        samples_per_shard=15,
        progress=False,
        shuffle=False,
    )
    assert (result.samples, result.shards) == (40, 3)
    assert [without_run(k) for k in bucket.keys("tab")] == ["tab/_manifest.json"] + [
        f"tab/shard-00000{i}.arrow" for i in range(3)
    ]
    ds = shardstream.ShardDataset(
        bucket.url("tab"), storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    assert list(ds) == table.to_pylist()
    batched = shardstream.ShardDataset(
        bucket.url("tab"), storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    ids, blobs = [], []
    for batch in batched.loader(batch_size=8, num_workers=2):
        ids += batch["id"].tolist()  # numeric columns arrive as tensors
        blobs += [bytes(b) for b in batch["blob"]]
    assert ids == list(range(40)) and blobs == table.column("blob").to_pylist()


# -- the command line ----------------------------------------------------------------------------------------------


def test_cli_pack_info_ls_cat_verify(bucket, tmp_path):
    files = image_folder(tmp_path / "src")
    url, o = bucket.url("cli"), bucket.cli_options
    packed = ok(
        "pack",
        tmp_path / "src",
        url,
        "--samples-per-shard",
        "4",
        "--workers",
        "2",
        "--no-shuffle",
        "-q",
        *o,
    )
    assert packed.stdout.startswith("packed 14 samples into 4 tar shards") and url in packed.stdout
    doc = json.loads(ok("info", url, "--json", *o).stdout)
    assert (doc["url"], doc["num_samples"], doc["num_shards"], doc["classes"]) == (
        url,
        14,
        4,
        list(CLASSES),
    )
    text = ok("info", url, *o).stdout
    assert url in text and "14" in text
    rows = [json.loads(line) for line in ok("ls", url, "--json", *o).stdout.splitlines()]
    assert [without_run(r["path"]) for r in rows] == SHARDS and [
        r["samples"] for r in rows
    ] == COUNTS
    for r in rows:
        data = bucket.read(f"cli/{r['path']}")
        assert r["bytes"] == len(data) and r["sha256"] == hashlib.sha256(data).hexdigest()
    assert rows[3]["path"] in ok("ls", url, *o).stdout
    keys = list(files)
    shown = ok("cat", url, "5", *o).stdout
    assert f"__key__  {keys[5]}" in shown and "cls" in shown
    assert ok("cat", url, "5", "--field", "jpg", *o).stdout_bytes == files[keys[5]]
    assert ok("cat", url, "-1", "--field", "jpg", *o).stdout_bytes == files[keys[-1]]
    assert ok("cat", url, "--key", "dog/2", "--field", "cls", *o).stdout_bytes == b"1"
    verified = ok("verify", url, "-q", *o)
    assert verified.stdout.splitlines() == [
        f"ok: 4 shards, 14 samples, {_size(rows)} in {url}",
        "per-sample checksums (xxh3_64): every shard has them; every value matched",
    ]


def _size(rows) -> str:
    from shardstream.sizes import format_size

    return format_size(sum(r["bytes"] for r in rows))


def test_cli_connection_flags_instead_of_storage_options(bucket, tmp_path):
    image_folder(tmp_path / "src")
    url = bucket.url("flags")
    flags = ["--endpoint-url", bucket.endpoint_url] + (["--anon"] if bucket.kind == "gcs" else [])
    ok("pack", tmp_path / "src", url, "--samples-per-shard", "4", "-q", *flags)
    assert json.loads(ok("info", url, "--json", *flags).stdout)["num_samples"] == 14
    assert len(ok("ls", url, "--json", *flags).stdout.splitlines()) == 4
    assert ok("cat", url, "0", *flags).stdout.startswith("__key__")
    assert ok("verify", url, "-q", *flags).stdout.startswith("ok: 4 shards, 14 samples")


def test_s3_anonymous_access_reads_public_objects_only(s3_bucket, tmp_path):
    bucket = s3_bucket
    files, _ = pack_images(bucket, tmp_path)
    url, anon = bucket.url("ds"), ["--endpoint-url", bucket.endpoint_url, "--anon"]
    # private objects: unsigned requests are refused
    one_line_error(invoke("info", url, *anon), url)
    client = bucket.server.client()
    for key in bucket.keys("ds"):
        client.put_object_acl(Bucket=bucket.name, Key=key, ACL="public-read")
    assert json.loads(ok("info", url, "--json", *anon).stdout)["num_samples"] == 14
    assert ok("verify", url, "-q", *anon).stdout.startswith("ok: 4 shards, 14 samples")
    ds = shardstream.ShardDataset(
        url,
        storage_options={"endpoint_url": bucket.endpoint_url, "anon": True},
        decode=None,
        shuffle=False,
    )
    assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == files


def test_cli_connection_flags_that_do_not_apply(bucket, tmp_path):
    url = bucket.url("ds")
    if bucket.kind == "gcs":
        one_line_error(
            invoke("info", url, "--profile", "p", "--anon", "--endpoint-url", bucket.endpoint_url),
            url,
            "profile",
        )
    one_line_error(
        invoke("info", tmp_path / "local", "--endpoint-url", bucket.endpoint_url), str(tmp_path)
    )
    one_line_error(
        invoke("info", "http://127.0.0.1:9/ds", "--endpoint-url", bucket.endpoint_url),
        "http://127.0.0.1:9/ds",
    )


def test_cli_verify_names_every_damaged_shard(bucket, tmp_path):
    _, packed = pack_images(bucket, tmp_path)
    url, o = bucket.url("ds"), bucket.cli_options
    one, two = packed.manifest.paths[1:3]
    data = bytearray(bucket.read(f"ds/{two}"))
    data[700] ^= 0xFF  # same size, one byte changed
    bucket.write(f"ds/{two}", bytes(data))
    bucket.delete(f"ds/{one}")
    result = invoke("verify", url, "-q", *o)
    assert result.exit_code == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert [line.split(":", 1)[0] for line in lines] == ["damaged", "damaged", "error"], lines
    assert f"{url}/{one}" in lines[0] and "no such file" in lines[0]
    assert lines[1].startswith(f"damaged: {url}/{two}: checksum mismatch")
    assert lines[2] == f"error: 2 of 4 shards are damaged in {url}"


def test_cli_index_webdataset_tars_in_a_bucket(bucket, tmp_path):
    paths, samples = wds_tars(tmp_path / "wds")
    for p in paths:
        bucket.write(f"wds/{p.name}", p.read_bytes())
        bucket.write(f"wds-folder/{p.name}", p.read_bytes())
    bucket.write("wds-folder/README.txt", b"not a shard")
    o = bucket.cli_options
    done = ok("index", bucket.url("wds", "part-{000..002}.tar"), "-q", *o)
    assert (
        done.stdout.strip().startswith("indexed 3 shards, 15 samples")
        and bucket.url("wds") in done.stdout
    )
    assert "wds/_manifest.json" in bucket.keys("wds")
    ds = shardstream.ShardDataset(
        bucket.url("wds"), storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    got = {s["__key__"]: {"txt": bytes(s["txt"]), "bin": bytes(s["bin"])} for s in ds}
    assert got == samples

    ok("index", bucket.url("wds-folder"), "-q", *o)  # a folder: its tars, nothing else
    m = shardstream.load_manifest(dataset_store(bucket.url("wds-folder"), bucket.storage_options))
    assert m.paths == [p.name for p in paths] and m.num_samples == 15
    refused = invoke("index", bucket.url("wds-folder"), "-q", *o)
    one_line_error(refused, bucket.url("wds-folder"), "_manifest.json")


def test_cli_index_sees_objects_added_since_it_last_listed(bucket, tmp_path):
    """A folder's listing is not served from what this process listed earlier (the manifest goes to the
    parent folder, so no write of shardstream's own touches the listed folder in between)."""
    paths, _ = wds_tars(tmp_path / "wds", shards=4)
    for p in paths[:3]:
        bucket.write(f"idx/tars/{p.name}", p.read_bytes())
    o = bucket.cli_options
    tars, out = bucket.url("idx", "tars"), bucket.url("idx")
    assert ok("index", tars, "--output", out, "-q", *o).stdout.startswith("indexed 3 shards")
    bucket.write(f"idx/tars/{paths[3].name}", paths[3].read_bytes())  # behind shardstream's back
    added = ok("index", tars, "--output", out, "--overwrite", "-q", *o)
    assert added.stdout.startswith("indexed 4 shards, 20 samples")
    bucket.delete(f"idx/tars/{paths[0].name}")
    removed = ok("index", tars, "--output", out, "--overwrite", "-q", *o)
    assert removed.stdout.startswith("indexed 3 shards, 15 samples")


def test_store_listing_and_exists_follow_changes_made_elsewhere(bucket):
    """Two Store objects on one location share fsspec's cached filesystem; what one listed must not hide
    objects another process added or deleted since."""
    from shardstream.storage import Store

    bucket.write("d/a.tar", b"a")
    bucket.write("d/b.tar", b"b")
    assert Store(bucket.url("d"), bucket.storage_options).list_files() == ["a.tar", "b.tar"]
    bucket.write("d/c.tar", b"c")  # another process's changes
    bucket.delete("d/a.tar")
    store = Store(bucket.url("d"), bucket.storage_options)
    assert (store.exists("a.tar"), store.exists("c.tar")) == (False, True)
    assert store.list_files() == ["b.tar", "c.tar"]


def test_reading_tars_without_a_manifest_from_a_brace_pattern(bucket, tmp_path):
    paths, samples = wds_tars(tmp_path / "wds", shards=2)
    for p in paths:
        bucket.write(f"raw/{p.name}", p.read_bytes())
    ds = shardstream.ShardDataset(
        bucket.url("raw", "part-{000..001}.tar"),
        storage_options=bucket.storage_options,
        decode=None,
        shuffle=False,
    )
    assert [s["__key__"] for s in ds] == list(samples)


# -- what a bucket shows around failures and overwrites --------------------------------------------------------------


def test_overwrite_on_a_bucket(bucket, tmp_path):
    _, old = pack_images(bucket, tmp_path)
    url, o = bucket.url("ds"), bucket.cli_options
    before = bucket.read("ds/_manifest.json")
    newer = image_folder(tmp_path / "newer")
    refused = invoke("pack", tmp_path / "newer", url, "-q", *o)
    one_line_error(refused, url, "--overwrite")
    assert bucket.read("ds/_manifest.json") == before  # untouched
    ok("pack", tmp_path / "newer", url, "--samples-per-shard", "8", "--overwrite", "-q", *o)
    # the old shards are gone once the new manifest is published, not left beside the new dataset; the
    # overwrite is version 2, published by its version file
    assert [without_run(k) for k in bucket.keys("ds")] == sorted(
        [
            *published(
                bucket,
                "ds",
                indexed("shard-000000.tar", "shard-000001.tar"),
            ),
            f"ds/{version_name(2)}",
        ]
    )
    assert not set(bucket.keys("ds")) & {f"ds/{p}" for p in old.manifest.paths}
    ds = shardstream.ShardDataset(
        url, storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == newer


def test_foreign_shard_names_are_not_replaced_without_overwrite(bucket, tmp_path):
    image_folder(tmp_path / "src")
    bucket.write("mixed/shard-000000.tar", b"someone else's tar")
    url, o = bucket.url("mixed"), bucket.cli_options
    one_line_error(
        invoke("pack", tmp_path / "src", url, "-q", *o), url, "shard-000000.tar", "--overwrite"
    )
    assert bucket.keys("mixed") == ["mixed/shard-000000.tar"]
    assert bucket.read("mixed/shard-000000.tar") == b"someone else's tar"


def test_a_pack_whose_upload_fails_publishes_nothing_and_a_rerun_completes(
    bucket, tmp_path, proxied
):
    from .proxy import gcs_error, s3_error

    via = proxied(bucket)
    if bucket.kind == "s3":
        body = s3_error("AccessDenied", "Access Denied")
    else:
        body = gcs_error(403, "Forbidden", "forbidden")
    rule = via.proxy.inject(
        "status", status=403, body=body, **upload_rule(bucket, rf"ds/shard-000002{RUN}\.tar")
    )
    files = image_folder(tmp_path / "src")
    url = bucket.url("ds")
    with pytest.raises(
        shardstream.ShardstreamError, match=rf"{re.escape(url)}/shard-000002{RUN}\.tar"
    ):
        shardstream.pack(
            tmp_path / "src",
            url,
            storage_options=via.storage_options,
            samples_per_shard=4,
            workers=2,
            progress=False,
        )
    assert rule.applied >= 1
    assert "ds/_manifest.json" not in bucket.keys("ds")
    with pytest.raises(shardstream.ManifestError, match="holds an unfinished shardstream pack"):
        shardstream.ShardDataset(url, storage_options=bucket.storage_options)
    rule.remove()
    # no --overwrite needed: the leftovers are its own
    result = shardstream.pack(
        tmp_path / "src",
        url,
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
        workers=1,
        progress=False,
    )
    # the same shards as a pack that never failed
    assert result.manifest.sha256 == clean.manifest.sha256
    assert [without_run(k) for k in bucket.keys("ds")] == published(bucket, "ds")
    ds = shardstream.ShardDataset(
        url, storage_options=bucket.storage_options, decode=None, shuffle=False
    )
    assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == files


def test_a_source_file_changing_mid_pack_publishes_nothing(bucket, tmp_path, proxied):
    via = proxied(bucket)
    image_folder(tmp_path / "src")
    victim = tmp_path / "src" / "dog" / "6.jpg"  # in the last shard

    def shrink(_seen) -> None:  # while the first shard is being uploaded
        victim.write_bytes(victim.read_bytes()[:100])

    via.proxy.inject(
        "delay",
        seconds=0,
        times=1,
        callback=shrink,
        **upload_rule(bucket, rf"ds/shard-000000{RUN}\.tar"),
    )
    url = bucket.url("ds")
    result = invoke(
        "pack",
        tmp_path / "src",
        url,
        "--samples-per-shard",
        "4",
        "--workers",
        "1",
        "-q",
        *via.cli_options,
    )
    one_line_error(result, str(victim), "changed while packing")
    keys = [without_run(k) for k in bucket.keys("ds")]
    assert "ds/shard-000000.tar" in keys and "ds/_manifest.json" not in keys
