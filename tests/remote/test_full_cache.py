"""A shard cache on a full disk: a dataset in a bucket is read from memory, exactly, with one warning. The
cache is a small tmpfs filled to an exact number of free pages (mounting needs root; skipped otherwise)."""

from __future__ import annotations

import logging
import random

import pytest

import shardstream
from shardstream.dataset import ShardDataset
from tests.oslimits import leave_free, tiny_tmpfs
from tests.sample_datasets import make_files


@pytest.mark.parametrize("free", [0, 8192], ids=["no-room", "less-than-a-shard"])
def test_a_full_cache_disk_means_reading_from_memory_with_one_warning(
    s3_bucket, tmp_path, caplog, free
):
    rng = random.Random(5)
    files = {f"{i:03d}.bin": rng.randbytes(3000) for i in range(24)}
    src = make_files(tmp_path / "src", files)
    url = s3_bucket.url("ds")
    shardstream.pack(
        src, url, storage_options=s3_bucket.storage_options, samples_per_shard=6, progress=False
    )
    expected = {name[: -len(".bin")]: data for name, data in files.items()}
    with tiny_tmpfs(tmp_path / "disk", "256k") as disk:
        leave_free(disk, free)
        cache = disk / "shards"  # (the mount's own folder is open to all: a cache refuses it)
        with caplog.at_level(logging.WARNING, logger="shardstream"):
            ds = ShardDataset(
                url,
                storage_options=s3_bucket.storage_options,
                cache_dir=str(cache),
                shuffle=False,
                decode=None,
            )
            got = {s["__key__"]: bytes(s["bin"]) for s in ds}
            got_again = {s["__key__"]: bytes(s["bin"]) for s in ds}
        assert got == expected and got_again == expected
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert f"cannot keep shards in the cache {cache}" in warnings[0]
        assert "no space left" in warnings[0] and "reading them from memory" in warnings[0]
        assert not list(cache.glob("*.shard")) and not list(cache.glob(".*.part"))
