"""The mix's order: exact quotas, every prefix in proportion, closed-form counts, endless passes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.plan.mix import MixSchedule, quotas, stream_items

weights_st = st.lists(
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=8
).filter(lambda w: sum(w) > 0)


def prefix_counts(src: np.ndarray, k: int) -> np.ndarray:
    """counts[n, i]: positions of source i among the first n."""
    out = np.zeros((len(src) + 1, k), dtype=np.int64)
    for i in range(k):
        out[1:, i] = np.cumsum(src == i)
    return out


@settings(max_examples=200, deadline=None)
@given(weights_st, st.integers(1, 3000))
def test_quotas_are_floor_or_ceil_and_sum_to_the_epoch(weights, total):
    q = quotas(weights, total)
    exact = np.asarray(weights) / sum(weights) * total
    assert q.sum() == total
    assert (q >= np.floor(exact - 1e-9)).all() and (q <= np.ceil(exact + 1e-9)).all()


@settings(max_examples=150, deadline=None)
@given(weights_st, st.integers(1, 2500))
def test_every_source_gets_exactly_its_quota_in_stream_order(weights, total):
    q = quotas(weights, total)
    schedule = MixSchedule.create(q)
    src, index = schedule.locate(np.arange(total))
    for i in range(len(q)):
        mine = src == i
        assert mine.sum() == q[i]
        assert (
            index[mine] == np.arange(q[i])
        ).all()  # each source's items in its own order, none twice


@settings(max_examples=150, deadline=None)
@given(weights_st, st.integers(1, 2500))
def test_every_prefix_holds_the_weights(weights, total):
    q = quotas(weights, total)
    live = int((q > 0).sum())
    src, _ = MixSchedule.create(q).locate(np.arange(total))
    counts = prefix_counts(src, len(q))
    deviation = np.abs(counts - np.arange(total + 1)[:, None] * (q / total)[None, :]).max()
    # up to four sources every source is at most two splits deep: each split is off by at most 1/2
    # a sample, the parent's error shrinks by the share, so |count - w n| < 1; more sources: < 1.5
    assert deviation < (1.0 if live <= 4 else 1.5)


@settings(max_examples=100, deadline=None)
@given(weights_st, st.integers(1, 2000), st.data())
def test_counts_are_a_closed_form_of_the_position(weights, total, data):
    q = quotas(weights, total)
    schedule = MixSchedule.create(q)
    src, _ = schedule.locate(np.arange(total))
    n = data.draw(st.integers(0, total))
    assert schedule.counts(n).tolist() == prefix_counts(src, len(q))[n].tolist()
    lo = data.draw(st.integers(0, total - 1))
    # any slice alone, as a worker places it
    part_src, part_index = schedule.locate(np.arange(lo, total))
    full_src, full_index = schedule.locate(np.arange(total))
    assert (part_src == full_src[lo:]).all() and (part_index == full_index[lo:]).all()


def test_two_sources_are_balanced_to_half_a_sample():
    q = quotas([0.7, 0.3], 1000)
    src, _ = MixSchedule.create(q).locate(np.arange(1000))
    counts = prefix_counts(src, 2)
    assert np.abs(counts - np.arange(1001)[:, None] * np.array([0.7, 0.3])).max() <= 0.5 + 1e-9


def test_zero_weights_and_single_sources():
    q = quotas([0, 3, 0], 10)
    assert q.tolist() == [0, 10, 0]
    src, index = MixSchedule.create(q).locate(np.arange(10))
    assert (src == 1).all() and index.tolist() == list(range(10))
    assert MixSchedule.create(q).counts(7).tolist() == [0, 7, 0]
    with pytest.raises(ValueError):
        MixSchedule.create([0, 0])


def test_stream_items_walk_passes_in_turn():
    # quota 7 of a 3-sample source: epoch 0 reads pass 0, 1 whole and one sample of pass 2
    passes, items = stream_items(0, 7, 3, np.arange(7))
    assert passes.tolist() == [0, 0, 0, 1, 1, 1, 2] and items.tolist() == [0, 1, 2, 0, 1, 2, 0]
    passes, items = stream_items(1, 7, 3, np.arange(2))  # the next epoch goes on where it stopped
    assert passes.tolist() == [2, 2] and items.tolist() == [1, 2]
    # downsampled: quota 4 of a 10-sample source continues across epochs and covers it evenly
    seen = np.concatenate([stream_items(e, 4, 10, np.arange(4))[1] for e in range(5)])
    assert np.bincount(seen, minlength=10).tolist() == [2] * 10


def test_large_mixes_plan_without_samples_tables():
    q = quotas(np.arange(1, 11), 10 * 10**8)  # ten sources of 10^8 samples each
    schedule = MixSchedule.create(q)
    src, index = schedule.locate(np.arange(10**9 - 4096, 10**9))
    assert schedule.counts(10**9).tolist() == q.tolist()
    assert np.bincount(src, minlength=10).sum() == 4096 and (index < q[src]).all()
    # past 2**30 positions: exact integers still
    big = MixSchedule.create(quotas([1, 2], 3 * 10**9))
    assert big.counts(3 * 10**9).tolist() == [10**9, 2 * 10**9]
