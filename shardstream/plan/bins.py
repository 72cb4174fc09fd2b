"""Sequence packing and bucketing: which samples of a window share a row or a batch, from integers alone.

:func:`best_fit_decreasing` packs variable-length samples into rows of at most ``capacity`` tokens:
longest first, each into the fullest row that still has room (the row with the least room left that
fits it), a new row where none fits. It uses at most 11/9 of the optimal number of rows plus one,
and with many short samples fills rows almost exactly. :func:`cut_largest` makes more rows (or batches) of the same
samples (the ranks of a window agree on one count of batches), and :func:`bucket_batches` cuts a
window into batches of one bucket each. All are deterministic: ties go to the lower index.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import numpy as np


def best_fit_decreasing(lengths: Sequence[int] | np.ndarray, capacity: int) -> list[list[int]]:
    """Rows of indices into ``lengths`` whose lengths sum to at most ``capacity`` each: every index in
    exactly one row, rows in the order they were opened, each row's samples longest first."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if capacity < 1:
        raise ValueError(f"capacity must be at least 1 token, not {capacity}")
    if len(lengths) and (int(lengths.max()) > capacity or int(lengths.min()) < 0):
        i = int(np.argmax(lengths > capacity)) if int(lengths.max()) > capacity else 0
        raise ValueError(f"sample {i} has length {int(lengths[i])}, not in [0, {capacity}]")
    rows: list[list[int]] = []
    room: list[
        tuple[int, int]
    ] = []  # (tokens left, row) sorted: the fullest row that fits comes first
    for i in np.argsort(-lengths, kind="stable").tolist():
        n = int(lengths[i])
        k = bisect.bisect_left(room, (n, -1))
        if k == len(room):
            rows.append([i])
            bisect.insort(room, (capacity - n, len(rows) - 1))
            continue
        left, row = room.pop(k)
        rows[row].append(i)
        bisect.insort(room, (left - n, row))
    return rows


def cut_largest(groups: list[Any], count: int) -> list[Any]:
    """``groups`` (rows of a pack, or batches of a bucket) with the group of most samples halved until
    there are at least ``count``; a group of one sample stays whole (fewer groups then, if every group
    holds one sample). Each half keeps its row's or bucket's samples in order."""
    groups = list(groups)
    while len(groups) < count:
        j = max(range(len(groups)), key=lambda k: (len(groups[k]), -k)) if groups else -1
        if j < 0 or len(groups[j]) < 2:
            break
        half = len(groups[j]) // 2
        groups[j : j + 1] = [groups[j][:half], groups[j][half:]]
    return groups


def deal(items: int, count: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of ``count`` consecutive groups of ``items`` as equal as can be (each of at least
    one item when ``items >= count``)."""
    return [(k * items // count, (k + 1) * items // count) for k in range(count)]


def bucket_of(values: np.ndarray, boundaries: Sequence[float]) -> np.ndarray:
    """The bucket of each value: ``b`` where ``boundaries[b-1] <= value < boundaries[b]`` (bucket 0 below
    the first boundary, ``len(boundaries)`` from the last one on)."""
    edges = np.asarray(boundaries, dtype=np.float64)
    if len(edges) and (np.diff(edges) <= 0).any():
        raise ValueError(f"bucket boundaries must increase, not {list(boundaries)}")
    return np.searchsorted(edges, np.asarray(values, dtype=np.float64), side="right")


def bucket_batches(buckets: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """A window cut into batches of at most ``batch_size`` samples of one bucket each, in the window's
    order: bucket by bucket (ascending), each bucket's samples in window order, its last batch the
    short one."""
    buckets = np.asarray(buckets, dtype=np.int64)
    out: list[np.ndarray] = []
    for b in np.unique(buckets).tolist():
        members = np.flatnonzero(buckets == b)
        out += [members[k : k + batch_size] for k in range(0, len(members), batch_size)]
    return out


__all__ = [
    "best_fit_decreasing",
    "bucket_batches",
    "bucket_of",
    "deal",
    "cut_largest",
]
