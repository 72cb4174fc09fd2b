"""The shard cache's folder removed again and again while a dataset in a bucket is read (a temporary-file
cleaner): ShardMap and ShardDataset (reader threads, worker processes) read every sample exactly, with
no error; the folder is made again by the next download. On a full disk, cached shards whose check
records are gone are checked again unrecorded and read (mounting a tmpfs needs root; skipped otherwise)."""

from __future__ import annotations

import gc
import random
import shutil

import pytest

import shardstream
from shardstream import ShardDataset, ShardMap
from shardstream.dataset.shards import sparse
from tests.oslimits import leave_free, tiny_tmpfs
from tests.sample_datasets import make_files


def _pack(bucket, tmp_path) -> tuple[str, dict[str, bytes]]:
    rng = random.Random(11)
    files = {f"{i:03d}.bin": rng.randbytes(3000) for i in range(48)}
    url = bucket.url("ds")
    shardstream.pack(
        make_files(tmp_path / "src", files),
        url,
        storage_options=bucket.storage_options,
        samples_per_shard=6,
        progress=False,
    )
    return url, {name[: -len(".bin")]: data for name, data in files.items()}


def test_a_map_reads_on_while_its_cache_folder_is_removed(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(sparse, "SMALL_SHARD", 0)  # ranged reads, then whole shards once dense
    url, expected = _pack(s3_bucket, tmp_path)
    cache = tmp_path / "cache"
    m = ShardMap(url, decode=None, storage_options=s3_bucket.storage_options, cache_dir=str(cache))
    order = list(range(len(m)))
    random.Random(1).shuffle(order)
    got = {}
    for start in range(0, len(order), 4):
        for s in m.__getitems__(order[start : start + 4]):
            got[s["__key__"]] = bytes(s["bin"])
        shutil.rmtree(cache, ignore_errors=True)  # after every batch
    assert got == expected


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_dataset_reads_on_while_its_cache_folder_is_removed(s3_bucket, tmp_path, workers):
    url, expected = _pack(s3_bucket, tmp_path)
    cache = tmp_path / "cache"
    ds = ShardDataset(
        url, decode=None, seed=1, storage_options=s3_bucket.storage_options, cache_dir=str(cache)
    )
    for _ in range(2):  # the second epoch finds no cache at all
        got = {}
        for batch in ds.loader(4, num_workers=2, workers=workers):
            got.update({k: bytes(v) for k, v in zip(batch["__key__"], batch["bin"])})
            shutil.rmtree(cache, ignore_errors=True)
        assert got == expected


def test_cached_shards_without_check_records_on_a_full_disk_are_read(s3_bucket, tmp_path):
    url, expected = _pack(s3_bucket, tmp_path)
    with tiny_tmpfs(tmp_path / "disk", "512k") as disk:
        cache = disk / "shards"
        opts = {"storage_options": s3_bucket.storage_options, "cache_dir": str(cache)}
        warm = ShardDataset(url, decode=None, shuffle=False, **opts)
        assert {s["__key__"]: bytes(s["bin"]) for s in warm} == expected
        del warm
        gc.collect()
        assert len(list(cache.glob("*.shard"))) == 8
        shutil.rmtree(cache / "checked")  # records gone (an upgrade, a cleaner)
        leave_free(disk, 0)
        m = ShardMap(url, decode=None, **opts)
        assert {m[i]["__key__"]: bytes(m[i]["bin"]) for i in range(len(m))} == expected
        ds = ShardDataset(url, decode=None, **opts)
        got = {
            k: bytes(v) for b in ds.loader(4, num_workers=2) for k, v in zip(b["__key__"], b["bin"])
        }
        assert got == expected
