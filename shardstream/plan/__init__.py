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

from .order import EpochOrder, batch_diversity, default_window
from .partition import per_rank, rank_range, span_bounds, worker_chunks
from .resume import remaining
from .segments import Intervals, segment_length, segment_positions

__all__ = [
    "EpochOrder",
    "Intervals",
    "batch_diversity",
    "default_window",
    "per_rank",
    "rank_range",
    "remaining",
    "segment_length",
    "segment_positions",
    "span_bounds",
    "worker_chunks",
]
