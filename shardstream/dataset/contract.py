"""The contract between a loader and what it reads: everything a loader may ask of a dataset.

A loader (:class:`shardstream.loader.ShardLoader`, and the statistics and ``bench`` built on it)
reads any object that has these members, and nothing else of it: no private names, no
``getattr`` probes. :class:`~shardstream.dataset.base.PlannedDataset` implements the planning,
resume and configure parts once; each dataset kind (``ShardDataset``, ``TokenDataset``,
``MixedDataset``) adds how it reads a pass and what its batches are. The values that cross the
contract are small frozen objects (:class:`WorkerSlot`, :class:`PassStart`), so what a pass
depends on is named, not implied.

A new dataset kind implements it by subclassing ``PlannedDataset`` and defining its reading
(see docs/design/layout.md for an example); anything that satisfies :class:`Readable`
works with the loader, the statistics and ``bench``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch.utils.data import get_worker_info

from .setup import LoaderSetup


@dataclass(frozen=True)
class WorkerSlot:
    """Which worker this is, of how many: a DataLoader worker process (``in_worker``), a reader thread of
    the main process (``in_thread``, see :mod:`shardstream.loader.threads`), or the main process itself,
    worker 0 of 1."""

    id: int = 0
    count: int = 1
    in_worker: bool = False
    in_thread: bool = False

    @classmethod
    def current(cls) -> WorkerSlot:
        """This thread's slot: the one :func:`reading_as` set, else this process's (from
        ``torch.utils.data.get_worker_info``)."""
        slot = getattr(_THREAD, "slot", None)
        if slot is not None:
            return slot
        info = get_worker_info()
        return cls() if info is None else cls(int(info.id), int(info.num_workers), True)


_THREAD = threading.local()


@contextlib.contextmanager
def reading_as(slot: WorkerSlot) -> Iterator[None]:
    """Within the block, this thread reads as worker ``slot`` (a reader thread of the main process)."""
    _THREAD.slot = slot
    try:
        yield
    finally:
        _THREAD.slot = None


@dataclass(frozen=True)
class PassStart:
    """Where a pass of the loader starts: the resume state there, the position's generation (bumped
    whenever the epoch or position is set), and the samples this rank reads in the pass."""

    state: dict[str, Any]
    generation: int
    samples: int


class Counters(Protocol):
    """Stage counters shared by every process reading a dataset (see :mod:`shardstream.dataset.counters`)."""

    def totals(self) -> dict[str, int]: ...

    def add(self, **counts: int) -> None: ...


@runtime_checkable
class Readable(Protocol):
    """What a loader may ask of a dataset it reads."""

    seed: int
    rank: int
    drop_last: bool

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    # -- what the loader sets itself up by -------------------------------------------------------
    @property
    def raw(self) -> bool: ...

    @property
    def mapped(self) -> bool: ...

    @property
    def replaces_failures(self) -> bool: ...

    @property
    def default_collate(self) -> bool: ...

    @property
    def seed_workers(self) -> bool: ...

    def worker_parts(self) -> dict[str, Any]: ...

    def threads_win(self, num_workers: int) -> bool: ...

    def batches_per_chunk(self, batch_size: int, num_workers: int) -> int: ...

    def cut_chunk(self, chunk: Any, size: int) -> list[Any]: ...

    def batch_bytes(self, samples: int) -> int: ...

    def configure(self, loader: object, setup: LoaderSetup) -> None: ...

    # -- passes, epochs and resume states --------------------------------------------------------
    @property
    def generation(self) -> int: ...

    def begin_pass(self) -> PassStart: ...

    def pass_state(self) -> dict[str, Any]: ...

    def span_length(self, state: dict[str, Any]) -> int: ...

    def reset(self, epoch: int | None = None) -> None: ...

    def set_epoch(self, epoch: int) -> None: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    # -- what happened ---------------------------------------------------------------------------
    @property
    def counters(self) -> Counters: ...

    @property
    def skipped(self) -> int: ...

    def describe(self, shard: int, sample: int) -> str: ...


__all__ = ["Counters", "PassStart", "Readable", "WorkerSlot"]
