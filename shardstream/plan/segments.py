"""Segments: the part of an epoch's order still to be read, as half-open position intervals."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Intervals = Sequence[tuple[int, int]]


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


def slice_segment(segment: Intervals, lo: int, hi: int) -> list[tuple[int, int]]:
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


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, stop in intervals:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged
