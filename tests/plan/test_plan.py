"""plan: the epoch's global order, the split across ranks and workers, and exact resume.

Property tests (hypothesis) over random shard counts (zero-sample shards, one shard, many
tiny shards), seeds, epochs, world sizes, worker counts, batch sizes, windows, shuffle and
drop_last, checking the reading contract of DESIGN.md on the pure planning functions.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardstream.plan import (
    EpochOrder,
    per_rank,
    rank_range,
    remaining,
    segment_length,
    segment_positions,
    span_bounds,
    worker_chunks,
)

FAST = settings(max_examples=150, deadline=None)

# -- strategies ---------------------------------------------------------------------------

counts_st = st.one_of(
    st.lists(st.integers(0, 40), min_size=0, max_size=12),  # a few shards, some possibly empty
    st.lists(st.integers(0, 300), min_size=1, max_size=1),  # one shard
    st.lists(st.integers(0, 3), min_size=1, max_size=80),  # many tiny shards, many empty ones
)
seeds = st.integers(0, 2**63 - 1)
epochs = st.integers(0, 1000)
windows = st.one_of(st.none(), st.integers(1, 8), st.integers(1, 400), st.just(10**9))
worlds = st.integers(1, 9)
workers = st.integers(1, 5)
batches = st.integers(1, 7)


@st.composite
def segments(draw, min_length: int = 0, max_intervals: int = 6):
    """A segment: disjoint half-open intervals of global positions, in any order."""
    n = draw(st.integers(0, max_intervals))
    out, pos = [], draw(st.integers(0, 20))
    for _ in range(n):
        pos += draw(st.integers(0, 15))  # gap (0: adjacent intervals)
        length = draw(st.integers(0, 25))
        out.append((pos, pos + length))
        pos += length
    if segment_length(out) < min_length:
        out.append((pos + 1, pos + 1 + min_length))
    if draw(st.booleans()):
        out = draw(st.permutations(out))
    return [tuple(iv) for iv in out]


def expected_pairs(counts: list[int]) -> set[tuple[int, int]]:
    return {(s, o) for s, c in enumerate(counts) for o in range(c)}


def all_positions(segment) -> np.ndarray:
    """The segment's positions, in order, without padding."""
    return np.array([p for start, stop in segment for p in range(start, stop)], dtype=np.int64)


def span_positions(segment, world: int, rank: int, drop_last: bool) -> np.ndarray:
    lo, hi = rank_range(segment, world, rank, drop_last)
    return segment_positions(segment, np.arange(lo, hi))


def consumed_positions(segment, world: int, k: int, drop_last: bool) -> list[int]:
    """What ranks 0..world-1 read with the first ``k`` entries of their spans, padding left out."""
    total = segment_length(segment)
    out: list[int] = []
    for r in range(world):
        lo, _ = rank_range(segment, world, r, drop_last)
        idx = np.arange(lo, lo + k)
        idx = idx[idx < total]  # padding: already counted where the segment start is read
        out.extend(segment_positions(segment, idx).tolist())
    return out


def read_in_full(segment, world: int, drop_last: bool) -> list[int]:
    """Every real (non-padding) position that ranks 0..world-1 read from ``segment``."""
    total = segment_length(segment)
    out: list[int] = []
    for r in range(world):
        lo, hi = rank_range(segment, world, r, drop_last)
        idx = np.arange(lo, min(hi, total))
        out.extend(segment_positions(segment, idx).tolist())
    return out


def dataloader_order(per_worker: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """Chunks as torch's DataLoader collects them: round robin over workers, skipping finished ones."""
    iters = [iter(chunks) for chunks in per_worker]
    active = list(range(len(iters)))
    out = []
    while active:
        for w in list(active):
            chunk = next(iters[w], None)
            if chunk is None:
                active.remove(w)
            else:
                out.append(chunk)
    return out


# -- the global order ---------------------------------------------------------------------


@FAST
@given(counts=counts_st, seed=seeds, epoch=epochs, shuffle=st.booleans(), window=windows)
def test_epoch_order_is_a_bijection_onto_all_samples(counts, seed, epoch, shuffle, window):
    order = EpochOrder.create(counts, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    n = sum(counts)
    assert order.total == n
    shards, offsets = order.samples(np.arange(n))
    assert len(shards) == len(offsets) == n
    pairs = list(zip(shards.tolist(), offsets.tolist()))
    assert len(set(pairs)) == n  # nothing twice
    assert set(pairs) == expected_pairs(counts)  # everything, nothing out of range
    assert all(counts[s] > 0 for s in set(shards.tolist()))  # empty shards are never read


@FAST
@given(counts=counts_st, seed=seeds, epoch=epochs, shuffle=st.booleans(), window=windows)
def test_epoch_order_is_deterministic(counts, seed, epoch, shuffle, window):
    a = EpochOrder.create(counts, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    b = EpochOrder.create(
        np.array(counts, dtype=np.int64), seed=seed, epoch=epoch, shuffle=shuffle, window=window
    )
    assert np.array_equal(a.shard_order, b.shard_order)
    positions = np.arange(a.total)[::-1]  # any order of positions, also reversed
    for x, y in zip(a.samples(positions), b.samples(positions)):
        assert np.array_equal(x, y)


def test_different_epochs_and_seeds_give_different_orders():
    counts = [100] * 50
    base = EpochOrder.create(counts, seed=7, epoch=0, window=256)
    positions = np.arange(base.total)
    ref = base.samples(positions)
    for other in (
        EpochOrder.create(counts, seed=7, epoch=1, window=256),
        EpochOrder.create(counts, seed=8, epoch=0, window=256),
    ):
        assert not np.array_equal(other.shard_order, base.shard_order)
        got = other.samples(positions)
        assert not (np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1]))
        assert not np.array_equal(other.window_permutation(0), base.window_permutation(0))


def test_shuffle_changes_the_order_and_mixes_shards_within_a_window():
    counts = [10] * 40
    order = EpochOrder.create(counts, seed=1, epoch=0, shuffle=True, window=40)
    shards, _ = order.samples(np.arange(40))
    assert len(set(shards.tolist())) > 1  # one window spans several shards, and is mixed
    assert not np.array_equal(order.shard_order, np.arange(40))


@FAST
@given(counts=counts_st, seed=seeds, epoch=epochs, window=windows)
def test_no_shuffle_reads_shards_in_order_with_identity_windows(counts, seed, epoch, window):
    order = EpochOrder.create(counts, seed=seed, epoch=epoch, shuffle=False, window=window)
    assert np.array_equal(order.shard_order, np.arange(len(counts)))
    for w in range(-(-order.total // order.window)):
        perm = order.window_permutation(w)
        assert np.array_equal(perm, np.arange(len(perm)))
    shards, offsets = order.samples(np.arange(order.total))
    expected = [(s, o) for s, c in enumerate(counts) for o in range(c)]
    assert list(zip(shards.tolist(), offsets.tolist())) == expected


@FAST
@given(counts=counts_st, seed=seeds, epoch=epochs, shuffle=st.booleans(), window=st.integers(1, 60))
def test_window_permutation_is_a_permutation_and_the_last_window_is_shorter(
    counts, seed, epoch, shuffle, window
):
    order = EpochOrder.create(counts, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    n = order.total
    nwin = -(-n // window)
    lengths = []
    for w in range(nwin):
        perm = order.window_permutation(w)
        assert sorted(perm.tolist()) == list(range(len(perm)))
        lengths.append(len(perm))
    assert sum(lengths) == n
    assert all(length == window for length in lengths[:-1])
    if nwin:
        assert lengths[-1] == (n % window or window)
        if n % window:
            assert lengths[-1] < window
    # the shuffle stays inside its window: position p of window w reads what the same shard order
    # without the in-window shuffle has at w * window + perm[p - w * window]
    unshuffled = EpochOrder(
        order.per_shard, seed, epoch, False, window, order.shard_order, order.ends, order.total
    )
    for w in range(nwin):
        pos = np.arange(w * window, min((w + 1) * window, n))
        src = w * window + order.window_permutation(w)
        for x, y in zip(order.samples(pos), unshuffled.samples(src)):
            assert np.array_equal(x, y)


def test_window_zero_is_rejected():
    with pytest.raises(ValueError):
        EpochOrder.create([3, 4], window=0)


# -- ranks --------------------------------------------------------------------------------


@FAST
@given(segment=segments(), world=worlds, drop_last=st.booleans())
def test_ranks_concatenated_are_the_global_order_for_any_world_size(segment, world, drop_last):
    n = segment_length(segment)
    cat = np.concatenate([span_positions(segment, world, r, drop_last) for r in range(world)])
    positions = all_positions(segment)
    if drop_last:
        assert np.array_equal(cat, positions[: world * (n // world)])
    else:
        assert len(cat) == world * -(-n // world)
        assert np.array_equal(cat[:n], positions)  # padding removed: the segment, in order
        # padding repeats the segment from its start (wrapping again with more ranks than samples)
        pad = cat[n:]
        if len(pad):
            assert np.array_equal(pad, positions[np.arange(len(pad)) % n])


@FAST
@given(
    counts=counts_st,
    seed=seeds,
    epoch=epochs,
    shuffle=st.booleans(),
    window=windows,
    world=st.one_of(worlds, st.integers(10, 200)),
    drop_last=st.booleans(),
)
def test_every_rank_gets_the_same_number_of_samples(
    counts, seed, epoch, shuffle, window, world, drop_last
):
    n = sum(counts)
    order = EpochOrder.create(counts, seed=seed, epoch=epoch, shuffle=shuffle, window=window)
    segment = [(0, n)]
    expected = n // world if drop_last else -(-n // world)
    assert per_rank(n, world, drop_last) == expected
    read = Counter()
    for r in range(world):
        lo, hi = rank_range(segment, world, r, drop_last)
        assert hi - lo == expected
        positions = segment_positions(segment, np.arange(lo, hi))
        assert len(positions) == expected
        shards, offsets = order.samples(positions)
        read.update(zip(shards.tolist(), offsets.tolist()))
    everything = expected_pairs(counts)
    assert set(read) <= everything
    if drop_last:
        assert all(v == 1 for v in read.values())
        assert sum(read.values()) == world * (n // world)
    else:
        assert set(read) == everything  # every sample is read, padding repeats some
        assert sum(read.values()) == world * expected
        # the repeated ones are the first samples of the epoch's order
        pad = world * expected - n
        first = order.samples(np.arange(pad) % max(n, 1))
        repeats = Counter(zip(first[0].tolist(), first[1].tolist()))
        assert {k: v - 1 for k, v in read.items() if v > 1} == repeats


@FAST
@given(segment=segments(min_length=1), world=worlds, drop_last=st.booleans())
def test_ranks_get_equal_contiguous_spans(segment, world, drop_last):
    n = per_rank(segment_length(segment), world, drop_last)
    spans = [rank_range(segment, world, r, drop_last) for r in range(world)]
    assert spans[0][0] == 0
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a1 == b0
        assert a1 - a0 == b1 - b0 == n


@pytest.mark.parametrize("rank", [-1, 3, 4, 100])
def test_rank_range_rejects_a_bad_rank(rank):
    with pytest.raises(ValueError):
        rank_range([(0, 10)], 3, rank, False)


# -- segments -----------------------------------------------------------------------------


def test_segment_positions_maps_intervals_and_wraps():
    segment = [(10, 13), (20, 22)]
    got = segment_positions(segment, np.arange(12))
    assert got.tolist() == [10, 11, 12, 20, 21, 10, 11, 12, 20, 21, 10, 11]
    assert segment_positions([(5, 5), (7, 9), (9, 9), (0, 1)], np.arange(4)).tolist() == [
        7,
        8,
        0,
        7,
    ]


@FAST
@given(segment=segments(min_length=1), extra=st.integers(0, 100))
def test_segment_positions_follows_the_intervals_and_pads_by_wrapping(segment, extra):
    n = segment_length(segment)
    positions = all_positions(segment)
    assert np.array_equal(segment_positions(segment, np.arange(n)), positions)
    index = np.arange(n, n + extra)
    assert np.array_equal(segment_positions(segment, index), positions[index % n])


# -- workers ------------------------------------------------------------------------------


@FAST
@given(
    segment=segments(),
    world=worlds,
    data=st.data(),
    num_workers=workers,
    batch_size=batches,
    drop_last=st.booleans(),
)
def test_dataloader_order_is_the_rank_order_for_any_worker_count(
    segment, world, data, num_workers, batch_size, drop_last
):
    rank = data.draw(st.integers(0, world - 1))
    span = rank_range(segment, world, rank, drop_last)
    consumed = data.draw(st.integers(0, span[1] - span[0]))
    per_worker = [
        list(worker_chunks(span, batch_size, num_workers, w, consumed)) for w in range(num_workers)
    ]
    # the rank's span from `consumed` on, cut into batches; chunk c goes to worker c % num_workers
    cuts = [
        (lo, min(lo + batch_size, span[1])) for lo in range(span[0] + consumed, span[1], batch_size)
    ]
    for w in range(num_workers):
        assert per_worker[w] == cuts[w::num_workers]
    collected = dataloader_order(per_worker)
    assert collected == cuts
    indices = [i for lo, hi in collected for i in range(lo, hi)]
    assert indices == list(range(span[0] + consumed, span[1]))
    if segment_length(segment):
        got = [
            p
            for lo, hi in collected
            for p in segment_positions(segment, np.arange(lo, hi)).tolist()
        ]
        want = segment_positions(segment, np.arange(span[0] + consumed, span[1])).tolist()
        assert got == want


@FAST
@given(
    counts=counts_st,
    seed=seeds,
    world=worlds,
    data=st.data(),
    num_workers=workers,
    batch_size=batches,
    window=windows,
    shuffle=st.booleans(),
)
def test_workers_read_the_rank_samples_in_plan_order(
    counts, seed, world, data, num_workers, batch_size, window, shuffle
):
    """End to end: what the DataLoader yields on a rank equals that rank's planned (shard, sample) sequence."""
    order = EpochOrder.create(counts, seed=seed, epoch=3, shuffle=shuffle, window=window)
    segment = [(0, order.total)]
    rank = data.draw(st.integers(0, world - 1))
    span = rank_range(segment, world, rank, False)
    if order.total == 0:
        assert span[1] - span[0] == 0
        return
    per_worker = []
    for w in range(num_workers):
        batches_of_w = []
        for lo, hi in worker_chunks(span, batch_size, num_workers, w):
            s, o = order.samples(segment_positions(segment, np.arange(lo, hi)))
            assert 1 <= len(s) <= batch_size
            batches_of_w.append(list(zip(s.tolist(), o.tolist())))
        per_worker.append(batches_of_w)
    got = [pair for batch in dataloader_order(per_worker) for pair in batch]
    s, o = order.samples(segment_positions(segment, np.arange(*span)))
    assert got == list(zip(s.tolist(), o.tolist()))


# -- resume -------------------------------------------------------------------------------


@FAST
@given(segment=segments(), world=worlds, new_world=worlds, data=st.data())
def test_resume_with_any_world_size_repeats_and_skips_nothing(segment, world, new_world, data):
    n = per_rank(segment_length(segment), world, False)
    k = data.draw(st.integers(0, n))
    rest = remaining(segment, world, k, False)
    before = consumed_positions(segment, world, k, False)
    after = read_in_full(rest, new_world, False)
    assert segment_length(rest) == len(after)
    assert sorted(before + after) == sorted(all_positions(segment).tolist())  # each exactly once
    assert len(before) + segment_length(rest) == segment_length(segment)
    # the new segment keeps the global order: it is the segment with the consumed positions taken out
    read = set(before)
    assert all_positions(rest).tolist() == [
        p for p in all_positions(segment).tolist() if p not in read
    ]


@FAST
@given(
    segment=segments(), world=worlds, new_world=worlds, data=st.data(), new_drop_last=st.booleans()
)
def test_resume_with_drop_last_stays_inside_the_original_spans(
    segment, world, new_world, data, new_drop_last
):
    total = segment_length(segment)
    n = per_rank(total, world, True)
    k = data.draw(st.integers(0, n))
    rest = remaining(segment, world, k, True)
    spans = [p for r in range(world) for p in span_positions(segment, world, r, True).tolist()]
    before = consumed_positions(segment, world, k, True)
    assert segment_length(rest) == world * (n - k)
    # the new segment is exactly the unread part of the original spans, the dropped tail stays dropped
    assert sorted(before + all_positions(rest).tolist()) == sorted(spans)
    after = read_in_full(rest, new_world, new_drop_last)
    assert len(set(before + after)) == len(before) + len(after)  # no sample twice
    assert set(before + after) <= set(spans)  # nothing outside the original per-rank spans
    if not new_drop_last or segment_length(rest) % new_world == 0:
        assert sorted(before + after) == sorted(spans)


@FAST
@given(segment=segments(), w1=worlds, w2=worlds, w3=worlds, data=st.data())
def test_chained_resumes_stay_exact(segment, w1, w2, w3, data):
    k1 = data.draw(st.integers(0, per_rank(segment_length(segment), w1, False)))
    seg2 = remaining(segment, w1, k1, False)
    k2 = data.draw(st.integers(0, per_rank(segment_length(seg2), w2, False)))
    seg3 = remaining(seg2, w2, k2, False)
    read = consumed_positions(segment, w1, k1, False) + consumed_positions(seg2, w2, k2, False)
    read += read_in_full(seg3, w3, False)
    assert sorted(read) == sorted(all_positions(segment).tolist())


@FAST
@given(counts=counts_st, seed=seeds, world=worlds, new_world=worlds, data=st.data(), window=windows)
def test_resume_reads_every_sample_of_the_epoch_exactly_once(
    counts, seed, world, new_world, data, window
):
    """Samples, not just positions: the whole epoch across a resize, with real padding left out."""
    order = EpochOrder.create(counts, seed=seed, epoch=2, window=window)
    segment = [(0, order.total)]
    k = data.draw(st.integers(0, per_rank(order.total, world, False)))
    rest = remaining(segment, world, k, False)
    positions = np.array(
        consumed_positions(segment, world, k, False) + read_in_full(rest, new_world, False),
        dtype=np.int64,
    )
    shards, offsets = order.samples(positions)
    pairs = list(zip(shards.tolist(), offsets.tolist()))
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == expected_pairs(counts)


@pytest.mark.parametrize("drop_last", [False, True])
def test_remaining_rejects_consumed_outside_the_span(drop_last):
    segment = [(0, 10), (20, 25)]  # 15 positions, 4 ranks: 4 each (ceil) or 3 (floor)
    n = per_rank(15, 4, drop_last)
    assert remaining(segment, 4, n, drop_last) == []
    assert segment_length(remaining(segment, 4, 0, drop_last)) == (15 if not drop_last else 12)
    for bad in (-1, n + 1, 100):
        with pytest.raises(ValueError):
            remaining(segment, 4, bad, drop_last)


def test_remaining_example():
    # 10 positions on 3 ranks: spans [0,4) [4,8) [8,12) (10, 11 are padding); each rank read 2
    assert remaining([(0, 10)], 3, 2, False) == [(2, 4), (6, 8)]
    assert remaining([(0, 10)], 3, 1, True) == [(1, 3), (4, 6), (7, 9)]
    assert remaining([(100, 103), (200, 207)], 2, 3, False) == [(200, 202), (205, 207)]


@settings(max_examples=150, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=15),
    seed=st.integers(-(2**70), 2**70),
    window=st.integers(1, 50),
    world=st.integers(1, 6),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_a_restricted_order_reads_the_same_samples_for_its_rank(
    counts, seed, window, world, drop_last, data
):
    order = EpochOrder.create(counts, seed=seed, epoch=1, window=window)
    n = order.total
    if n == 0 or (drop_last and n < world):
        return
    rank = data.draw(st.integers(0, world - 1))
    segment = [(0, n)]
    span = rank_range(segment, world, rank, drop_last)
    lo, hi = span_bounds(segment, span)
    positions = segment_positions(segment, np.arange(*span))
    assert positions.min() >= lo and positions.max() < hi
    small = order.restrict(lo, hi)
    assert len(small.shard_order) <= len(order.shard_order)
    for full, part in zip(order.samples(positions), small.samples(positions)):
        assert np.array_equal(full, part)
