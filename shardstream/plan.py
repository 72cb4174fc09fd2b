"""The reading plan: which (shard, sample) each rank and worker reads, in what order.

Pure functions of integers, with no I/O: testable offline, identical on every rank.

An epoch's **global order** depends only on the shard sample counts, the seed and the
epoch: shards are permuted, laid end to end, and the resulting sequence of positions
is shuffled inside consecutive windows of ``window`` positions (a shuffle buffer
computed from indices, so it is deterministic and resumable). World size and worker
count never change the global order; they only change who reads which part of it.

A **segment** is the part of the global order still to be read in this epoch, as a
list of half-open position intervals (``[(0, N)]`` at the start of an epoch). Ranks get
equal contiguous spans of the segment, so each rank touches about 1/world of the
shards: ``ceil(R / world)`` positions each, the tail padded by repeating the segment
from its start (``drop_last=False``), or ``floor(R / world)`` with the tail dropped.
Within a rank, the span is cut into chunks of ``batch_size`` positions, dealt out to the
DataLoader workers round robin, which is the order in which the DataLoader collects
them: its in-order output is the rank's planned order for any number of workers.

Resuming: after each rank consumed ``k`` positions of its span, :func:`remaining`
gives the new segment, exact for any new world size. Memory is O(shards + intervals);
positions are expanded to samples window by window.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

Intervals = Sequence[tuple[int, int]]


def default_window(counts: np.ndarray) -> int:
    """A window spanning about four average shards (at least 1,024 samples)."""
    if len(counts) == 0:
        return 1024
    return max(1024, int(4 * counts.sum() // len(counts)))


def _rng(*key: int) -> np.random.Generator:
    words = []
    for k in key:
        k %= 1 << 64  # any Python int, negative seeds included
        words += [k & 0xFFFFFFFF, k >> 32]
    return np.random.default_rng(np.random.SeedSequence(words))


@dataclass
class EpochOrder:
    """The global order of one epoch: position ``p`` -> (shard, sample within shard).

    ``shard_order[i]`` is the i-th shard of the epoch and ``ends[i]`` the position where it
    ends; after :meth:`restrict`, both hold only the shards a range of positions can reach,
    starting at ``first``.
    """

    counts: np.ndarray  # samples per shard, int64
    seed: int
    epoch: int
    shuffle: bool
    window: int
    shard_order: np.ndarray  # the epoch's shard permutation (or a slice of it)
    ends: np.ndarray  # cumulative sample counts along shard_order
    total: int
    first: int = 0
    _cached: tuple[int, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def create(cls, counts: Sequence[int] | np.ndarray, seed: int = 0, epoch: int = 0,
               shuffle: bool = True, window: int | None = None) -> EpochOrder:
        counts = np.asarray(counts, dtype=np.int64)
        if window is None:
            window = default_window(counts)
        if window < 1:
            raise ValueError(f"shuffle window must be at least 1 sample, not {window}")
        order = _rng(seed, epoch, 0).permutation(len(counts)) if shuffle else np.arange(len(counts))
        ends = np.cumsum(counts[order])
        return cls(counts, int(seed), int(epoch), bool(shuffle), int(window), order, ends,
                   int(ends[-1]) if len(ends) else 0)

    def restrict(self, lo: int, hi: int) -> EpochOrder:
        """The same order, holding only the shards that positions in [lo, hi) can reach.

        A rank reads about 1/world of the epoch, so its workers keep O(shards / world)
        of the plan instead of O(shards).
        """
        w_lo = (lo // self.window) * self.window
        w_hi = min(-(-hi // self.window) * self.window, self.total)
        k0 = int(np.searchsorted(self.ends, w_lo, side="right"))
        k1 = int(np.searchsorted(self.ends, max(w_hi - 1, w_lo), side="right")) + 1
        return EpochOrder(self.counts, self.seed, self.epoch, self.shuffle, self.window,
                          self.shard_order[k0:k1].astype(np.int64), self.ends[k0:k1].copy(), self.total, k0)

    def window_permutation(self, w: int) -> np.ndarray:
        """The in-window permutation of window ``w`` (identity without shuffle)."""
        if self._cached is not None and self._cached[0] == w:
            return self._cached[1]
        start = w * self.window
        length = min(self.window, self.total - start)
        perm = _rng(self.seed, self.epoch, w + 1).permutation(length) if self.shuffle else np.arange(length)
        self._cached = (w, perm)
        return perm

    def samples(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard ids, sample offsets) at global ``positions`` (each in ``[0, total)``)."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.shuffle:
            src = np.empty_like(positions)
            windows = positions // self.window
            first, last = int(windows.min()), int(windows.max())
            for w in (range(first, last + 1) if last - first < 2 else np.unique(windows).tolist()):
                mask = windows == w
                src[mask] = w * self.window + self.window_permutation(w)[positions[mask] - w * self.window]
        else:
            src = positions  # identity windows
        k = np.searchsorted(self.ends, src, side="right")
        shards = self.shard_order[k]
        offsets = src - (self.ends[k] - self.counts[shards])
        return shards, offsets


def per_rank(total: int, world_size: int, drop_last: bool) -> int:
    """Positions each rank reads from a segment of ``total`` positions."""
    return total // world_size if drop_last else -(-total // world_size)


def segment_length(segment: Intervals) -> int:
    return sum(stop - start for start, stop in segment)


def segment_positions(segment: Intervals, index: np.ndarray) -> np.ndarray:
    """Global positions of the segment's ``index``-th entries (wrapping past its end: padding)."""
    index = np.asarray(index, dtype=np.int64)
    if len(segment) == 1:  # the usual case: one interval
        start, stop = segment[0]
        return start + index % (stop - start)
    starts = np.array([s for s, _ in segment], dtype=np.int64)
    lengths = np.array([e - s for s, e in segment], dtype=np.int64)
    total = int(lengths.sum())
    index = index % total
    cum = np.cumsum(lengths)
    k = np.searchsorted(cum, index, side="right")
    return starts[k] + index - (cum[k] - lengths[k])


def rank_range(segment: Intervals, world_size: int, rank: int, drop_last: bool) -> tuple[int, int]:
    """[start, stop) of rank ``rank``'s span, as indices into the (padded) segment."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    n = per_rank(segment_length(segment), world_size, drop_last)
    return rank * n, (rank + 1) * n


def span_bounds(segment: Intervals, span: tuple[int, int]) -> tuple[int, int]:
    """The smallest [lo, hi) of global positions that a span of segment indices covers (padding included)."""
    total = segment_length(segment)
    start, stop = span
    pieces = _slice(segment, start, min(stop, total))
    if stop > total:  # padding wraps to the segment's start
        pieces += _slice(segment, 0, min(stop - total, total))
    if not pieces:
        return 0, 0
    return min(a for a, _ in pieces), max(b for _, b in pieces)


def worker_chunks(span: tuple[int, int], batch_size: int, num_workers: int, worker_id: int,
                  consumed: int = 0) -> Iterator[tuple[int, int]]:
    """The [start, stop) segment-index ranges this worker reads, in order.

    The rank's span from ``consumed`` on is cut into chunks of ``batch_size``; chunk ``c``
    goes to worker ``c % num_workers``.
    """
    start, stop = span[0] + consumed, span[1]
    for lo in range(start + worker_id * batch_size, stop, num_workers * batch_size):
        yield lo, min(lo + batch_size, stop)


def remaining(segment: Intervals, world_size: int, consumed: int, drop_last: bool) -> list[tuple[int, int]]:
    """The segment left once every rank consumed ``consumed`` positions of its span.

    Padding (indices past the segment's end) is never carried over, so every real sample
    still unread appears exactly once; a new world size splits the result anew.
    """
    total = segment_length(segment)
    n = per_rank(total, world_size, drop_last)
    if not 0 <= consumed <= n:
        raise ValueError(f"consumed {consumed} is not in [0, {n}] for this segment")
    out: list[tuple[int, int]] = []
    for r in range(world_size):
        lo, hi = r * n + consumed, min((r + 1) * n, total)
        if lo >= hi:
            continue
        out.extend(_slice(segment, lo, hi))
    return _merge(out)


def _slice(segment: Intervals, lo: int, hi: int) -> list[tuple[int, int]]:
    """The global intervals covered by segment indices [lo, hi) (no wrapping)."""
    out = []
    base = 0
    for start, stop in segment:
        length = stop - start
        a, b = max(lo - base, 0), min(hi - base, length)
        if a < b:
            out.append((start + a, start + b))
        base += length
        if base >= hi:
            break
    return out


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, stop in intervals:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged
