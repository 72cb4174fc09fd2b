"""The indexed shard reader: TarShard, ArrowShard and the per-process OpenShards."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from shardstream.dataset.shards.readers import ArrowShard, OpenShards, TarShard
from shardstream.errors import CorruptShardError
from shardstream.formats import tar as tar_format
from shardstream.manifest import load_manifest
from shardstream.manifest.sample_set import samples_of
from shardstream.manifest.side_names import index_name
from shardstream.packing.writer import ShardWriter
from shardstream.storage import Store
from tests.sample_datasets import shard_path

N = 11
PER_SHARD = 4  # shards of 4, 4 and 3 samples


def make_sample(i: int) -> dict:
    return {
        "__key__": f"key{i:03d}",
        "txt": f"text {i}",
        "cls": i,
        "bin": bytes([i]) * (i * 37 % 600),
    }


def write(root, fmt: str = "tar", compression: str | None = None) -> str:
    url = str(root / f"ds-{fmt}-{compression}")
    with ShardWriter(
        url, format=fmt, compression=compression, samples_per_shard=PER_SHARD
    ) as writer:
        for i in range(N):
            writer.write(make_sample(i))
    return url


def open_cache(url: str, capacity: int = 16, manifest=None) -> OpenShards:
    store = Store(url)
    return OpenShards(store, manifest or load_manifest(store), capacity=capacity)


def expected_tar(i: int) -> dict:
    s = make_sample(i)
    return {
        "__key__": s["__key__"],
        "txt": s["txt"].encode(),
        "cls": str(i).encode(),
        "bin": s["bin"],
    }


FORMATS = [("tar", None), ("tar", "zstd"), ("tar", "gzip"), ("arrow", None), ("arrow", "none")]


@pytest.mark.parametrize("fmt,compression", FORMATS)
def test_random_access_returns_the_right_sample(tmp_path, fmt, compression):
    url = write(tmp_path, fmt, compression)
    cache = open_cache(url)
    manifest = cache.manifest
    assert manifest.stored_counts.tolist() == [4, 4, 3]
    order = list(range(N))[::-1] + [5, 0, 10, 5]  # backwards, then jumping between shards
    for i in order:
        shard, offset = samples_of(manifest).locate(i)
        sample = cache.get(shard).sample(offset)
        if fmt == "arrow":
            s = make_sample(i)
            assert sample == s
        else:
            assert sample == expected_tar(i)
            assert all(type(v) is bytes for k, v in sample.items() if k != "__key__")


def test_tar_zst_shards_are_read(tmp_path):
    url = write(tmp_path, "tar", "zstd")
    cache = open_cache(url)
    assert cache.manifest.shard_format == "tar.zst"
    assert all(p.endswith(".tar.zst") for p in cache.manifest.paths)
    keys = [
        cache.get(s).sample(o)["__key__"]
        for s in range(3)
        for o in range(int(cache.manifest.stored_counts[s]))
    ]
    assert keys == [f"key{i:03d}" for i in range(N)]
    assert isinstance(cache.get(0), TarShard)


def test_tar_shard_indexes_keys_and_fields(tmp_path):
    url = write(tmp_path)
    data = shard_path(url, 1).read_bytes()
    shard = TarShard(data, "shard-000001.tar", 4)
    assert shard.keys == ["key004", "key005", "key006", "key007"]
    assert set(shard.fields[0]) == {"bin", "cls", "txt"}
    assert shard.sample(2) == expected_tar(6)
    assert shard.sample(-1) == expected_tar(7)


def test_arrow_shard_rows_and_take(tmp_path):
    url = write(tmp_path, "arrow")
    data = shard_path(url, 2).read_bytes()
    shard = ArrowShard(data, "shard-000002.arrow", 3)
    assert [shard.sample(i) for i in range(3)] == [make_sample(i) for i in (8, 9, 10)]
    taken = shard.take([2, 0])
    assert taken.column("__key__").to_pylist() == ["key010", "key008"]


def test_cache_keeps_at_most_capacity_shards_least_recently_used_out(tmp_path, monkeypatch):
    url = write(tmp_path)
    loads: list[int] = []
    original = OpenShards._load

    def counting(self, shard):
        loads.append(shard)
        return original(self, shard)

    monkeypatch.setattr(OpenShards, "_load", counting)
    cache = open_cache(url, capacity=2)
    first = cache.get(0)
    assert cache.get(0) is first  # a hit: not loaded again
    cache.get(1)
    cache.get(0)  # 0 becomes the most recently used
    cache.get(2)  # evicts 1, the least recently used
    assert list(cache._open) == [0, 2]
    assert loads == [0, 1, 2]
    cache.get(1)  # loaded again, evicting 0
    assert list(cache._open) == [2, 1]
    assert loads == [0, 1, 2, 1]
    assert len(cache._open) <= 2


def test_cache_of_capacity_one(tmp_path):
    url = write(tmp_path)
    cache = open_cache(url, capacity=1)
    for shard in (0, 1, 2, 1, 0):
        assert cache.get(shard).sample(0)["__key__"] == f"key{shard * PER_SHARD:03d}"
        assert list(cache._open) == [shard]


@pytest.mark.parametrize("fmt,compression", [("tar", None), ("tar", "zstd"), ("arrow", None)])
@pytest.mark.parametrize("change", ["truncate", "extend"])
def test_shard_size_differing_from_manifest_is_corrupt(tmp_path, fmt, compression, change):
    url = write(tmp_path, fmt, compression)
    cache = open_cache(url)
    name = cache.manifest.paths[1]
    path = os.path.join(url, name)
    data = Path(path).read_bytes()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2] if change == "truncate" else data + b"\0" * 512)
    assert cache.get(0).sample(0)["__key__"] == "key000"  # other shards still read
    with pytest.raises(CorruptShardError) as info:
        cache.get(1)
    message = str(info.value)
    assert name in message
    assert str(len(data)) in message  # the size the manifest expects
    assert 1 not in cache._open


@pytest.mark.parametrize("fmt,compression", [("tar", None), ("tar", "zstd"), ("arrow", None)])
@pytest.mark.parametrize("delta", [-1, 1])
def test_sample_count_differing_from_manifest_is_corrupt(tmp_path, fmt, compression, delta):
    url = write(tmp_path, fmt, compression)
    manifest = load_manifest(Store(url))
    samples = manifest.stored_counts.copy()
    samples[2] += delta
    wrong = dataclasses.replace(manifest, stored_counts=np.asarray(samples))
    cache = open_cache(url, manifest=wrong)
    cache.get(1)  # untouched shards are fine
    with pytest.raises(CorruptShardError) as info:
        cache.get(2)
    message = str(info.value)
    assert manifest.paths[2] in message
    assert str(3 + delta) in message and "3" in message


def test_tar_shard_with_wrong_expected_count(tmp_path):
    url = write(tmp_path)
    data = shard_path(url, 0).read_bytes()
    with pytest.raises(CorruptShardError, match="shard-000000.tar: 4 samples, the manifest says 5"):
        TarShard(data, "shard-000000.tar", 5)


def test_corrupt_tar_header_names_the_shard(tmp_path):
    url = write(tmp_path)
    path = shard_path(url, 1)
    data = bytearray(Path(path).read_bytes())
    members = list(tar_format.iter_members(bytes(data)))
    header = members[2][1] - 512  # the third member's header block
    data[header : header + 10] = b"\xff" * 10  # its name: the checksum no longer matches
    with open(path, "wb") as f:  # same size as before: only the contents are damaged
        f.write(data)
    with pytest.raises(CorruptShardError, match=rf"{path.name}: bad tar header"):
        open_cache(url).get(1)


# -- shards opened from their sample index -------------------------------------------------


def _indexed_pair(tmp_path):
    import shardstream

    src = tmp_path / "src"
    for i in range(10):
        (src / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 2}" / f"{i:02d}.txt").write_text("v" * (50 * i + 1))
    shardstream.pack(src, tmp_path / "plain", samples_per_shard=4, progress=False)
    shardstream.pack(src, tmp_path / "indexed", samples_per_shard=4, index=True, progress=False)
    return str(tmp_path / "plain"), str(tmp_path / "indexed")


def _read(url):
    from shardstream.dataset import ShardDataset

    return [
        (k, bytes(v))
        for b in ShardDataset(url, decode=None, seed=5).loader(3, 0)
        for k, v in zip(b["__key__"], b["txt"])
    ]


def test_a_local_shard_opens_from_its_index_without_parsing_headers(tmp_path, monkeypatch):
    from shardstream.formats import tar as tar_format

    plain, indexed = _indexed_pair(tmp_path)
    expected = _read(plain)

    def refuse(*args, **kwargs):
        raise AssertionError("the tar headers were parsed")

    monkeypatch.setattr(tar_format, "read_samples", refuse)
    assert _read(indexed) == expected


def test_an_index_that_does_not_check_is_ignored_for_the_headers(tmp_path, monkeypatch):
    from shardstream.formats import tar as tar_format

    plain, indexed = _indexed_pair(tmp_path)
    expected = _read(plain)
    idx = shard_path(indexed, 1).parent / index_name(shard_path(indexed, 1).name)
    data = bytearray(idx.read_bytes())
    data[-3] ^= 1  # a member name changed: its sha256 no longer matches the manifest's
    idx.write_bytes(bytes(data))
    parsed = []
    real = tar_format.read_samples
    monkeypatch.setattr(
        tar_format,
        "read_samples",
        lambda buf, name="shard": parsed.append(name) or real(buf, name),
    )
    assert _read(indexed) == expected
    assert parsed == [
        str(shard_path(indexed, 1))
    ]  # that shard alone: the others opened from their index


def test_a_sample_read_from_its_index_parses_its_entry_once(tmp_path, monkeypatch):
    from shardstream.formats import tar_index
    from shardstream.formats.tar_index import parse_index
    from shardstream.manifest.side_names import index_name

    _, indexed = _indexed_pair(tmp_path)
    path = shard_path(indexed, 0)
    data = path.read_bytes()
    raw = (path.parent / index_name(path.name)).read_bytes()
    index = parse_index(raw, path.name, 4, len(data))
    shard = TarShard(data, path.name, 4, index=index)
    plain = TarShard(data, path.name, 4)  # from the headers: the same samples
    calls = []
    parse = tar_index.IndexedSamples.sample
    monkeypatch.setattr(
        tar_index.IndexedSamples, "sample", lambda self, i: calls.append(i) or parse(self, i)
    )
    for i in (2, 0, -1):
        assert shard.sample(i) == plain.sample(i)
        assert {k: bytes(v) for k, v in shard.views(i).items() if k != "__key__"} == {
            k: v for k, v in plain.sample(i).items() if k != "__key__"
        }
        assert shard.locate(i) == plain.locate(i)
    assert calls == [2, 2, 2, 0, 0, 0, 3, 3, 3]
    with pytest.raises(IndexError):
        shard.locate(4)
