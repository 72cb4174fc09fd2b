"""Where a dataset is in its epoch, shared with its workers, and the resume state made from it.

Workers of a persistent DataLoader keep their copy of the dataset, so epoch, rank and resume
position travel through a small shared-memory block that the main process writes and every
worker reads at the start of each pass. The resume state (``state_dict()``) is a few integers
plus the epoch's unread segment; loading it with another world size splits that segment anew
(:func:`shardstream.plan.remaining`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import plan
from ..errors import ShardstreamError

STATE_VERSION = 1
MAX_INTERVALS = 4096  # segment intervals the block holds (enough for resizes to 4,096 ranks)


@dataclass(frozen=True)
class Position:
    """One pass's starting point: the epoch, this rank, and the segment still to read."""

    epoch: int
    rank: int
    world_size: int
    segment: list[tuple[int, int]]
    segment_world: int  # the world size the segment's spans are cut for
    consumed: int  # positions of this rank's span read already

    def span(self, drop_last: bool) -> tuple[int, int]:
        """[start, stop) of this rank's span, as indices into the (padded) segment."""
        return plan.rank_range(self.segment, self.segment_world, self.rank, drop_last)

    def remaining(self, drop_last: bool) -> int:
        start, stop = self.span(drop_last)
        return stop - start - self.consumed


class SharedPosition:
    """A :class:`Position` in shared memory: written by the main process, read by every worker.

    Layout: epoch, rank, world size, segment world size, consumed, interval count, intervals...
    """

    def __init__(self) -> None:
        self.block = torch.zeros(6 + 2 * MAX_INTERVALS, dtype=torch.int64).share_memory_()

    def set(self, p: Position) -> None:
        if len(p.segment) > MAX_INTERVALS:
            raise ShardstreamError(f"a resume state with {len(p.segment)} intervals is more than this reader holds")
        b = self.block
        b[:6] = torch.tensor([p.epoch, p.rank, p.world_size, p.segment_world, p.consumed, len(p.segment)])
        if p.segment:
            b[6 : 6 + 2 * len(p.segment)] = torch.tensor(np.asarray(p.segment, dtype=np.int64).reshape(-1))

    def get(self) -> Position:
        epoch, rank, world_size, segment_world, consumed, n = self.block[:6].tolist()
        flat = self.block[6 : 6 + 2 * n].tolist()
        segment = [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]
        return Position(epoch, rank, world_size, segment, segment_world, consumed)


def to_state(p: Position, seed: int, num_samples: int, drop_last: bool) -> dict[str, Any]:
    """The resume state of a pass starting at ``p``."""
    return {"version": STATE_VERSION, "epoch": p.epoch, "seed": seed, "num_samples": num_samples,
            "drop_last": drop_last, "segment": [list(iv) for iv in p.segment], "world_size": p.segment_world,
            "consumed": p.consumed}


def from_state(state: dict[str, Any], seed: int, num_samples: int, drop_last: bool, rank: int,
               world_size: int) -> Position:
    """The position ``state`` resumes at for this rank; refuses a state of other data, seed or drop_last."""
    if state.get("version") != STATE_VERSION:
        raise ShardstreamError(f"unknown resume state version {state.get('version')!r}")
    if state["num_samples"] != num_samples or state["seed"] != seed:
        raise ShardstreamError(
            f"the resume state is for {state['num_samples']} samples with seed {state['seed']}, this "
            f"dataset has {num_samples} with seed {seed}; resume with the same data and seed"
        )
    if bool(state["drop_last"]) != drop_last:
        raise ShardstreamError("the resume state was saved with a different drop_last")
    segment = [(int(a), int(b)) for a, b in state["segment"]]
    saved_world, consumed = int(state["world_size"]), int(state["consumed"])
    if saved_world != world_size:  # another world size: split what is left anew
        segment, saved_world, consumed = plan.remaining(segment, saved_world, consumed, drop_last), world_size, 0
    return Position(int(state["epoch"]), rank, world_size, segment, saved_world, consumed)
