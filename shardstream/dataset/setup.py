"""How a loader configures the dataset it reads: one frozen object, given through one call."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ..errors import ShardstreamError, UsageError


@dataclass(frozen=True)
class LoaderSetup:
    """How a loader wants the dataset's workers to make and hand over batches.

    Args:
        batch_size: samples per batch.
        batches_per_chunk: workers collate this many batches at once (the loader cuts them apart).
        seed_workers: reseed ``random``, ``numpy`` and ``torch`` before each batch that runs
            user code (see :mod:`shardstream.dataset.seeding`).
        sender: worker id -> that worker's transport (an object with a ``batch()`` context
            manager, as :class:`shardstream.loader.transport.Ring`), or ``None`` to return
            batches as they are.
        check_first_batch: called in each worker with the first batch of a pass, before it is
            sent (the loader's shared-memory check).
    """

    batch_size: int
    batches_per_chunk: int = 1
    seed_workers: bool = True
    sender: Callable[[int], Any] | None = None
    check_first_batch: Callable[[Any], None] | None = None
    # names the loader (new_token); 0: any reader
    token: int = dataclasses.field(default=0, compare=False)

    def check(self) -> None:
        if self.batch_size < 1 or self.batches_per_chunk < 1:
            raise UsageError(f"batch_size and batches_per_chunk must be at least 1, not {self}")

    def same_batches(self, other: LoaderSetup) -> bool:
        """Whether both make the same batches (they may differ in the transport alone)."""
        return dataclasses.replace(self, sender=None) == dataclasses.replace(other, sender=None)


def refuse_reconfiguration(current: LoaderSetup | None, new: LoaderSetup) -> None:
    """The loader reading a dataset may give it a new transport, never other batches (its resume state
    counts batches of the size it set)."""
    if current is not None and not current.same_batches(new):
        raise ShardstreamError(
            "a loader cannot change how its dataset makes batches once set (its len() and resume state "
            "count batches of that size); make a new loader"
        )


# Which loader reads now: in the main process a loader sets READING around each of its next() calls;
# its worker processes get their token from the loader's own worker_init_fn. A dataset configured by a
# loader refuses any other reader (a DataLoader a framework rebuilt from the loader's attributes), whose
# batches would be the loader's internal objects.
READING: ContextVar[int] = ContextVar("shardstream_reading", default=0)
_WORKER = {"token": 0}


def new_token() -> int:
    """A loader's token (from ``os.urandom``: making a loader draws nothing from the global RNG)."""
    return int.from_bytes(os.urandom(8), "little") | 1


def own_worker_init(token: int, user_fn: Any, worker_id: int) -> None:
    """A loader's worker_init_fn: marks this worker process as that loader's, then runs the user's."""
    _WORKER["token"] = token
    if user_fn is not None:
        user_fn(worker_id)


def reader_is(setup: LoaderSetup, in_worker: bool) -> bool:
    """Whether the DataLoader reading now is the loader that made ``setup`` (token 0: any reader is)."""
    return not setup.token or (_WORKER["token"] if in_worker else READING.get()) == setup.token


def refuse_foreign_reader(in_worker: bool) -> None:
    where = "in a worker process" if in_worker else "in the main process"
    raise ShardstreamError(
        f"this ShardDataset is configured by a ShardLoader but is being read by another DataLoader ({where}), "
        "for example one that accelerate's prepare() or a trainer rebuilt from the loader's attributes; it would "
        "get the loader's internal batches. Pass the ShardLoader itself (accelerate's prepare() returns it "
        "unchanged; Lightning uses it as it is), or give the other DataLoader its own ShardDataset"
    )
