"""Batches shaped per pool: read ``window`` samples, cut them into batches by a rule, agree on a count.

A shape that groups samples by what they hold (a bucket, a packed row) reads its dataset's loader
``window`` samples at a time: one loader batch, so every rank reads the same number of pools (the
plan's equal split) and every sample of the epoch lands in exactly one pool. A subclass says how a
pool becomes groups of samples (:meth:`PooledBatches.plan`), how to make more groups of the same
samples (:meth:`PooledBatches.fit`) and how a group becomes a batch (:meth:`PooledBatches.make`).
The number of groups depends on what the samples hold, so under ``torch.distributed`` the ranks agree
on it with one ``all_reduce(MAX)`` of one integer per pool and a rank that needs fewer makes more
(smaller) groups: every rank yields the same number of batches, and none waits for another in a
collective.

Resume: :meth:`PooledBatches.state_dict` is the loader's state at the start of the current pool
plus the batches handed out from it. On the same world size the pool is read again and those
batches are skipped: exact. On another world size the interrupted pool is cut anew and read whole
again, so the samples of the batches already handed out from it are read a second time (at most one
pool per rank); a state saved at a pool's end (``emitted`` 0) resumes exactly on any world size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...errors import UsageError
from ..ranks import agree
from ..shards.mapped import MappedBytes
from .collate import RaggedBytes, ragged_fields

POOL = "__pool__"  # a pool's samples, as :func:`pool_of` ships them
_RAW = (bytes, bytearray, memoryview)


def _as_sent(samples: list[Any]) -> list[Any]:
    """Samples as they are, raw values as ``bytes`` (a ``memoryview`` into a shard cannot be pickled)."""
    return [
        {k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()}
        if isinstance(s, dict)
        else s
        for s in samples
    ]


def pool_of(samples: list[Any]) -> dict[str, Any]:
    """A pool's samples, made for the trip from a DataLoader worker to the main process: dict samples
    with the same fields as columns, every field whose values are all raw bytes in one shared-memory
    arena (:func:`~shardstream.dataset.batches.collate.ragged_fields`: one copy, no pickling; the transport
    hands the main process views of it), other fields as lists; other samples as they are, raw values
    as ``bytes``. :func:`pool_samples` gives the samples back."""
    names = samples[0].keys() if samples and isinstance(samples[0], dict) else None
    if names is None or any(not isinstance(s, dict) or s.keys() != names for s in samples):
        return {POOL: _as_sent(samples)}
    raw = [n for n in names if all(isinstance(s[n], _RAW) for s in samples)]
    columns: dict[str, Any] = dict(zip(raw, ragged_fields([[s[n] for s in samples] for n in raw])))
    for name in names:
        if name not in columns:
            columns[name] = [
                bytes(s[name]) if isinstance(s[name], memoryview) else s[name] for s in samples
            ]
    return {POOL: {"names": list(names), "count": len(samples), "columns": columns}}


class PoolRows(Sequence):
    """A pool's samples from its columns: ``rows[i]`` is sample ``i`` as a dict (raw values as
    ``memoryview`` slices of the pool's memory or of the shard files, no copy), made once when
    first asked for."""

    def __init__(self, names: list[str], count: int, columns: dict[str, Any]):
        self.names, self.count = names, count
        self.columns = {
            name: _RaggedViews(c)
            if isinstance(c, RaggedBytes)
            else _MappedViews(c)
            if isinstance(c, MappedBytes)
            else c
            for name, c in columns.items()
        }
        self._rows: list[dict[str, Any] | None] = [None] * count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.count))]
        row = self._rows[i]
        if row is None:
            row = self._rows[i] = {name: self.columns[name][i] for name in self.names}
        return row


class _RaggedViews:
    """``values[i]``: the i-th value of a :class:`RaggedBytes` as a memoryview of its memory."""

    def __init__(self, ragged: RaggedBytes):
        self.flat = memoryview(ragged.data.numpy()).cast("B")
        self.bounds = ragged.offsets.tolist()  # into ``data``

    def __getitem__(self, i: int) -> memoryview:
        return self.flat[self.bounds[i] : self.bounds[i + 1]]


class _MappedViews:
    """``values[i]``: the i-th value of a :class:`MappedBytes` (a location in a shard file), in place."""

    def __init__(self, mapped: MappedBytes):
        self.view = mapped.view

    def __getitem__(self, i: int) -> memoryview:
        return self.view(i)


def pool_samples(pool: Any) -> Any:
    """The samples of a pool: one :func:`pool_of` made, or a collated batch of the dataset's own (raw
    values as locations in the shard files, :class:`MappedBytes`), as a sequence; anything else as it is."""
    if not isinstance(pool, dict):
        return pool
    if POOL not in pool:
        first = pool["__key__"] if "__key__" in pool else next(iter(pool.values()), [])
        return PoolRows(list(pool), len(first), pool)
    sent = pool[POOL]
    if isinstance(sent, list):
        return sent
    return PoolRows(sent["names"], sent["count"], sent["columns"])


class PoolResume:
    """The resume state of batches shaped per pool of a loader's samples: the loader's state at the
    current pool's start and the batches given from it (``_start``, ``_emitted``), skipped again on
    the same world size (``_skip``); on another world size the pool is read again whole."""

    loader: Any
    dataset: Any
    _start: Any
    _emitted: int
    _skip: int

    def state_dict(self) -> dict[str, Any]:
        """Where to go on: the loader's state at the current pool's start, and batches given from it."""
        return {
            "loader": self._start,
            "emitted": self._emitted,
            "world_size": self.dataset.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see the module's notes for another world size)."""
        self.loader.load_state_dict(state["loader"])
        self._start = self.loader.state_dict()
        same_world = state.get("world_size") == self.dataset.world_size
        self._skip = self._emitted = int(state["emitted"]) if same_world else 0


class PooledBatches(PoolResume):
    """The base of the pool-shaped batchers: the loader over pools, the count, the resume state."""

    def __init__(
        self,
        dataset: Any,
        window: int,
        num_workers: int | None,
        loader_kwargs: dict[str, Any],
        collate: Callable[[list[Any]], Any] | None = pool_of,
    ):
        """``collate`` makes a pool of its samples in the worker (picklable: :func:`pool_of`, or
        what a shape computes there besides, such as each sample's bucket key); ``None`` keeps the
        dataset's own batches (a shape that reads raw batches of locations)."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise UsageError(f"window must be a number of samples (1 or more), not {window!r}")
        self.window = window
        if collate is pool_of and dataset.mapped:
            collate = None  # raw local tars: pools of locations in the shard files, nothing copied
        if collate is not None:
            dataset.collate_fn = collate  # the loader hands over each pool's samples as they are
        self.dataset = dataset
        self.loader = dataset.loader(window, num_workers, **loader_kwargs)
        self._start: dict[str, Any] = self.loader.state_dict()
        self._emitted = 0
        self._skip = 0

    # -- what a shape defines ---------------------------------------------------------------------
    def received(self, pool: Any) -> Any:
        """What ``plan`` and ``make`` take of a pool the loader gave (default: its samples)."""
        return pool_samples(pool)

    def plan(self, samples: Any) -> list[Any]:
        """The pool's groups of sample indices, one batch each (``samples``: what ``collate`` made)."""
        raise NotImplementedError

    def fit(self, groups: list[Any], count: int) -> list[Any]:
        """Exactly ``count`` groups of the same samples (``count`` >= ``len(groups)``)."""
        raise NotImplementedError

    def make(self, samples: Any, group: Any) -> Any:
        """The batch of one group."""
        raise NotImplementedError

    # -- epochs, passes and resume states ---------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        while True:
            start = self.loader.state_dict()
            pool: Any = next(it, None)
            if pool is None:
                break
            if start != self._start:
                self._start, self._emitted = start, 0
            pool = self.received(pool)
            groups = self.plan(pool)
            groups = self.fit(groups, agree(len(groups), "max"))
            for k, group in enumerate(groups):
                if k >= self._skip:
                    self._emitted = k + 1
                    yield self.make(pool, group)
            self._skip = 0
        self._start, self._emitted = self.loader.state_dict(), 0


__all__ = [
    "POOL",
    "PoolResume",
    "PoolRows",
    "PooledBatches",
    "pool_samples",
    "pool_of",
]
