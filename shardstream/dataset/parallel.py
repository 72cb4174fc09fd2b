"""``Parallel``: which data-parallel group this process reads for, under tensor, context or pipeline
parallelism.

Under model parallelism several processes train on the same batch: the members of one tensor-,
context- or pipeline-parallel group must read identical batches, and only the data-parallel groups
split the data. A dataset given ``parallel=Parallel(dp_rank, dp_size)`` plans for ``dp_size`` ranks
and reads the part of rank ``dp_rank``, whatever the global rank of the process is; its resume state
is the same few integers, so it resumes on any other data-parallel size like any dataset.
:meth:`Parallel.from_mesh` takes both numbers from a ``torch.distributed.device_mesh.DeviceMesh``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from .ranks import process_group_ready


@dataclass(frozen=True)
class Parallel:
    """This process's data-parallel coordinates: its rank among the ``dp_size`` data-parallel groups.

    Processes with the same ``dp_rank`` (the tensor/context/pipeline-parallel members of one
    data-parallel group) read identical batches; different ``dp_rank`` read disjoint parts.

    Args:
        dp_rank: this process's data-parallel rank, 0 to ``dp_size - 1``.
        dp_size: the number of data-parallel groups (the data is split this many ways).
    """

    dp_rank: int
    dp_size: int

    def __post_init__(self) -> None:
        for name in ("dp_rank", "dp_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"Parallel's {name} must be an int, not {value!r}")
        if self.dp_size < 1 or not 0 <= self.dp_rank < self.dp_size:
            raise UsageError(
                f"Parallel(dp_rank={self.dp_rank}, dp_size={self.dp_size}): dp_rank must be in "
                f"[0, dp_size) and dp_size at least 1"
            )

    @classmethod
    def from_mesh(cls, mesh: Any, dp: str | tuple[str, ...] = "dp") -> Parallel:
        """The data-parallel coordinates of this process in ``mesh`` (a ``DeviceMesh``), whose
        data-parallel dimension is named ``dp`` (several names: their flattened product, in order,
        e.g. ``("dp_replicate", "dp_shard")`` under HSDP)."""
        names = (dp,) if isinstance(dp, str) else tuple(dp)
        known = tuple(getattr(mesh, "mesh_dim_names", None) or ())
        missing = [n for n in names if n not in known]
        if missing:
            raise UsageError(
                f"the device mesh has no dimension {missing[0]!r} (its dimensions: {list(known)}); "
                "name its data-parallel dimension with dp= (init_device_mesh(..., mesh_dim_names=...))"
            )
        rank, size = 0, 1
        for name in names:  # row-major: the first name varies slowest
            rank = rank * mesh.size(known.index(name)) + mesh.get_local_rank(name)
            size *= mesh.size(known.index(name))
        return cls(int(rank), int(size))

    def check_world(self) -> None:
        """Refuse a data-parallel size that cannot split the process group (where one exists)."""
        if not process_group_ready():
            return
        import torch.distributed as dist

        world = dist.get_world_size()
        if self.dp_size > world or world % self.dp_size:
            raise UsageError(
                f"Parallel(dp_size={self.dp_size}) does not divide the {world} processes of the process "
                "group: dp_size is the number of data-parallel groups (world size / (tensor x context x "
                "pipeline parallel size)); Parallel.from_mesh(mesh) takes it from the device mesh"
            )


def resolve_parallel(
    parallel: Parallel | None, rank: int | None, world_size: int | None
) -> tuple[int | None, int | None]:
    """(rank, world size) to plan for: the data-parallel ones of ``parallel`` where given (then rank and
    world_size must not be given as well), else the explicit ones."""
    if parallel is None:
        return rank, world_size
    if not isinstance(parallel, Parallel):
        raise UsageError(
            f"parallel= takes a shardstream.Parallel, not a {type(parallel).__name__}: "
            "Parallel(dp_rank=..., dp_size=...) or Parallel.from_mesh(mesh)"
        )
    if rank is not None or world_size is not None:
        raise UsageError(
            "give either parallel= or rank=/world_size=, not both: parallel= says the data-parallel "
            "rank and size that the dataset splits its data by"
        )
    return parallel.dp_rank, parallel.dp_size


__all__ = ["Parallel", "resolve_parallel"]
