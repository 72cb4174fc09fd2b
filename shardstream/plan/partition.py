"""Who reads what: equal contiguous spans per rank, batch-size chunks dealt to workers round robin."""

from __future__ import annotations

from collections.abc import Iterator

from .segments import Intervals, segment_length, slice_segment


def per_rank(total: int, world_size: int, drop_last: bool) -> int:
    """Positions each rank reads from a segment of ``total`` positions."""
    return total // world_size if drop_last else -(-total // world_size)


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
    pieces = slice_segment(segment, start, min(stop, total))
    if stop > total:  # padding wraps to the segment's start
        pieces += slice_segment(segment, 0, min(stop - total, total))
    if not pieces:
        return 0, 0
    return min(a for a, _ in pieces), max(b for _, b in pieces)


def worker_chunks(
    span: tuple[int, int], batch_size: int, num_workers: int, worker_id: int, consumed: int = 0
) -> Iterator[tuple[int, int]]:
    """The [start, stop) segment-index ranges this worker reads, in order.

    The rank's span from ``consumed`` on is cut into chunks of ``batch_size``; chunk ``c``
    goes to worker ``c % num_workers``.
    """
    start, stop = span[0] + consumed, span[1]
    for lo in range(start + worker_id * batch_size, stop, num_workers * batch_size):
        yield lo, min(lo + batch_size, stop)
