"""ShardFetcher: remote shards downloaded whole, checked, cached; damaged downloads fetched again."""

from __future__ import annotations

import gc
import hashlib
import logging
import uuid

import pytest

from shardstream.errors import CorruptShardError
from shardstream.manifest import load_manifest
from shardstream.packing.writer import ShardWriter
from shardstream.storage import RetryPolicy, Store
from shardstream.storage.cache import DiskCache
from shardstream.storage.fetch import ShardFetcher

FAST = RetryPolicy(retries=2, backoff=0.001)


def remote_dataset(n: int = 12, per_shard: int = 5) -> Store:
    """A tar dataset on fsspec's in-memory filesystem: remote as far as shardstream can tell."""
    url = f"memory://fetch-{uuid.uuid4().hex}/ds"
    with ShardWriter(url, samples_per_shard=per_shard) as w:
        for i in range(n):
            w.write({"__key__": f"{i:03d}", "txt": f"sample {i}" * (i + 1)})
    return Store(url, retry=FAST)


def count_reads(monkeypatch, store: Store, damage=None) -> list[str]:
    """Record (and optionally damage) each GET of a shard from ``store`` (one ranged part each here)."""
    reads: list[str] = []
    fs = store.fs
    original = fs.cat_ranges

    def read(paths, starts, ends, **kwargs):
        parts = original(paths, starts, ends, **kwargs)
        assert len(parts) == 1
        reads.append(paths[0][len(store.root) + 1 :])
        return [damage(len(reads), parts[0]) if damage else parts[0]]

    monkeypatch.setattr(fs, "cat_ranges", read)
    return reads


def test_a_remote_shard_is_downloaded_once_into_the_cache(tmp_path, monkeypatch):
    store = remote_dataset()
    m = load_manifest(store)
    reads = count_reads(monkeypatch, store)
    fetcher = ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20))
    first = fetcher.fetch(1)
    assert bytes(first) == bytes(store.fs.cat_file(store.path(m.paths[1])))
    again = fetcher.fetch(1)
    assert bytes(again) == bytes(first)
    assert reads == [m.paths[1]]
    assert (tmp_path / f"{m.sha256[1]}.shard").exists()  # named by content


def test_same_content_under_two_urls_is_stored_once(tmp_path):
    store = remote_dataset()
    m = load_manifest(store)
    copy = Store(f"memory://fetch-{uuid.uuid4().hex}/copy", retry=FAST)
    for path in m.paths:
        copy.write_bytes(path, bytes(store.read_bytes(path)))
    cache = DiskCache(tmp_path, limit=1 << 20)
    ShardFetcher(store, m, cache).fetch(0)
    assert bytes(ShardFetcher(copy, m, cache).fetch(0)) == bytes(store.read_bytes(m.paths[0]))
    # one file for both URLs (besides its check record)
    assert len(list(tmp_path.glob("*.shard"))) == 1


def test_a_download_cut_short_is_fetched_again(tmp_path, monkeypatch, caplog):
    store = remote_dataset()
    m = load_manifest(store)
    reads = count_reads(
        monkeypatch, store, damage=lambda n, data: data[: len(data) // 2] if n == 1 else data
    )
    with caplog.at_level(logging.WARNING, logger="shardstream"):
        data = ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(2)
    assert hashlib.sha256(bytes(data)).hexdigest() == m.sha256[2]
    assert len(reads) == 2
    assert "downloading it again" in caplog.text and m.paths[2] in caplog.text


def test_a_corrupted_download_is_fetched_again(tmp_path, monkeypatch):
    store = remote_dataset()
    m = load_manifest(store)
    flipped = lambda n, data: bytes([data[0] ^ 1]) + bytes(data[1:]) if n < 3 else data  # noqa: E731
    reads = count_reads(monkeypatch, store, damage=flipped)
    data = ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(0)
    assert hashlib.sha256(bytes(data)).hexdigest() == m.sha256[0]
    assert len(reads) == 3


def test_a_shard_that_never_matches_fails_naming_its_url_and_is_not_cached(tmp_path, monkeypatch):
    store = remote_dataset()
    m = load_manifest(store)
    path = store.path(m.paths[1])
    original = bytes(store.fs.cat_file(path))
    store.fs.pipe_file(path, bytes([original[0] ^ 1]) + original[1:])  # same size, other content
    reads = count_reads(monkeypatch, store)
    with pytest.raises(CorruptShardError, match="sha256") as err:
        ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20)).fetch(1)
    assert store.url_of(m.paths[1]) in str(err.value)
    assert "3 downloads" in str(err.value) and "shardstream verify" in str(err.value)
    assert len(reads) == FAST.retries + 1  # bounded
    gc.collect()
    assert [p.name for p in tmp_path.iterdir()] == [
        f".{m.sha256[1]}.failed"
    ]  # no shard: only the failure, for waiters


def test_without_verification_only_the_size_is_checked(tmp_path):
    store = remote_dataset()
    m = load_manifest(store)
    path = store.path(m.paths[1])
    original = bytes(store.fs.cat_file(path))
    store.fs.pipe_file(path, bytes([original[0] ^ 1]) + original[1:])
    data = ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20), verify=False).fetch(1)
    assert bytes(data)[0] == original[0] ^ 1


def test_shards_without_a_checksum_are_cached_by_url_and_size(tmp_path):
    store = remote_dataset()
    m = load_manifest(store)
    m.sha256 = [""] * m.num_shards
    fetcher = ShardFetcher(store, m, DiskCache(tmp_path, limit=1 << 20))
    assert fetcher.key(0) != fetcher.key(1)
    assert (
        fetcher.key(0)
        == hashlib.sha256(f"{store.url_of(m.paths[0])}\0{m.nbytes[0]}".encode()).hexdigest()
    )
    assert bytes(fetcher.fetch(0)) == bytes(store.read_bytes(m.paths[0]))


def test_local_shards_are_mapped_not_cached(tmp_path):
    url = tmp_path / "ds"
    with ShardWriter(str(url), samples_per_shard=2) as w:
        for i in range(3):
            w.write({"__key__": str(i), "txt": "x"})
    store = Store(url)
    fetcher = ShardFetcher(store, load_manifest(store))
    assert fetcher.cache is None
    assert bytes(fetcher.fetch(0)) == (url / w.manifest.paths[0]).read_bytes()
