"""ShardFetcher (issue 10): one retry budget, hostile checksums, unchecked bytes never under a content name,
damaged cached files fetched again, local shards checked once per host with verify_local."""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import os
import uuid

import pytest

from shardstream.errors import CorruptShardError, ManifestError, StorageError
from shardstream.manifest import load_manifest
from shardstream.packing.writer import ShardWriter
from shardstream.storage import RetryPolicy, Store
from shardstream.storage import fetch as fetch_module
from shardstream.storage.cache import DiskCache
from shardstream.storage.fetch import ShardFetcher

FAST = RetryPolicy(retries=2, backoff=0.001)


def remote_dataset(n: int = 12, per_shard: int = 5) -> Store:
    url = f"memory://fetch-trust-{uuid.uuid4().hex}/ds"
    with ShardWriter(url, samples_per_shard=per_shard) as w:
        for i in range(n):
            w.write({"__key__": f"{i:03d}", "txt": f"sample {i}" * (i + 1)})
    return Store(url, retry=FAST)


def local_dataset(root, n: int = 6, per_shard: int = 2) -> Store:
    with ShardWriter(str(root), samples_per_shard=per_shard) as w:
        for i in range(n):
            w.write({"__key__": f"{i:03d}", "txt": f"sample {i}" * 50})
    return Store(root)


def gets(monkeypatch, store: Store, outcome) -> list[int]:
    """Every GET of a shard; ``outcome(n, data)`` gives what the n-th one returns (or raises)."""
    calls: list[int] = []
    fs = store.fs
    original = fs.cat_ranges

    def cat_ranges(paths, starts, ends, **kwargs):
        calls.append(1)
        return [outcome(len(calls), part) for part in original(paths, starts, ends, **kwargs)]

    monkeypatch.setattr(fs, "cat_ranges", cat_ranges)
    return calls


def flip(data: bytes) -> bytes:
    return bytes([data[0] ^ 1]) + bytes(data[1:])


def test_transport_errors_and_damaged_bytes_share_one_retry_budget(tmp_path, monkeypatch):
    store = remote_dataset()
    m = load_manifest(store)

    def reset_or_damaged(n, data):
        if n % 2:
            raise ConnectionResetError("connection reset by peer")
        return flip(data)

    calls = gets(monkeypatch, store, reset_or_damaged)
    with pytest.raises(
        StorageError, match=r"shard-000001-\w+\.tar: .*reset.*gave up after 3 attempts"
    ):
        ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(1)
    assert len(calls) == FAST.retries + 1  # not (retries + 1) squared


def test_a_damaged_object_is_read_retries_plus_one_times_in_all(tmp_path, monkeypatch):
    store = remote_dataset()
    m = load_manifest(store)
    calls = gets(monkeypatch, store, lambda n, data: flip(data))
    with pytest.raises(
        CorruptShardError, match=r"sha256 differs from the manifest's on each of 3 downloads"
    ):
        ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(0)
    assert len(calls) == 3


@pytest.mark.parametrize("digest", ["/tmp/" + "p" * 59, "../" * 21 + "p", "z" * 64, "abc"])
def test_a_hostile_checksum_in_the_manifest_names_no_file(tmp_path, digest):
    store = remote_dataset()
    m = load_manifest(store)
    m.sha256 = [digest] * m.num_shards
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(
        ManifestError,
        match=r"shard-000000-\w+\.tar: the manifest's sha256 for it, .* is not 64 hex "
        "digits",
    ):
        ShardFetcher(store, m, DiskCache(tmp_path / "cache", limit=1 << 20)).fetch(0)
    assert (
        sorted(os.listdir(tmp_path)) == sorted([*before, "cache"])
        and os.listdir(tmp_path / "cache") == []
    )


def test_upper_case_checksums_are_the_same_checksums(tmp_path):
    store = remote_dataset()
    m = load_manifest(store)
    m.sha256 = [d.upper() for d in m.sha256]
    data = ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(2)
    assert hashlib.sha256(bytes(data)).hexdigest() == m.sha256[2].lower()


def test_unchecked_downloads_never_sit_under_the_content_name(tmp_path):
    store = remote_dataset()
    m = load_manifest(store)
    path = store.path(m.paths[1])
    damaged = flip(bytes(store.fs.cat_file(path)))
    store.fs.pipe_file(path, damaged)  # same size, other bytes
    cache = DiskCache(tmp_path, limit=1 << 20)
    # served unchecked, as asked
    assert bytes(ShardFetcher(store, m, cache, verify=False).fetch(1)) == damaged
    gc.collect()
    assert not (tmp_path / f"{m.sha256[1]}.shard").exists()
    # a checking reader is never given those bytes
    with pytest.raises(CorruptShardError, match="sha256 differs"):
        ShardFetcher(store, m, cache).fetch(1)


def test_a_cached_shard_cut_short_is_downloaded_again(tmp_path, monkeypatch):
    store = remote_dataset()
    m = load_manifest(store)
    cache = DiskCache(tmp_path, limit=1 << 20)
    good = bytes(ShardFetcher(store, m, cache).fetch(1))
    gc.collect()
    with open(cache.path(m.sha256[1]), "r+b") as f:
        f.truncate(len(good) - 100)
    calls = gets(monkeypatch, store, lambda n, data: data)
    # not a failure on every later read
    assert bytes(ShardFetcher(store, m, cache).fetch(1)) == good
    assert len(calls) == 1
    assert bytes(ShardFetcher(store, m, cache).fetch(1)) == good and len(calls) == 1


def test_a_forged_cached_shard_of_another_size_is_replaced(tmp_path):
    store = remote_dataset()
    m = load_manifest(store)
    cache = DiskCache(tmp_path, limit=1 << 20)
    with open(cache.path(m.sha256[0]), "wb") as f:
        f.write(b"FORGED!")
    assert bytes(ShardFetcher(store, m, cache).fetch(0)) == bytes(
        store.fs.cat_file(store.path(m.paths[0]))
    )


# -- local shards, verified once per host ----------------------------------------------------------------


class Hashes:
    """Counts the sha256 computations of the fetch module."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = hashlib.sha256

        def counting(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(fetch_module.hashlib, "sha256", counting)


def test_local_shards_are_checked_once_per_host_when_asked(tmp_path, monkeypatch):
    store = local_dataset(tmp_path / "ds")
    m = load_manifest(store)
    cache = DiskCache(tmp_path / "cache", limit=1 << 20)
    hashes = Hashes(monkeypatch)
    data = ShardFetcher(store, m, cache, verify_local=True).fetch(0)
    assert bytes(data) == (tmp_path / "ds" / m.paths[0]).read_bytes()
    first = hashes.count
    assert first >= 1
    for _ in range(3):  # other workers, processes and runs: a new fetcher each, the same record
        ShardFetcher(store, m, cache, verify_local=True).fetch(0)
    assert hashes.count - first <= 3  # the record's name only, never the shard's bytes again
    records = os.listdir(tmp_path / "cache" / "checked")
    assert (
        len(records) == 1
        and (os.stat(tmp_path / "cache" / "checked" / records[0]).st_mode & 0o777) == 0o600
    )
    hashes.count = 0
    ShardFetcher(store, m, cache).fetch(1)  # without verify_local: never hashed
    assert hashes.count == 0


def test_a_damaged_local_shard_is_refused_with_verify_local(tmp_path):
    store = local_dataset(tmp_path / "ds")
    m = load_manifest(store)
    cache = DiskCache(tmp_path / "cache", limit=1 << 20)
    ShardFetcher(store, m, cache, verify_local=True).fetch(1)
    shard = tmp_path / "ds" / m.paths[1]
    before = os.stat(shard)
    data = bytearray(shard.read_bytes())
    data[600] ^= 1
    with open(shard, "r+b") as f:  # in place: same file, same size
        f.write(data)
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # even with its old mtime back
    with pytest.raises(
        CorruptShardError, match=r"shard-000001-\w+\.tar: its sha256 differs from the manifest's"
    ):
        ShardFetcher(store, m, cache, verify_local=True).fetch(1)
    assert bytes(ShardFetcher(store, m, cache).fetch(1)) == bytes(data)  # unchecked reads as before


def test_verify_local_without_a_cache_uses_the_default_private_folder(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.mkdir(tmp_path / "tmp")
    store = local_dataset(tmp_path / "ds")
    m = dataclasses.replace(load_manifest(store))
    fetcher = ShardFetcher(store, m, verify_local=True)
    fetcher.fetch(0)
    assert fetcher.cache is not None and fetcher.cache.root.startswith(str(tmp_path / "tmp"))
    assert os.listdir(os.path.join(fetcher.cache.root, "checked"))
