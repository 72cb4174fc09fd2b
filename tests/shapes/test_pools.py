"""How a pool crosses from a DataLoader worker: raw values in one shared-memory arena (or left in the
shard files as locations), the samples given back as rows with the same values."""

from __future__ import annotations

import numpy as np

import shardstream as ss
from shardstream.dataset.batches.collate import RaggedBytes
from shardstream.dataset.batches.pooled import POOL, PooledBatches, pool_of, pool_samples


def test_a_window_of_dict_samples_crosses_as_columns_and_comes_back_as_rows():
    data = memoryview(b"abcdefgh")
    samples = [
        {"__key__": f"k{i}", "jpg": data[i : i + 3], "txt": b"x" * i, "ids": np.arange(i), "cls": i}
        for i in range(5)
    ]
    window = pool_of(samples)
    columns = window[POOL]["columns"]
    assert isinstance(columns["jpg"], RaggedBytes) and isinstance(columns["txt"], RaggedBytes)
    assert columns["cls"] == [0, 1, 2, 3, 4]
    rows = pool_samples(window)
    assert len(rows) == 5
    for i, row in enumerate(rows):
        assert bytes(row["jpg"]) == bytes(data[i : i + 3]) and bytes(row["txt"]) == b"x" * i
        assert row["__key__"] == f"k{i}" and row["cls"] == i
        assert row["ids"].tolist() == list(range(i))


def test_samples_of_different_fields_or_kinds_cross_as_they_are():
    odd = [{"a": memoryview(b"1")}, {"b": b"2"}]
    assert pool_samples(pool_of(odd)) == [{"a": b"1"}, {"b": b"2"}]  # memoryviews become bytes
    assert pool_samples(pool_of([(1, b"x"), (2, b"y")])) == [(1, b"x"), (2, b"y")]


class InOrder(PooledBatches):
    def plan(self, samples):
        return [np.arange(len(samples))]

    def fit(self, groups, count):
        return groups

    def make(self, samples, group):
        return [(s["__key__"], bytes(s["txt"])) for s in (samples[i] for i in group.tolist())]


def test_raw_local_windows_stay_locations_and_read_the_same_values(tmp_path):
    with ss.ShardWriter(str(tmp_path / "d"), samples_per_shard=4) as writer:
        for i in range(10):
            writer.write({"__key__": f"k{i:02d}", "txt": f"value {i}".encode()})
    for workers in (0, 1):
        ds = ss.ShardDataset(str(tmp_path / "d"), decode=None, shuffle=False)
        assert ds.mapped
        shape = InOrder(ds, 10, workers, {})
        assert ds.mapped  # the dataset's own batches: locations in the shard files
        (batch,) = list(shape)
        assert batch == [(f"k{i:02d}", f"value {i}".encode()) for i in range(10)]


def keys_and_values(samples):
    assert all(isinstance(s["txt"], bytes) for s in samples)  # a collate_fn of its own: bytes
    return {"__key__": [s["__key__"] for s in samples], "txt": [s["txt"] for s in samples]}


def test_a_bucketed_collate_fn_of_its_own_gets_bytes_through_a_worker(tmp_path):
    with ss.ShardWriter(str(tmp_path / "d"), samples_per_shard=4) as writer:
        for i in range(10):
            writer.write({"__key__": f"k{i:02d}", "txt": f"value {i}".encode(), "cls": i % 2})
    for workers in (0, 1):
        ds = ss.ShardDataset(str(tmp_path / "d"), decode=None)
        shape = ss.Bucketed(ds, "cls", None, 3, collate_fn=keys_and_values, num_workers=workers)
        got = {k: v for b in shape for k, v in zip(b["__key__"], b["txt"])}
        assert got == {f"k{i:02d}": f"value {i}".encode() for i in range(10)}
