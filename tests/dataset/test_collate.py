"""Batches: RaggedBytes (one shared arena), MappedBytes (locations in shard files), images, split."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from shardstream import ShardDataset, ShardWriter
from shardstream.dataset.batches.collate import (
    FieldCollate,
    MappedBytes,
    RaggedBytes,
    collate,
    cut_batch,
    pad_sequences,
    ragged_fields,
)
from shardstream.errors import ShardstreamError


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
    samples = [
        {
            "__key__": f"k{i}",
            "jpg": torch.from_numpy(h).permute(2, 0, 1),
            "cls": i,
            "txt": f"t{i}",
            "raw": bytes([i]),
        }
        for i, h in enumerate(hwc)
    ]
    batch = collate(samples)
    assert batch["jpg"].shape == (3, 3, 4, 5)
    assert batch["jpg"].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch["jpg"][2], torch.from_numpy(hwc[2]).permute(2, 0, 1))
    assert batch["cls"].tolist() == [0, 1, 2] and batch["cls"].dtype == torch.int64
    assert batch["txt"] == ["t0", "t1", "t2"] and batch["__key__"] == ["k0", "k1", "k2"]
    assert isinstance(batch["raw"], RaggedBytes) and list(batch["raw"]) == [
        b"\x00",
        b"\x01",
        b"\x02",
    ]


def test_collate_keeps_every_field_even_when_the_first_sample_lacks_it():
    batch = collate([{"a": 1}, {"a": 2, "b": "x"}])
    assert batch["a"].tolist() == [1, 2] and batch["b"] == [None, "x"]


def test_split_cuts_a_batch_into_views():
    batch = collate([{"__key__": str(i), "v": i, "raw": bytes([i])} for i in range(5)])
    parts = cut_batch(batch, 2)
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


# -- variable-length fields ---------------------------------------------------------------------------


def test_pad_sequences_pads_and_gives_lengths_and_mask():
    padded, lengths, mask = pad_sequences(
        [torch.tensor([1, 2, 3]), np.array([4]), [5, 6]], padding_value=-1
    )
    assert padded.tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]] and padded.dtype == torch.int64
    assert lengths.tolist() == [3, 1, 2] and lengths.dtype == torch.int64
    assert mask.tolist() == [[True, True, True], [True, False, False], [True, True, False]]
    assert mask.dtype == torch.bool


def test_pad_sequences_with_trailing_dims_empty_sequences_promotion_and_max_length():
    boxes = [torch.ones(2, 4), torch.zeros(0, 4, dtype=torch.float64), 2 * torch.ones(3, 4)]
    padded, lengths, mask = pad_sequences(boxes)
    # float32 and float64 promote
    assert padded.shape == (3, 3, 4) and padded.dtype == torch.float64
    assert torch.equal(padded[2], 2 * torch.ones(3, 4, dtype=torch.float64))
    assert torch.equal(padded[0, 2], torch.zeros(4, dtype=torch.float64)) and lengths.tolist() == [
        2,
        0,
        3,
    ]
    assert mask.sum(1).tolist() == [2, 0, 3]
    cut, cut_lengths, cut_mask = pad_sequences([torch.arange(5), torch.arange(2)], max_length=3)
    assert (
        cut.tolist() == [[0, 1, 2], [0, 1, 0]]
        and cut_lengths.tolist() == [3, 2]
        and cut_mask.shape == (2, 3)
    )
    none, none_lengths, none_mask = pad_sequences([torch.zeros(0), torch.zeros(0)])
    assert none.shape == (2, 0) and none_lengths.tolist() == [0, 0] and none_mask.shape == (2, 0)


def test_pad_sequences_refuses_what_cannot_be_padded():
    with pytest.raises(ValueError, match="trailing shape"):
        pad_sequences([torch.zeros(2, 4), torch.zeros(2, 3)])
    with pytest.raises(ValueError, match="scalars"):
        pad_sequences([torch.tensor(1), torch.tensor([1])])
    with pytest.raises(ValueError, match="at least one"):
        pad_sequences([])


def detection_sample(i: int) -> dict:
    return {
        "__key__": f"k{i}",
        "tokens": np.arange(i % 4 + 1, dtype=np.int64) + 10 * i,
        "boxes": np.full((i % 3, 4), i, dtype=np.float32),
        "cls": i,
        "txt": f"t{i}",
        "raw": bytes([i]),
    }


def test_field_collate_pads_keeps_lists_and_collates_the_rest():
    fc = FieldCollate(pad={"tokens": -1}, lists=["boxes"])
    batch = fc([detection_sample(i) for i in range(3)])
    assert list(batch) == [
        "__key__",
        "tokens",
        "tokens_lengths",
        "tokens_mask",
        "boxes",
        "cls",
        "txt",
        "raw",
    ]
    assert batch["tokens"].tolist() == [[0, -1, -1], [10, 11, -1], [20, 21, 22]]
    assert batch["tokens_lengths"].tolist() == [1, 2, 3] and batch["tokens_mask"].sum().item() == 6
    assert [b.shape for b in batch["boxes"]] == [
        (0, 4),
        (1, 4),
        (2, 4),
    ]  # the samples' values, as tensors
    assert all(isinstance(b, torch.Tensor) for b in batch["boxes"])
    assert batch["cls"].tolist() == [0, 1, 2] and batch["txt"] == ["t0", "t1", "t2"]
    assert isinstance(batch["raw"], RaggedBytes)
    again = pickle.loads(pickle.dumps(fc))  # spawn workers receive it pickled
    assert again([detection_sample(1)])["tokens"].tolist() == [[10, 11]]
    with pytest.raises(ValueError, match="both"):
        FieldCollate(pad=["a"], lists=["a"])
    with pytest.raises(ValueError, match="'tokens' is missing"):
        fc([detection_sample(0), {"__key__": "x", "cls": 1}])


def test_field_collate_as_the_collate_fn_of_a_shard_dataset_with_workers(tmp_path):
    with ShardWriter(str(tmp_path / "ds"), samples_per_shard=4) as w:
        for i in range(10):
            sample = detection_sample(i)
            w.write(
                {
                    "__key__": sample["__key__"],
                    "tokens.npy": sample["tokens"],
                    "boxes.npy": sample["boxes"],
                    "cls": i,
                }
            )
    fc = FieldCollate(pad=["tokens.npy"], lists=["boxes.npy"])
    ds = ShardDataset(str(tmp_path / "ds"), shuffle=False, collate_fn=fc)
    batches = list(ds.loader(batch_size=4, num_workers=2))
    assert [b["tokens.npy_lengths"].tolist() for b in batches] == [
        [1, 2, 3, 4],
        [1, 2, 3, 4],
        [1, 2],
    ]
    assert batches[1]["tokens.npy"][3].tolist() == [70, 71, 72, 73]
    assert batches[1]["tokens.npy_mask"][0].tolist() == [True, False, False, False]
    assert [tuple(b.shape) for b in batches[2]["boxes.npy"]] == [(2, 4), (0, 4)]
    # arrays become tensors
    assert all(isinstance(b, torch.Tensor) for b in batches[2]["boxes.npy"])
    assert batches[2]["boxes.npy"][0].unique().tolist() == [8.0]
    assert batches[0]["cls"].tolist() == [0, 1, 2, 3]
    # the pickling guard accepts it for spawn workers
    spawn = ShardDataset(str(tmp_path / "ds"), collate_fn=fc)
    spawn.loader(batch_size=4, num_workers=1, multiprocessing_context="spawn")


def test_pad_sequences_keeps_the_dtype_when_a_sequence_is_an_empty_list():
    padded, lengths, _ = pad_sequences([[1, 2, 3], []])
    assert (
        padded.dtype == torch.int64
        and padded.tolist() == [[1, 2, 3], [0, 0, 0]]
        and lengths.tolist() == [3, 0]
    )
    assert pad_sequences([[], []])[0].dtype == torch.int64
    assert pad_sequences([torch.tensor([1.5], dtype=torch.float16), []])[0].dtype == torch.float16


def test_collate_allocates_from_the_active_allocator_only_inside_its_block():
    import threading

    from shardstream.dataset.batches.collate import allocating

    arena = torch.zeros(1 << 12, dtype=torch.uint8)
    used = []

    def allocate(shape, dtype):
        used.append((shape, dtype))
        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        return arena[:n].view(dtype).view(shape)

    samples = [
        {"__key__": "a", "n": 1, "x": np.ones((2, 2), dtype=np.float32)},
        {"__key__": "b", "n": 2, "x": np.zeros((2, 2), dtype=np.float32)},
    ]
    seen_elsewhere = []
    with allocating(allocate):
        batch = collate(samples)
        other = threading.Thread(target=lambda: seen_elsewhere.append(collate(samples)))
        other.start()
        other.join()
    assert ((2,), torch.int64) in used and ((2, 2, 2), torch.float32) in used
    assert batch["x"].untyped_storage().data_ptr() == arena.untyped_storage().data_ptr()
    assert len(used) == 2  # the other thread's batch did not take from this allocator
    collate(samples)
    assert len(used) == 2  # nor did a batch after the block
    assert seen_elsewhere[0]["n"].tolist() == [1, 2]


def test_field_collate_refuses_a_field_name_no_sample_has(tmp_path):
    samples = [detection_sample(0), detection_sample(1)]
    with pytest.raises(
        ShardstreamError, match=r"pad=\.\.\.\) names \['token'\].*fields are \['__key__', 'tokens'"
    ):
        FieldCollate(pad=["token"])(samples)
    with pytest.raises(ShardstreamError, match=r"lists=\.\.\.\) names \['box'\]"):
        FieldCollate(lists=["box"])(samples)
    assert "tokens_mask" in FieldCollate(pad=["tokens"], lists=["boxes"])(samples)
