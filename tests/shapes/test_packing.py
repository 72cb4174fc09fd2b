"""SequencePacking: best-fit-decreasing rows within seq_len, every sample once with its labels, position
ids restarting per sample, cu_seqlens by the token convention, equal batch counts on 1-4 ranks, the
same batches for any worker count, resume mid-epoch."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream import ShardDataset
from shardstream.dataset import MixedDataset
from shardstream.dataset.batches.sequence_packing import IGNORE, SequencePacking
from shardstream.errors import UsageError
from shardstream.plan.bins import best_fit_decreasing, cut_largest
from tests.sample_datasets import key_of, write_dataset

SEQ = 32
N = 45


def length(i: int) -> int:
    return 1 + (i * 11) % 29  # 1 .. 29 tokens


def make(i: int) -> dict:
    ids = 1000 * i + np.arange(length(i))
    mask = (np.arange(length(i)) >= length(i) // 2).astype(
        np.int64
    )  # the "answer": the second half
    return {"__key__": key_of(i), "ids.npy": ids, "mask.npy": mask}


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("packing"), [12, 9, 15, 9], make=make)


def packing(url, window=10, rows=2, **kw) -> SequencePacking:
    ds = ShardDataset(
        url,
        fields={"input_ids": "ids.npy", "loss_mask": "mask.npy"},
        seed=4,
        rank=kw.pop("rank", None),
        world_size=kw.pop("world_size", None),
    )
    return SequencePacking(
        ds, SEQ, window=window, batch_rows=rows, num_workers=kw.pop("workers", 0)
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(50, 80))
def test_best_fit_decreasing_places_every_item_once_within_capacity(lengths, capacity):
    rows = best_fit_decreasing(lengths, capacity)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in r) <= capacity for r in rows)
    # no two rows could be merged: best fit leaves at most one row at most half full
    assert sum(1 for r in rows if sum(lengths[i] for i in r) <= capacity // 2) <= 1
    more = cut_largest(rows, len(rows) + 3)
    assert sorted(i for r in more for i in r) == sorted(i for r in rows for i in r)


def check_batch(batch, rows=2) -> list[str]:
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    assert ids.shape == labels.shape == pos.shape == (rows, SEQ)
    starts = np.flatnonzero(pos.numpy().ravel() == 0)
    starts = np.union1d(starts, np.arange(rows) * SEQ)
    assert batch["cu_seqlens"].tolist() == starts.tolist() + [rows * SEQ]
    keys = []
    for r, row_keys in enumerate(batch["__key__"]):
        at = 0
        for key in row_keys:
            i = int(key[1:])
            n = length(i)
            assert ids[r, at : at + n].tolist() == (1000 * i + np.arange(n)).tolist()
            assert pos[r, at : at + n].tolist() == list(range(n))
            want = [IGNORE if k < n // 2 else 1000 * i + k for k in range(n)]
            want[0] = IGNORE  # a sample's first token is never a target
            assert labels[r, at : at + n].tolist() == want
            at += n
        assert at <= SEQ and (labels[r, at:] == IGNORE).all()
        keys += row_keys
    assert keys and batch["tokens"] == sum(length(int(k[1:])) for k in keys)
    return keys


def test_rows_hold_every_sample_once(url):
    got = [k for b in packing(url) for k in check_batch(b)]
    assert sorted(got) == [key_of(i) for i in range(N)]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_batches_are_the_same_for_any_number_of_workers(url, workers):
    plain = [b["__key__"] for b in packing(url)]
    assert [b["__key__"] for b in packing(url, workers=workers)] == plain


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_read_equal_sample_counts_and_every_sample(url, world):
    # ranks agree by all_reduce under torch.distributed; here each rank alone: counts may differ, so
    # the agreement is checked with a real process group in test_lengths' gloo test for the shared code
    per_rank = [
        [k for b in packing(url, rank=r, world_size=world) for k in check_batch(b)]
        for r in range(world)
    ]
    assert all(len(k) == -(-N // world) for k in per_rank)
    counted = Counter(k for keys in per_rank for k in keys)
    assert set(counted) == {key_of(i) for i in range(N)}
    assert sum(counted.values()) == world * -(-N // world)  # padding: whole repeated samples


def test_a_count_agreed_across_ranks_splits_rows_never_an_empty_batch(url):
    p = packing(url, window=45, rows=1)
    window = p.received(next(iter(p.loader)))  # the whole epoch: one window, as plan takes it
    rows = p.plan(window)
    more = p.fit(rows, len(rows) + 5)
    assert len(more) == len(rows) + 5
    keys = [k for g in more for k in check_batch(p.make(window, g), rows=1)]
    assert sorted(keys) == [key_of(i) for i in range(N)]


@pytest.mark.parametrize("workers", [0, 1])
def test_resume_mid_window_on_the_same_world_size(url, workers):
    full = [b["__key__"] for b in packing(url, workers=workers)]
    first = packing(url, workers=workers)
    taken = []
    for n, b in enumerate(first, 1):
        taken.append(b["__key__"])
        if n == 3:
            break
    state = json.loads(json.dumps(first.state_dict()))
    second = packing(url, workers=1 - workers)
    second.load_state_dict(state)
    assert taken + [b["__key__"] for b in second] == full


def test_resume_at_a_window_end_on_another_world_size(url):
    first = packing(url, window=5, rank=0, world_size=3)  # 15 per rank: 3 windows
    other = packing(url, window=5, rank=1, world_size=3)
    other2 = packing(url, window=5, rank=2, world_size=3)
    taken = []
    for p in (first, other, other2):
        it = iter(p.loader)
        window = p.received(next(it))  # the window's samples
        taken += [s["__key__"] for s in window]
    state = {"loader": first.loader.state_dict(), "emitted": 0, "world_size": 3}
    rest = []
    for r in range(2):
        p = packing(url, window=5, rank=r, world_size=2)
        p.load_state_dict(state)
        rest += [k for b in p for k in check_batch(b)]
    assert sorted(taken + rest) == [key_of(i) for i in range(N)]


def test_too_long_samples_and_bad_settings_are_named(tmp_path):
    url = write_dataset(
        tmp_path, [3], make=lambda i: {"__key__": key_of(i), "ids.npy": np.arange(40)}
    )
    ds = ShardDataset(url, fields={"input_ids": "ids.npy"})
    with pytest.raises(UsageError, match=r"s000\d has 40 tokens, more than seq_len=32"):
        list(SequencePacking(ds, SEQ, num_workers=0))
    with pytest.raises(ValueError, match="seq_len must be 1 or more"):
        SequencePacking(ShardDataset(url), 0)


def test_packing_a_mix(url, tmp_path):
    other = write_dataset(tmp_path, [6], make=lambda i: make(100 + i), name="other")
    fields = {"input_ids": "ids.npy", "loss_mask": "mask.npy"}
    sources = [ShardDataset(url, fields=fields), ShardDataset(other, fields=fields)]
    mix = MixedDataset(sources, [0.5, 0.5], samples_per_epoch=20)
    keys = []
    for b in SequencePacking(mix, SEQ, window=10, batch_rows=2, num_workers=0):
        keys += check_batch(b)
    assert len(keys) == 20 and Counter(k[1] == "0" and int(k[1:]) >= 100 for k in keys)
    assert sum(int(k[1:]) >= 100 for k in keys) == 10  # the mix's quota of the second source
