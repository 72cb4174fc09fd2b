"""``ShardLoader``: the DataLoader ``ShardDataset.loader()`` builds, with resumable state.

Batches are collated in the workers (the dataset yields whole batches), so the
DataLoader itself runs with ``batch_size=None`` and only moves them. Its in-order
output is the rank's planned order for any ``num_workers``; ``state_dict()`` is a few
integers plus the epoch's remaining segment, and ``load_state_dict()`` continues with no
sample repeated or skipped, also with another ``num_workers`` or world size.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from .collate import collate, split
from .errors import ShardstreamError
from .transport import Receiver

if TYPE_CHECKING:
    from .dataset import ShardDataset


def default_num_workers() -> int:
    """min(4 x GPUs, CPU cores - 1), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return max(min(4 * gpus, cores - 1), 1)


def _as_is(batch: Any) -> Any:
    return batch


_CHUNK_BYTES = 8 << 20


def _batches_per_chunk(dataset: ShardDataset, batch_size: int, num_workers: int) -> int:
    """Raw-bytes batches are cheap to make and dear to send (a fixed cost per transfer), so
    workers send about 8 MB at a time and the loader cuts it back into batches; decoded
    batches are large already."""
    if num_workers == 0 or not dataset._raw or dataset._mapped or dataset.collate_fn is not collate:
        return 1  # mapped batches are a few kilobytes of locations: nothing to amortise
    m = dataset.manifest
    per_sample = max(m.total_bytes / max(m.num_samples, 1), 1)
    return int(min(max(_CHUNK_BYTES // (batch_size * per_sample), 1), 16))


class ShardLoader(DataLoader):
    """A DataLoader over a :class:`ShardDataset` that can save and restore its position."""

    def __init__(self, dataset: ShardDataset, batch_size: int, num_workers: int | None = None, **kwargs: Any):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        previous = dataset._loader() if dataset._loader is not None else None
        if previous is not None:
            raise ShardstreamError(
                "this ShardDataset already feeds a loader, whose batches and resume state depend on it; "
                "make another ShardDataset for a second loader (or drop the first one)"
            )
        dataset._loader = weakref.ref(self)
        dataset.batch_size = batch_size
        num_workers = default_num_workers() if num_workers is None else num_workers
        kwargs.setdefault("pin_memory", torch.cuda.is_available())
        kwargs.setdefault("collate_fn", _as_is)  # batches are collated in the dataset already
        if num_workers > 0:
            kwargs.setdefault("persistent_workers", True)
            kwargs.setdefault("prefetch_factor", 2)
        dataset.batches_per_chunk = _batches_per_chunk(dataset, batch_size, num_workers)
        self._receiver: Receiver | None = None
        if num_workers > 0 and not kwargs.get("pin_memory") and dataset.collate_fn is collate:
            dataset.ring_slots = (kwargs.get("prefetch_factor") or 2) + 2  # more arenas than batches in flight
            dataset._released = self._new_table(num_workers, dataset.ring_slots)
            self._receiver = Receiver(dataset._released)
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self.samples_per_batch = batch_size
        self._start: dict[str, Any] | None = None
        self._batches = 0

    def __len__(self) -> int:
        """Batches left in the current epoch on this rank."""
        return -(-self.dataset.remaining() // self.samples_per_batch)

    def __iter__(self) -> Iterator[Any]:
        self._start = self.dataset.state()
        self._generation = self.dataset.generation
        self._batches = 0
        per_chunk = self.dataset.batches_per_chunk
        receiver = self._receiver
        if receiver is not None and not (self.persistent_workers and self._iterator is not None):
            # new worker processes start their rings afresh, with a table of their own
            self.dataset._released = self._new_table(self.num_workers, self.dataset.ring_slots)
            receiver.reset(self.dataset._released)
        for chunk in super().__iter__():
            if receiver is not None:
                chunk = receiver.receive(chunk)
            for batch in split(chunk, self.samples_per_batch) if per_chunk > 1 else (chunk,):
                self._batches += 1
                yield batch
        self.dataset._reset(self._start["epoch"])  # a complete pass: the next one reads the whole epoch
        self._generation = self.dataset.generation  # ...but this pass's state stays what it was

    @staticmethod
    def _new_table(num_workers: int, slots: int) -> torch.Tensor:
        return torch.full((num_workers, slots), -1, dtype=torch.int64).share_memory_()

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is: epoch, seed, the epoch's segment and what it consumed of it."""
        if self._start is None or self._generation != self.dataset.generation:
            return self.dataset.state()  # not iterated since the epoch or position was set
        state = dict(self._start)
        span = self._span_length(state)
        state["consumed"] = min(state["consumed"] + self._batches * self.samples_per_batch, span)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration."""
        self.dataset.load_state(state)
        self._start = None
        self._batches = 0

    def _span_length(self, state: dict[str, Any]) -> int:
        from . import plan

        start, stop = plan.rank_range([tuple(iv) for iv in state["segment"]], state["world_size"],
                                      self.dataset.rank, self.dataset.drop_last)
        return stop - start
