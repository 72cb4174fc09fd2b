"""A cached shard is checked against its name (its sha256) once per version of the file: one whose
bytes no longer match is removed and fetched again (counted, logged), so a damaged cache heals
itself; an unchanged file is hashed at most once per host, and never when this cache wrote it."""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import types
import uuid
from pathlib import Path

import pytest

from shardstream import ShardDataset, ShardWriter
from shardstream.storage import cache as cache_module
from shardstream.storage.cache import DiskCache
from shardstream.storage.fetch import ShardFetcher
from shardstream.storage.retry import RetryPolicy
from shardstream.storage.store import Store

FAST = RetryPolicy(retries=2, backoff=0.001)


def genuine_dataset(n: int = 8) -> str:
    url = f"memory://heal-{uuid.uuid4().hex}/ds"
    with ShardWriter(url, samples_per_shard=4) as w:
        for i in range(n):
            w.write({"__key__": f"{i:03d}", "txt": f"genuine {i}"})
    return url


def forge(path: str, replace: bool) -> None:
    """``genuine`` becomes ``FORGED!`` (same size) in the file, in place or as a new file over it."""
    data = Path(path).read_bytes()
    assert b"genuine" in data
    forged = data.replace(b"genuine", b"FORGED!")
    if replace:
        tmp = path + ".new"
        with open(tmp, "wb") as f:
            f.write(forged)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    else:
        with open(path, "r+b") as f:
            f.write(forged)


@pytest.mark.parametrize("replace", [False, True])
def test_a_forged_cached_shard_is_removed_and_fetched_again(tmp_path, replace, caplog):
    url = genuine_dataset()
    ds = ShardDataset(url, decode="torch", shuffle=False, cache_dir=tmp_path / "cache", retries=1)
    assert [s["txt"] for s in ds] == [f"genuine {i}" for i in range(8)]
    # a warm cache: every shard whole (the first samples may have come by ranged reads)
    for shard in range(2):
        bytes(ShardFetcher(ds.store, ds.manifest, ds.disk_cache).fetch(shard))
    gc.collect()
    cached = sorted((tmp_path / "cache").glob("*.shard"))
    assert len(cached) == 2
    forge(str(cached[0]), replace)
    again = ShardDataset(
        url, decode="torch", shuffle=False, cache_dir=tmp_path / "cache", retries=1
    )
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        assert [s["txt"] for s in again] == [f"genuine {i}" for i in range(8)]  # never FORGED!
    assert again.disk_cache.healed == 1
    assert sum("does not match its sha256" in r.getMessage() for r in caplog.records) == 1
    assert b"FORGED!" not in cached[0].read_bytes()  # healed on disk too


def test_an_unchanged_cached_file_is_hashed_once_per_host_and_never_after_its_own_download(
    tmp_path, monkeypatch
):
    url = genuine_dataset()
    store = Store(url, retry=FAST)
    from shardstream.manifest import load_manifest

    m = load_manifest(store)
    hashed: list[int] = []
    real = cache_module.hashlib.sha256

    def counting(data=b""):
        hashed.append(len(data))
        return real(data)

    # the cache's hashing only
    monkeypatch.setattr(cache_module, "hashlib", types.SimpleNamespace(sha256=counting))
    first = DiskCache(tmp_path, limit=1 << 20)
    # downloaded, checked on the way: recorded, not hashed again
    bytes(ShardFetcher(store, m, first).fetch(0))
    assert hashed == []
    gc.collect()
    # other processes of the host (other caches on the folder): the record stands
    for _ in range(3):
        assert bytes(ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(0)) == bytes(
            store.read_bytes(m.paths[0])
        )
        gc.collect()
    assert hashed == []
    # a file with no record (an older version's cache)
    os.unlink(next((tmp_path / "checked").glob("*.ok")))
    for _ in range(3):
        bytes(ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(0))
        gc.collect()
    assert hashed == [int(m.nbytes[0])]  # hashed once, then trusted until the file changes


def test_a_damaged_file_whose_modification_time_is_unchanged_by_reads_is_caught(tmp_path):
    """Reads move the access time (least recently used), never the modification time that names the
    file's version: so a rewrite, which moves it, is always seen."""
    url = genuine_dataset()
    store = Store(url, retry=FAST)
    from shardstream.manifest import load_manifest

    m = load_manifest(store)
    c = DiskCache(tmp_path, limit=1 << 20)
    bytes(ShardFetcher(store, m, c).fetch(1))
    gc.collect()
    path = c.path(m.sha256[1])
    before = os.stat(path).st_mtime_ns
    bytes(ShardFetcher(store, m, c).fetch(1))
    gc.collect()
    assert os.stat(path).st_mtime_ns == before
    forge(path, replace=False)
    assert b"FORGED!" not in bytes(ShardFetcher(store, m, c).fetch(1))
    assert c.healed == 1


def test_evicting_a_shard_removes_its_check_record(tmp_path):
    c = DiskCache(tmp_path, limit=1 << 20)
    data = b"x" * 1000
    key = hashlib.sha256(data).hexdigest()
    c.get(key, lambda: data, size=1000, content=True)
    gc.collect()
    assert (tmp_path / "checked" / f"{key}.ok").exists()
    assert c._evict(c.path(key))
    assert not (tmp_path / "checked" / f"{key}.ok").exists()
