"""Batches: RaggedBytes (one shared arena), MappedBytes (locations in shard files), images, split."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from shardstream import ShardDataset, ShardWriter
from shardstream.collate import MappedBytes, RaggedBytes, collate, ragged_fields, split


def test_ragged_fields_share_one_storage_and_round_trip():
    jpg = [b"a" * 5, b"", b"xyz"]
    cls = [b"1", b"22", b"333"]
    a, b = ragged_fields([jpg, cls])
    assert list(a) == jpg and list(b) == cls
    assert a[1] == b"" and b[-1] == b"333" and a[0:2] == jpg[0:2]
    assert a.data.untyped_storage().data_ptr() == b.data.untyped_storage().data_ptr()
    with pytest.raises(IndexError):
        a[3]


def test_ragged_bytes_pickles_and_slices_without_copying():
    (r,) = ragged_fields([[b"one", b"two", b"three", b"four"]])
    part = r.slice(1, 3)
    assert list(part) == [b"two", b"three"]
    assert part.data.data_ptr() == r.data.data_ptr()
    assert list(pickle.loads(pickle.dumps(r))) == list(r)
    assert r == [b"one", b"two", b"three", b"four"]


def test_collate_stacks_numbers_and_images_channels_last_and_keeps_the_rest():
    hwc = [np.full((4, 5, 3), i, dtype=np.uint8) for i in range(3)]
    samples = [{"__key__": f"k{i}", "jpg": torch.from_numpy(h).permute(2, 0, 1), "cls": i, "txt": f"t{i}",
                "raw": bytes([i])} for i, h in enumerate(hwc)]
    batch = collate(samples)
    assert batch["jpg"].shape == (3, 3, 4, 5)
    assert batch["jpg"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch["jpg"][2], torch.from_numpy(hwc[2]).permute(2, 0, 1))
    assert batch["cls"].tolist() == [0, 1, 2] and batch["cls"].dtype == torch.int64
    assert batch["txt"] == ["t0", "t1", "t2"] and batch["__key__"] == ["k0", "k1", "k2"]
    assert isinstance(batch["raw"], RaggedBytes) and list(batch["raw"]) == [b"\x00", b"\x01", b"\x02"]


def test_collate_keeps_every_field_even_when_the_first_sample_lacks_it():
    batch = collate([{"a": 1}, {"a": 2, "b": "x"}])
    assert batch["a"].tolist() == [1, 2] and batch["b"] == [None, "x"]


def test_split_cuts_a_batch_into_views():
    batch = collate([{"__key__": str(i), "v": i, "raw": bytes([i])} for i in range(5)])
    parts = split(batch, 2)
    assert [p["__key__"] for p in parts] == [["0", "1"], ["2", "3"], ["4"]]
    assert [p["v"].tolist() for p in parts] == [[0, 1], [2, 3], [4]]
    assert [list(p["raw"]) for p in parts] == [[b"\x00", b"\x01"], [b"\x02", b"\x03"], [b"\x04"]]


class _Batches(IterableDataset):
    def __iter__(self):
        yield collate([{"raw": b"hello", "n": 1}, {"raw": b"world!", "n": 2}])


def test_ragged_bytes_cross_from_a_worker_in_shared_memory():
    (batch,) = list(DataLoader(_Batches(), batch_size=None, num_workers=1, collate_fn=lambda b: b))
    assert isinstance(batch["raw"], RaggedBytes) and list(batch["raw"]) == [b"hello", b"world!"]
    assert batch["raw"].data.is_shared()


def test_mapped_bytes_read_local_tar_shards_in_place(tmp_path):
    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=3) as w:
        for i in range(7):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * (i + 1)})
    ds = ShardDataset(str(tmp_path / "ds"), decode=None, shuffle=False)
    batches = list(ds.loader(batch_size=4, num_workers=1))
    assert all(isinstance(b["bin"], MappedBytes) for b in batches)
    got = [v for b in batches for v in b["bin"]]
    assert got == [bytes([i]) * (i + 1) for i in range(7)]
    assert bytes(batches[0]["bin"].view(2)) == b"\x02\x02\x02"
    assert [list(p) for p in (batches[0]["bin"].slice(1, 3),)] == [[b"\x01\x01", b"\x02\x02\x02"]]


def test_compressed_shards_fall_back_to_ragged_bytes(tmp_path):
    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=3, compression="zstd") as w:
        for i in range(7):
            w.write({"__key__": f"k{i}", "bin": bytes([i]) * (i + 1)})
    ds = ShardDataset(str(tmp_path / "ds"), decode=None, shuffle=False)
    batches = list(ds.loader(batch_size=4, num_workers=1))
    assert all(isinstance(b["bin"], RaggedBytes) for b in batches)
    assert [v for b in batches for v in b["bin"]] == [bytes([i]) * (i + 1) for i in range(7)]
