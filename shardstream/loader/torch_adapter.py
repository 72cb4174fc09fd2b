"""Every private part of torch's DataLoader (and the one mark of accelerate's) the loader relies on, here
and nowhere else, each pinned by ``tests/loader/test_torch_adapter.py``, which fails naming the part when a
torch release changes it.

Why each is needed: torch has no public way to give an ``IterableDataset`` loader a sampler with
``set_epoch`` (trainers call ``loader.sampler.set_epoch``), to run its workers' loop with another error
wrapper (an error of ours arrives as its one line), to feed its single-process iterator from reader threads,
or to stop a pass's workers at once after an error.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _InfiniteConstantSampler

# the module of torch's worker loop, whose global ExceptionWrapper wraps what a worker raises
WORKER_LOOP = "torch.utils.data._utils.worker"


class InfiniteSampler(_InfiniteConstantSampler):
    """The sampler torch gives a loader of an ``IterableDataset`` (``None`` forever), to extend."""


class AdaptedDataLoader(DataLoader):
    """torch's DataLoader with the private hooks a loader needs named as methods of its own."""

    # accelerate's prepare() returns a loader marked so unchanged (prepare_data_loader): this loader shards
    # by rank itself, and a DataLoader rebuilt from its attributes would not
    _is_accelerate_prepared = True

    def _get_iterator(self) -> Any:
        return self.new_iterator()

    def new_iterator(self) -> Any:
        """The iterator of a pass (torch calls it once per pass, or once for persistent workers)."""
        return self.torch_iterator()

    def torch_iterator(self) -> Any:
        """torch's own iterator of a pass."""
        return super()._get_iterator()

    def set_sampler(self, sampler: Any) -> None:
        """Give the loader ``sampler`` (torch refuses a sampler for an IterableDataset)."""
        object.__setattr__(self, "sampler", sampler)

    def has_workers_running(self) -> bool:
        """Whether persistent workers from an earlier pass are kept (the next pass reuses them)."""
        return self.__dict__.get("_iterator") is not None

    def stop_workers(self) -> None:
        """Stop the current pass's workers now (the next pass starts new ones)."""
        it = self.__dict__.get("_iterator")
        if it is None:
            return
        object.__setattr__(self, "_iterator", None)
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()


def read_from(iterator: Any, items: Iterable[Any]) -> Any:
    """torch's single-process ``iterator``, which has not started, made to hand out ``items`` (what reader
    threads read) instead of iterating the dataset itself."""
    iterator._dataset_fetcher.dataset_iter = iter(items)
    return iterator


def wrap_worker_errors(wrapper: type[ExceptionWrapper]) -> None:
    """In a worker process: torch's worker loop wraps the exceptions it sends with ``wrapper``."""
    module = sys.modules.get(WORKER_LOOP)
    if module is not None and getattr(module, "ExceptionWrapper", None) is ExceptionWrapper:
        module.ExceptionWrapper = wrapper  # type: ignore[attr-defined]


__all__ = [
    "WORKER_LOOP",
    "AdaptedDataLoader",
    "ExceptionWrapper",
    "InfiniteSampler",
    "read_from",
    "wrap_worker_errors",
]
