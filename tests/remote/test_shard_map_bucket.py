"""ShardMap on a real S3 endpoint (moto): m[i] equals the unshuffled epoch for every shard format, single
samples come by ranged reads checked against the sample index (a changed byte raises, never reads), dense
reads fetch the shard whole into the cache, and Parquet files indexed in the bucket are read by row group."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import shardstream
from shardstream import ShardDataset, ShardMap, StorageSettings, TokenDataset
from shardstream.dataset.shards import readers, sparse
from shardstream.errors import CorruptShardError
from shardstream.formats import parquet as parquet_format
from shardstream.manifest.index_parquet import index_parquet
from tests.sample_datasets import key_of, write_dataset
from tests.token_corpus import pack_positions

from .data import image_folder


def upload(bucket, folder, prefix: str) -> str:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            bucket.write(f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes())
    return bucket.url(prefix)


def opened(bucket, url, tmp_path, **kw) -> ShardMap:
    return ShardMap(
        url, storage_options=bucket.storage_options, cache_dir=str(tmp_path / "cache"), **kw
    )


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


@pytest.mark.parametrize("fmt", ["tar.zst", "arrow"])
def test_every_index_matches_the_epoch_for_uploaded_shards(s3_bucket, tmp_path, fmt):
    kind, compression = ("tar", "zstd") if fmt == "tar.zst" else (fmt, None)
    local = write_dataset(tmp_path, [3, 1, 4], fmt=kind, compression=compression)
    url = upload(s3_bucket, tmp_path / "ds", "ds")
    epoch = list(ShardDataset(local, shuffle=False, decode=None, rank=0, world_size=1))
    m = opened(s3_bucket, url, tmp_path, decode=None)
    assert [m[i] for i in range(len(m))] == epoch
    assert m.get(key_of(5)) == epoch[5]


def test_token_windows_in_a_bucket(s3_bucket, tmp_path):
    local, _ = pack_positions(tmp_path, [5, 30, 12, 7, 44], shard_size="160B")
    url = upload(s3_bucket, tmp_path / "ds", "tok")
    epoch = list(TokenDataset(local, 4, shuffle=False, rank=0, world_size=1))
    m = opened(s3_bucket, url, tmp_path, seq_len=4)
    assert len(m) == len(epoch) and all(same(m[i], e) for i, e in enumerate(epoch))


def _pack(bucket, tmp_path):
    image_folder(tmp_path / "src")
    return shardstream.pack(
        tmp_path / "src",
        bucket.url("ds"),
        storage_options=bucket.storage_options,
        samples_per_shard=4,
        progress=False,
    ).manifest


def test_sparse_reads_are_ranged_and_dense_ones_fetch_the_shard(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(sparse, "SMALL_SHARD", 0)  # the test's shards are small
    manifest = _pack(s3_bucket, tmp_path)
    url = s3_bucket.url("ds")
    epoch = list(
        ShardDataset(
            url, shuffle=False, decode=None, rank=0, world_size=1,
            storage_options=s3_bucket.storage_options, cache_dir=str(tmp_path / "epoch-cache"),
        )
    )  # fmt: skip
    m = opened(s3_bucket, url, tmp_path, decode=None)
    last = len(m) - 1
    # one sample of the last shard: a ranged read, the shard not fetched
    assert m[last] == epoch[last]
    state = m._opened
    shard = manifest.num_shards - 1
    assert state.sparse.ranged_bytes[shard] > 0 and not state.sparse.fetcher.cached(shard)
    # the whole first shard, read sample by sample: it turns dense and is fetched once into the cache
    assert m.__getitems__(list(range(4))) == epoch[:4]
    assert state.sparse.fetcher.cached(0) or state.shards.is_open(0)
    assert [m[i] for i in range(len(m))] == epoch
    assert m.get(epoch[6]["__key__"]) == epoch[6]


def test_a_changed_sample_under_a_ranged_read_raises(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(sparse, "SMALL_SHARD", 0)
    manifest = _pack(s3_bucket, tmp_path)
    path = f"ds/{manifest.paths[1]}"
    data = bytearray(s3_bucket.read(path))
    data[512 + 100] ^= 0xFF  # inside the first sample's first member
    s3_bucket.write(path, bytes(data))
    # one retry: a damaged read is read again within the retry budget, then raises
    m = opened(
        s3_bucket, s3_bucket.url("ds"), tmp_path, decode=None, storage=StorageSettings(retries=1)
    )
    key = opened(s3_bucket, s3_bucket.url("ds"), tmp_path / "keys").keys_of(1)[0]
    # the sample named by its key and its place in the shard
    named = re.escape(f"sample {key!r} (position 0 in the shard) differs from its sha256")
    with pytest.raises(CorruptShardError, match=named):
        m[4]
    assert m[0]["__key__"]  # other shards read on


def _parquet_bucket(bucket, tmp_path) -> tuple[str, pa.Table]:
    tables = []
    for f, rows in enumerate([9, 4]):
        ids = list(range(sum(len(t) for t in tables), sum(len(t) for t in tables) + rows))
        table = pa.table({"__key__": [f"r{i}" for i in ids], "v": [bytes([i]) * 50 for i in ids]})
        path = tmp_path / f"part-{f}.parquet"
        pq.write_table(table, path, row_group_size=3)
        bucket.write(f"pq/data/part-{f}.parquet", path.read_bytes())
        tables.append(table)
    url = index_parquet(
        [bucket.url("pq", "data", "*.parquet")], storage_options=bucket.storage_options
    ).url
    return url, pa.concat_tables(tables)


def test_parquet_indexed_in_a_bucket_reads_by_row_group(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "RANGED_PARQUET_BYTES", 0)  # every file counts as large
    url, table = _parquet_bucket(s3_bucket, tmp_path)
    assert url == s3_bucket.url("pq", "data")
    m = opened(s3_bucket, url, tmp_path, decode=None)
    expected = table.to_pylist()
    assert [m[i] for i in range(len(m))] == expected
    assert not m._opened.shards.fetcher.cached(0)  # row groups came by ranged reads
    ds = ShardDataset(
        url, decode=None, seed=1, rank=0, world_size=1,
        storage_options=s3_bucket.storage_options, cache_dir=str(tmp_path / "c2"),
    )  # fmt: skip
    got = [k for b in ds.loader(batch_size=4, num_workers=2) for k in b["__key__"]]
    assert sorted(got) == sorted(r["__key__"] for r in expected)


def test_a_changed_row_group_raises(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "RANGED_PARQUET_BYTES", 0)
    url, _ = _parquet_bucket(s3_bucket, tmp_path)
    raw = bytearray(s3_bucket.read("pq/data/part-0.parquet"))
    index, _ = parquet_format.build_row_index(bytes(raw), "part-0")
    start, end = index.spans[1]
    raw[(start + end) // 2] ^= 0xFF
    s3_bucket.write("pq/data/part-0.parquet", bytes(raw))
    m = opened(s3_bucket, url, tmp_path, decode=None, storage=StorageSettings(retries=1))
    assert m[0]["__key__"] == "r0"  # row group 0 is intact
    with pytest.raises(CorruptShardError, match="differs from its sha256"):
        m[4]


def test_a_tar_of_members_apart_indexed_in_a_bucket_reads_its_samples_whole(
    s3_bucket, tmp_path, monkeypatch
):
    """Its sample index is version 2 (no sample spans): no ranged read of a span, the shard whole."""
    import io
    import tarfile

    from shardstream.manifest.index_tars import index

    monkeypatch.setattr(sparse, "SMALL_SHARD", 0)
    members = [
        (f"s{i}.{ext}", b"%s%d" % (ext.encode(), i) * 50)
        for ext in ("jpg", "cls")
        for i in range(3)
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    s3_bucket.write("apart/a.tar", buf.getvalue())
    url = s3_bucket.url("apart")
    result = index([url], storage_options=s3_bucket.storage_options)
    raw = result.indexes[0]  # no sample spans: version 3 with the GROUPED flag
    assert result.indexes_written and raw[:8] == b"SSTARIX3" and raw[32] & 1
    m = opened(s3_bucket, url, tmp_path, decode=None)
    got = {m[i]["__key__"]: (m[i]["jpg"], m[i]["cls"]) for i in range(len(m))}
    assert got == {f"s{i}": (b"jpg%d" % i * 50, b"cls%d" % i * 50) for i in range(3)}
