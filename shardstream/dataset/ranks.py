"""Which rank this process is, and of how many: the one place that asks ``torch.distributed``."""

from __future__ import annotations

import os

import torch

from ..errors import ShardstreamError


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world size): explicit values, else ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else 0/1."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        found_rank, found_world = dist.get_rank(), dist.get_world_size()
    else:
        found_rank, found_world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    rank = found_rank if rank is None else int(rank)
    world_size = found_world if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ShardstreamError(f"rank {rank} is not in [0, world size {world_size})")
    return rank, world_size
