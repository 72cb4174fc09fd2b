"""Which rank this process is, and of how many: the one place that asks ``torch.distributed``."""

from __future__ import annotations

import os

import torch

from ..errors import ShardstreamError


def resolve_rank(
    rank: int | None = None, world_size: int | None = None, strict: bool = True
) -> tuple[int, int]:
    """(rank, world size): explicit values, else ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else 0/1.

    A launcher that sets ``WORLD_SIZE`` but not ``RANK`` (Lightning's: ``LOCAL_RANK`` and ``WORLD_SIZE``,
    the process group made later in ``trainer.fit``) leaves the rank unknown until the process group
    exists: ``strict`` raises then, otherwise (0, 1) stands in (never written into a pass).
    """
    dist = torch.distributed
    if rank is not None and world_size is not None:
        found_rank, found_world = int(rank), int(world_size)
    elif dist.is_available() and dist.is_initialized():
        found_rank, found_world = dist.get_rank(), dist.get_world_size()
    elif "RANK" in os.environ or int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        found_rank, found_world = (
            int(os.environ.get("RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)),
        )
    elif strict and rank is None:
        raise ShardstreamError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} but neither RANK nor a torch.distributed process group: "
            "this process's rank is not known yet (Lightning sets only LOCAL_RANK and WORLD_SIZE and makes the "
            "process group inside trainer.fit); iterate once the process group exists, or pass rank= and world_size="
        )
    else:
        found_rank, found_world = 0, 1
    rank = found_rank if rank is None else int(rank)
    world_size = found_world if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ShardstreamError(f"rank {rank} is not in [0, world size {world_size})")
    return rank, world_size


def reduce_device(backend: str) -> torch.device:
    """Where an integer the ranks reduce must live for ``backend``: a process group of NCCL alone takes
    CUDA tensors only (the current device); gloo, MPI and mixed groups (``"cpu:gloo,cuda:nccl"``) take
    CPU tensors."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(value: int, op: str) -> int:
    """``value``'s ``"max"`` or ``"min"`` over the ranks of the process group (``value`` itself without
    one): how ranks agree on a window's batch count or an epoch's version. One all-reduce of one
    integer, on a device the group's backend takes; every rank must call it at the same point."""
    dist = torch.distributed
    if not process_group_ready() or dist.get_world_size() == 1:
        return value
    ops = {"max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    tensor = torch.tensor([value], dtype=torch.int64, device=reduce_device(str(dist.get_backend())))
    dist.all_reduce(tensor, op=ops[op])
    return int(tensor.item())


def process_group_ready() -> bool:
    """Whether a ``torch.distributed`` process group exists in this process."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()
