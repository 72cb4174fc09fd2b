"""Batches shaped per window: read ``window`` samples, cut them into batches by a rule, agree on a count.

A shape that groups samples by what they hold (a bucket, a packed row) reads its dataset's loader
``window`` samples at a time: one loader batch, so every rank reads the same number of windows (the
plan's equal split) and every sample of the epoch lands in exactly one window. A subclass says how a
window becomes groups of samples (:meth:`WindowedBatches.plan`), how to make more groups of the same
samples (:meth:`WindowedBatches.fit`) and how a group becomes a batch (:meth:`WindowedBatches.make`).
The number of groups depends on what the samples hold, so under ``torch.distributed`` the ranks agree
on it with one ``all_reduce(MAX)`` of one integer per window and a rank that needs fewer makes more
(smaller) groups: every rank yields the same number of batches, and none waits for another in a
collective.

Resume: :meth:`WindowedBatches.state_dict` is the loader's state at the start of the current window
plus the batches handed out from it. On the same world size the window is read again and those
batches are skipped: exact. On another world size the interrupted window is cut anew and read whole
again, so the samples of the batches already handed out from it are read a second time (at most one
window per rank); a state saved at a window's end (``emitted`` 0) resumes exactly on any world size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...errors import UsageError
from ..ranks import agree
from ..shards.mapped import MappedBytes
from .collate import RaggedBytes, ragged_fields

WINDOW = "__window__"  # a window's samples, as :func:`window_of` ships them
_RAW = (bytes, bytearray, memoryview)


def _as_sent(samples: list[Any]) -> list[Any]:
    """Samples as they are, raw values as ``bytes`` (a ``memoryview`` into a shard cannot be pickled)."""
    return [
        {k: bytes(v) if isinstance(v, memoryview) else v for k, v in s.items()}
        if isinstance(s, dict)
        else s
        for s in samples
    ]


def window_of(samples: list[Any]) -> dict[str, Any]:
    """A window's samples, made for the trip from a DataLoader worker to the main process: dict samples
    with the same fields as columns, every field whose values are all raw bytes in one shared-memory
    arena (:func:`~shardstream.dataset.batches.collate.ragged_fields`: one copy, no pickling; the transport
    hands the main process views of it), other fields as lists; other samples as they are, raw values
    as ``bytes``. :func:`rows_of` gives the samples back."""
    names = samples[0].keys() if samples and isinstance(samples[0], dict) else None
    if names is None or any(not isinstance(s, dict) or s.keys() != names for s in samples):
        return {WINDOW: _as_sent(samples)}
    raw = [n for n in names if all(isinstance(s[n], _RAW) for s in samples)]
    columns: dict[str, Any] = dict(zip(raw, ragged_fields([[s[n] for s in samples] for n in raw])))
    for name in names:
        if name not in columns:
            columns[name] = [
                bytes(s[name]) if isinstance(s[name], memoryview) else s[name] for s in samples
            ]
    return {WINDOW: {"names": list(names), "count": len(samples), "columns": columns}}


class WindowRows(Sequence):
    """A window's samples from its columns: ``rows[i]`` is sample ``i`` as a dict (raw values as
    ``memoryview`` slices of the window's memory or of the shard files, no copy), made once when
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


def rows_of(window: Any) -> Any:
    """The samples of a window: one :func:`window_of` made, or a collated batch of the dataset's own (raw
    values as locations in the shard files, :class:`MappedBytes`), as a sequence; anything else as it is."""
    if not isinstance(window, dict):
        return window
    if WINDOW not in window:
        first = window["__key__"] if "__key__" in window else next(iter(window.values()), [])
        return WindowRows(list(window), len(first), window)
    sent = window[WINDOW]
    if isinstance(sent, list):
        return sent
    return WindowRows(sent["names"], sent["count"], sent["columns"])


class WindowResume:
    """The resume state of batches shaped per window of a loader's samples: the loader's state at the
    current window's start and the batches given from it (``_start``, ``_emitted``), skipped again on
    the same world size (``_skip``); on another world size the window is read again whole."""

    loader: Any
    dataset: Any
    _start: Any
    _emitted: int
    _skip: int

    def state_dict(self) -> dict[str, Any]:
        """Where to go on: the loader's state at the current window's start, and batches given from it."""
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


class WindowedBatches(WindowResume):
    """The base of the window-shaped batchers: the loader over windows, the count, the resume state."""

    def __init__(
        self,
        dataset: Any,
        window: int,
        num_workers: int | None,
        loader_kwargs: dict[str, Any],
        collate: Callable[[list[Any]], Any] | None = window_of,
    ):
        """``collate`` makes a window of its samples in the worker (picklable: :func:`window_of`, or
        what a shape computes there besides, such as each sample's bucket key); ``None`` keeps the
        dataset's own batches (a shape that reads raw batches of locations)."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise UsageError(f"window must be a number of samples (1 or more), not {window!r}")
        self.window = window
        if collate is window_of and dataset.mapped:
            collate = (
                None  # raw local tars: windows of locations in the shard files, nothing copied
            )
        if collate is not None:
            dataset.collate_fn = collate  # the loader hands over each window's samples as they are
        self.dataset = dataset
        self.loader = dataset.loader(window, num_workers, **loader_kwargs)
        self._start: dict[str, Any] = self.loader.state_dict()
        self._emitted = 0
        self._skip = 0

    # -- what a shape defines ---------------------------------------------------------------------
    def received(self, window: Any) -> Any:
        """What ``plan`` and ``make`` take of a window the loader gave (default: its samples)."""
        return rows_of(window)

    def plan(self, samples: Any) -> list[Any]:
        """The window's groups of sample indices, one batch each (``samples``: what ``collate`` made)."""
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
            window: Any = next(it, None)
            if window is None:
                break
            if start != self._start:
                self._start, self._emitted = start, 0
            window = self.received(window)
            groups = self.plan(window)
            groups = self.fit(groups, agree(len(groups), "max"))
            for k, group in enumerate(groups):
                if k >= self._skip:
                    self._emitted = k + 1
                    yield self.make(window, group)
            self._skip = 0
        self._start, self._emitted = self.loader.state_dict(), 0


__all__ = [
    "WINDOW",
    "WindowResume",
    "WindowRows",
    "WindowedBatches",
    "rows_of",
    "window_of",
]
