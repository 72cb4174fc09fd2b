"""How a loader configures the dataset it reads: one frozen object, given through one call."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ShardstreamError

# What a loader's batches and resume state depend on: refused once a loader reads the dataset.
SETTINGS = frozenset({"shuffle", "seed", "window", "decoder", "transform", "drop_last", "batch_size", "collate_fn",
                      "on_error", "seed_workers", "verify_checksums"})
# Fixed when the dataset is made (its storage, and what it read from there).
FIXED = frozenset({"store", "manifest", "storage", "disk_cache", "prefetch", "counts"})


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

    def check(self) -> None:
        if self.batch_size < 1 or self.batches_per_chunk < 1:
            raise ValueError(f"batch_size and batches_per_chunk must be at least 1, not {self}")

    def same_batches(self, other: LoaderSetup) -> bool:
        """Whether both make the same batches (they may differ in the transport alone)."""
        return dataclasses.replace(self, sender=None) == dataclasses.replace(other, sender=None)


def refuse_change(name: str, reading: bool) -> None:
    """Raise if ``name`` may not be set now (``reading``: a loader reads the dataset)."""
    if name in FIXED:
        raise ShardstreamError(f"{name!r} of a ShardDataset is fixed when it is made; make a new ShardDataset "
                               "with the storage settings you want")
    if reading and name in SETTINGS:
        raise ShardstreamError(
            f"cannot set {name!r} of a ShardDataset that a loader reads: that loader's batches and resume "
            f"state depend on it; make a new ShardDataset (and loader) with the setting you want")


def refuse_reconfiguration(current: LoaderSetup | None, new: LoaderSetup) -> None:
    """The loader reading a dataset may give it a new transport, never other batches (its resume state
    counts batches of the size it set)."""
    if current is not None and not current.same_batches(new):
        raise ShardstreamError(
            "a loader cannot change how its dataset makes batches once set (its len() and resume state "
            "count batches of that size); make a new loader")
