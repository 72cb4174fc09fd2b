"""Resuming: the segment still unread once every rank consumed part of its span."""

from __future__ import annotations

from .partition import per_rank
from .segments import Intervals, merge, segment_length, slice_segment


def remaining(
    segment: Intervals, world_size: int, consumed: int, drop_last: bool
) -> list[tuple[int, int]]:
    """The segment left once every rank consumed ``consumed`` positions of its span.

    Padding (indices past the segment's end) is never carried over, so every real sample
    still unread appears exactly once; a new world size cuts the result into spans anew.
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
        out.extend(slice_segment(segment, lo, hi))
    return merge(out)
