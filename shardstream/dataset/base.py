"""``PlannedDataset``: what every dataset kind shares, written once.

A dataset kind says how many samples an epoch has, what fixes their order, and how one pass
reads them (:meth:`PlannedDataset.read_pass`); this base does the rest of the
:class:`~shardstream.dataset.contract.Readable` contract: the loader's one configuring call, the
epoch and resume position shared with the workers (:mod:`.state`), where a pass starts in this
process, the progress a foreign DataLoader (a StatefulDataLoader) keeps, the worker's transport,
the first-batch check and per-batch reseeding. Settings a loader's batches depend on refuse
changes while a loader reads the dataset, as a DataLoader refuses changes once iterating.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from .. import plan
from ..errors import ShardstreamError
from .contract import Counters, PassStart, WorkerSlot
from .parallel import Parallel, resolve_parallel
from .ranks import process_group_ready, resolve_rank
from .seeding import seed_batch
from .setup import LoaderSetup, reader_is, refuse_foreign_reader, refuse_reconfiguration
from .state import (
    OrderKey,
    Position,
    SharedPosition,
    loaded_position,
    next_epoch,
    progress_state,
    to_state,
)


@dataclass(frozen=True)
class ReadSettings:
    """The settings a dataset's batches and resume state depend on, as one frozen value. A dataset holds
    one and replaces it whole when a setting changes, which is refused while a loader reads the dataset
    (as a DataLoader refuses changes to its settings once iterating)."""

    shuffle: bool = True
    seed: int = 0
    window: int = 1
    drop_last: bool = False
    batch_size: int | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    seed_workers: bool = True
    verify_checksums: bool = False
    decoder: Any = None
    transform: Callable[[dict[str, Any]], Any] | None = None
    on_error: str = "raise"


class Setting:
    """A dataset's setting: a field of its :class:`ReadSettings`, settable until a loader reads it."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj._settings, self.name)

    def __set__(self, obj: PlannedDataset, value: Any) -> None:
        obj._change(**{self.name: value})


class Fixed:
    """What a dataset was made with (its storage, what it read there): read-only, and a set is refused
    with the fix (decorates the getter, as ``property`` does)."""

    def __init__(self, get: Callable[[Any], Any]):
        self.get, self.__doc__ = get, get.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else self.get(obj)

    def __set__(self, obj: Any, value: Any) -> None:
        kind = type(obj).__name__
        raise ShardstreamError(
            f"{self.name!r} of a {kind} is fixed when it is made; make a new {kind} with the storage "
            "settings you want"
        )


class ProcessLocal(threading.local):
    """What one process (one reader thread, each its own) holds of a dataset, never pickled into another:
    its open shards, its worker transport, the progress of a pass a foreign DataLoader read here, and a
    resume state loaded into this worker (applied to its next pass)."""

    def __init__(self) -> None:
        self.shards: Any = None  # (verify_checksums it was opened with, the open shards)
        self.sender: tuple[Any, Any] | None = (
            None  # (the loader's sender factory, this worker's transport)
        )
        self.progress: dict[str, Any] | None = None
        self.loaded: tuple[int, Position, int] | None = (
            None  # (generation, position, chunks to skip)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return ProcessLocal, ()  # what it holds stays here: another process starts with nothing


class Emitter:
    """Hands out a pass's batches: made inside the worker's transport when it has one (so their tensors
    are allocated in its arena), and the first checked before it leaves (the loader's /dev/shm check)."""

    def __init__(self, sender: Any, check: Callable[[Any], None] | None):
        self.sender, self.check = sender, check

    def checked(self, batch: Any) -> Any:
        if self.check is not None:
            check, self.check = self.check, None
            check(batch)
        return batch

    def __call__(self, make: Callable[[], Any], ship: bool = True) -> Any:
        """The batch ``make()`` returns, checked, and shipped through the transport when ``ship``."""
        if self.sender is None or not ship:
            return self.checked(make())
        # the batch is allocated in the transport's arena inside this block
        with self.sender.batch() as send:
            shipment = send(self.checked(make()))
        return shipment  # outside the block: its allocator must not stay active while the generator waits


@dataclass(frozen=True)
class PassRun:
    """One pass in one process: where it starts, this rank's span of the segment, samples per chunk
    (a worker's unit), this worker's slot and chunks to skip, how batches leave, and whether each is
    reseeded (the epoch and seed it is reseeded from)."""

    position: Position
    span: tuple[int, int]
    chunk: int
    slot: WorkerSlot
    skip: int
    emit: Emitter
    reseed: bool
    seed: int

    def chunks(self) -> Iterator[tuple[int, int]]:
        """This worker's chunks of the rank's span, as [lo, hi) into the segment, the skipped ones left out."""
        chunks = plan.worker_chunks(
            self.span, self.chunk, self.slot.count, self.slot.id, self.position.consumed
        )
        for n, bounds in enumerate(chunks):
            if n >= self.skip:
                yield bounds

    def positions(self) -> Iterator[np.ndarray]:
        """This worker's chunks as positions in the epoch's order (what the plan's order maps to samples);
        a segment's padding repeats the epoch's first positions."""
        for lo, hi in self.chunks():
            yield plan.segment_positions(self.position.segment, np.arange(lo, hi))

    def reseed_for(self, position: int) -> None:
        """Reseed ``random``, ``numpy`` and ``torch`` for the batch whose first sample is at ``position``."""
        if self.reseed:
            seed_batch(self.seed, self.position.epoch, position)


class PlannedDataset(IterableDataset):
    """The base of every dataset kind: the plan's epochs and resume states, the loader's configuration.

    A subclass sets its settings, then calls :meth:`_start_planning`; it defines
    :attr:`num_samples`, :attr:`fingerprint` and :meth:`read_pass`, and the contract's members about
    its batches (:attr:`raw`, :attr:`mapped`, :meth:`batch_bytes`, :attr:`counters`, ...).
    """

    _settings = ReadSettings()  # replaced whole by _change
    _loader: Callable[[], Any] | None = None  # a weak reference to the loader that reads it
    shuffle = Setting()
    seed = Setting()
    window = Setting()
    drop_last = Setting()
    collate_fn = Setting()
    rank: int
    world_size: int
    epoch: int

    def _start_planning(
        self,
        rank: int | None,
        world_size: int | None,
        batch_size: int | None,
        parallel: Parallel | None = None,
    ) -> None:
        """The reading state every dataset starts with (at the end of a subclass's ``__init__``);
        ``parallel`` plans for the data-parallel groups instead of the processes."""
        rank, world_size = resolve_parallel(parallel, rank, world_size)
        self.parallel = parallel
        # without a loader's setup: reseed per batch (see shardstream.dataset.seeding)
        self._change(batch_size=batch_size, seed_workers=True)
        # set by the loader that reads this dataset (configure)
        self._setup: LoaderSetup | None = None
        self._explicit_rank = (rank, world_size)
        # provisional: see begin_pass
        self.rank, self.world_size = resolve_rank(rank, world_size, strict=False)
        self.epoch = 0
        self._position = SharedPosition()
        self._local = ProcessLocal()
        self._order_fingerprint: str | None = None
        self.reset(0)

    # -- what a subclass defines ------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Samples of one epoch in the plan (before the split over ranks)."""
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        """What the epoch's samples are (a resume state saved on another dataset is refused by it)."""
        raise NotImplementedError

    def read_pass(self, run: PassRun) -> Iterator[Any]:
        """This process's samples or batches of one pass, in the plan's order."""
        raise NotImplementedError

    def worker_parts(self) -> dict[str, Any]:
        """The user's code that DataLoader workers run, by a label for messages ("the transform")."""
        return {} if self.default_collate else {"the dataset's collate_fn": self.collate_fn}

    @property
    def raw(self) -> bool:
        """Batches hold stored bytes, undecoded and untransformed."""
        return False

    @property
    def mapped(self) -> bool:
        """Batches are locations in local shard files (a few kilobytes whatever the samples' size)."""
        return False

    @property
    def replaces_failures(self) -> bool:
        """A sample that fails is replaced by the reading process's last good one (``on_error="skip"``):
        the stand-in is kept per process, so reader threads would make it depend on timing."""
        return False

    @property
    def default_collate(self) -> bool:
        """Batches are made by :func:`shardstream.dataset.batches.collate.collate` (which a transport sends cheaply)."""
        raise NotImplementedError

    def threads_win(self, num_workers: int) -> bool:
        """Whether ``num_workers`` reader threads read this faster than as many worker processes (what
        ``workers="auto"`` reads with): batches of stored bytes with no user code in them (no decoder,
        transform or collate_fn of the user's). Local tars' batches are locations, which a thread hands
        over without pickling or shared memory (measured 2-4x the samples/s of worker processes, a first
        batch in a third of the time); remote shards and compressed tars are read and decompressed
        outside the GIL (one thread against one process on SeaweedFS: a first batch in 0.14-0.16 s
        against 0.30-0.68 s, 1.1-1.3x the samples/s). Decoding was about even on 2 cores, and a user's
        Python code holds the GIL: processes."""
        return bool(self.mapped or (self.raw and self.default_collate))

    def batches_per_chunk(self, batch_size: int, num_workers: int) -> int:
        """Batches a worker makes and sends at once (the loader cuts them apart with :meth:`cut_chunk`)."""
        return 1

    def cut_chunk(self, chunk: Any, size: int) -> list[Any]:
        """A chunk of several batches cut into batches of ``size``."""
        from .batches.collate import cut_batch

        return cut_batch(chunk, size)

    def batch_bytes(self, samples: int) -> int:
        """Bytes ``samples`` stored samples take, from the manifest (a batch's size, before decoding)."""
        raise NotImplementedError

    @property
    def counters(self) -> Counters:
        """The stage counters every process reading this dataset adds to."""
        raise NotImplementedError

    @property
    def skipped(self) -> int:
        """Samples replaced under ``on_error="skip"``, in this process and its workers together."""
        raise NotImplementedError

    def describe(self, shard: int, sample: int) -> str:
        """Sample ``sample`` of shard ``shard``, named for a person ("<url>: sample at position 3 in
        the shard")."""
        raise NotImplementedError

    # -- settings, and the loader's one configuring call ------------------------------------------
    @property
    def settings(self) -> ReadSettings:
        """The settings its batches and resume state depend on (each is also an attribute)."""
        return self._settings

    def _change(self, **values: Any) -> None:
        """Replace settings; refused while a loader reads this dataset (its batches and resume state
        depend on them)."""
        if self._reading():
            name, kind = next(iter(values)), type(self).__name__
            raise ShardstreamError(
                f"cannot set {name!r} of a {kind} that a loader reads: that loader's batches and resume "
                f"state depend on it; make a new {kind} (and loader) with the setting you want"
            )
        self._settings = dataclasses.replace(self._settings, **values)

    def _reading(self) -> bool:
        """Whether a loader reads this dataset now (in the process that made the loader)."""
        return self._loader is not None and self._loader() is not None

    @property
    def batch_size(self) -> int | None:
        """Samples per batch it yields: its loader's while one reads it, else its own (``None``: samples),
        so that a dataset whose loader is gone yields samples to a plain DataLoader again."""
        setup = self._current_setup()
        return self._settings.batch_size if setup is None else setup.batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self._change(batch_size=value)

    @property
    def seed_workers(self) -> bool:
        """Workers reseed ``random``, ``numpy`` and ``torch`` per batch (the loader's setting, if one reads)."""
        setup = self._current_setup()
        return self._settings.seed_workers if setup is None else setup.seed_workers

    @seed_workers.setter
    def seed_workers(self, value: bool) -> None:
        self._change(seed_workers=value)

    def configure(self, loader: object, setup: LoaderSetup) -> None:
        """Let ``loader`` read this dataset with ``setup``: refused while another loader reads it; the
        same loader may give it a new transport (``sender``) later, never other batches."""
        setup.check()
        current = self._loader() if self._loader is not None else None
        if current is not None and current is not loader:
            raise ShardstreamError(
                f"this {type(self).__name__} already feeds a loader, whose batches and resume state depend on "
                f"it; make another {type(self).__name__} for a second loader (or drop the first one)"
            )
        refuse_reconfiguration(self._setup if current is loader else None, setup)
        self._setup = setup
        self._loader = weakref.ref(loader)

    def _current_setup(self) -> LoaderSetup | None:
        """The setup of the loader that reads this dataset, if it still does. In a worker (which got
        the dataset pickled, without the loader) it is the setup the loader gave."""
        if self._setup is None or (self._loader is not None and self._loader() is None):
            return None
        return self._setup

    @property
    def setup(self) -> LoaderSetup:
        """How batches are made now: the loader's setup, or one from this dataset's own settings."""
        return self._current_setup() or LoaderSetup(
            batch_size=self.batch_size or 1, seed_workers=self._settings.seed_workers
        )

    def loader(
        self, batch_size: int, num_workers: int | None = None, **dataloader_kwargs: Any
    ) -> Any:
        """A :class:`~shardstream.loader.ShardLoader` over this dataset: a DataLoader whose
        in-order output is this rank's planned order, with ``state_dict()``."""
        # by name, like fsspec's registry: the dataset stage never imports the loader stage above it
        loader_class = importlib.import_module("shardstream.loader").ShardLoader
        return loader_class(self, batch_size, num_workers, **dataloader_kwargs)

    # -- the epoch and resume position (main process) ---------------------------------------------
    def order_key(self) -> OrderKey:
        """What fixes the epoch's order and each rank's part of it (a resume state must match it);
        the fingerprint is computed once, on the first resume state."""
        if self._order_fingerprint is None:
            self._order_fingerprint = self.fingerprint
        return OrderKey(
            self.seed,
            self.num_samples,
            self.drop_last,
            self.shuffle,
            self.window,
            self._order_fingerprint,
            self.dataset_version,
        )

    @property
    def dataset_version(self) -> int | None:
        """The version of the one dataset this reads (``None``: several, or none with versions)."""
        return None

    @property
    def generation(self) -> int:
        """Bumped whenever the epoch or resume position is set (shared with the workers)."""
        return self._position.generation

    def reset(self, epoch: int | None = None) -> None:
        """Start epoch ``epoch`` (default: the current one) from its beginning."""
        self.rank, self.world_size = resolve_rank(*self._explicit_rank, strict=False)
        self.epoch = self.epoch if epoch is None else int(epoch)
        self._local.progress = None  # a pass read here before belongs to the position replaced
        self._position.set(
            Position(
                self.epoch, self.rank, self.world_size, [(0, self.num_samples)], self.world_size, 0
            )
        )

    def _fresh(self, p: Position) -> bool:
        return p.segment == [(0, self.num_samples)] and p.consumed == 0

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (a resumed position in that same epoch is kept; one in another epoch is
        dropped with a warning)."""
        p = self._position.get()
        fresh = self._fresh(p)
        if epoch != p.epoch and not fresh:
            warnings.warn(
                f"set_epoch({epoch}) drops the resume position loaded for epoch {p.epoch} "
                f"({p.remaining(self.drop_last)} samples of it still unread on this rank)",
                stacklevel=2,
            )
        if epoch != p.epoch or fresh:
            self.reset(epoch)

    def _resolve_rank(self) -> Position:
        """Resolve rank and world size now (a pass starts): a segment cut for another world size is split anew."""
        if self.parallel is not None:
            self.parallel.check_world()
        rank, world = resolve_rank(*self._explicit_rank, strict=True)
        self.rank, self.world_size = rank, world
        p = self._position.get()
        if world != p.segment_world:
            segment = plan.remaining(p.segment, p.segment_world, p.consumed, self.drop_last)
            p = Position(p.epoch, rank, world, segment, world, 0)
            self._position.set(p)
        elif (rank, world) != (p.rank, p.world_size):
            p = dataclasses.replace(p, rank=rank, world_size=world)
            self._position.set(p, bump=False)
        return p

    def begin_pass(self) -> PassStart:
        """A loader's pass starts (main process): rank and world size resolved now; where it starts."""
        p = self._resolve_rank()
        return PassStart(
            to_state(p, self.order_key()), self.generation, p.remaining(self.drop_last)
        )

    def __len__(self) -> int:
        """Samples this rank reads in a full epoch (rank and world size as they are now)."""
        _, world = resolve_rank(*self._explicit_rank, strict=False)
        return plan.per_rank(self.num_samples, world, self.drop_last)

    def remaining(self) -> int:
        """Samples this rank still reads in the current epoch."""
        return self._position.get().remaining(self.drop_last)

    def span_length(self, state: dict[str, Any]) -> int:
        """Samples of this rank's span in the segment a resume state names."""
        start, stop = plan.rank_range(
            [tuple(iv) for iv in state["segment"]], state["world_size"], self.rank, self.drop_last
        )
        return stop - start

    def pass_state(self) -> dict[str, Any]:
        """Where the next (or current) pass starts."""
        return to_state(self._position.get(), self.order_key())

    def state_dict(self) -> dict[str, Any]:
        """This process's position: where the current pass starts, plus what a pass read in this process
        consumed (torchdata's StatefulDataLoader calls it in each worker, and in the main process
        without workers). A finished pass gives the start of the next epoch."""
        progress = self._local.progress
        return self.pass_state() if progress is None else dict(progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; the world size may differ from the one that saved it. In a DataLoader
        worker it applies to that worker's next pass only (a StatefulDataLoader's per-worker state)."""
        slot = WorkerSlot.current()
        rank, world = resolve_rank(*self._explicit_rank, strict=False)
        key = self.order_key()
        p, skip = loaded_position(
            state, key, rank, world, (slot.id, slot.count) if slot.in_worker else None
        )
        self._local.progress = None
        # this worker's next pass only; the shared position is the main process's
        if slot.in_worker:
            self._local.loaded = (self._position.generation, p, skip)
            self._local.progress = dict(state) if skip else to_state(p, key)
            return
        self.rank, self.world_size = rank, world
        self.epoch = p.epoch
        self._position.set(p)

    # -- a pass (worker processes, or the main one) -----------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        setup = self.setup
        slot = WorkerSlot.current()
        p, skip, own = self._pass_start(slot)
        # may draw random numbers
        user_code = any(part is not None for part in self.worker_parts().values())
        emit = Emitter(
            self._sender(slot, setup), setup.check_first_batch if slot.in_worker else None
        )
        run = PassRun(
            p,
            p.span(self.drop_last),
            (self.batch_size or 1) * setup.batches_per_chunk,
            slot,
            skip,
            emit,
            reseed=slot.in_worker and setup.seed_workers and user_code,
            seed=self.seed,
        )
        yield from self._tracked(self.read_pass(run), run, moves_epoch=not own)

    def _pass_start(self, slot: WorkerSlot) -> tuple[Position, int, bool]:
        """Where this pass starts, chunks of this worker to skip, and whether the configuring loader reads
        (which moves the epoch on itself; any other DataLoader's pass moves it at its end). One answer
        whoever reads: a state loaded into this process (still current), else the shared position, with
        rank and world size resolved now where no loader's pass resolved them."""
        current = self._current_setup()
        own = current is not None and reader_is(current, slot.in_worker)
        if current is not None and not own:
            refuse_foreign_reader(slot.in_worker)
        loaded, self._local.loaded = self._local.loaded, None
        if loaded is not None and loaded[0] == self._position.generation:
            return loaded[1], loaded[2], own
        if not slot.in_worker:
            return self._resolve_rank(), 0, own
        p = self._position.get()
        if own:  # the loader's begin_pass resolved them in the main process
            return p, 0, own
        rank, world = resolve_rank(*self._explicit_rank, strict=True)
        if world != p.segment_world:
            segment = plan.remaining(p.segment, p.segment_world, p.consumed, self.drop_last)
            return Position(p.epoch, rank, world, segment, world, 0), 0, own
        return dataclasses.replace(p, rank=rank, world_size=world), 0, own

    def _tracked(self, items: Iterable[Any], run: PassRun, moves_epoch: bool) -> Iterator[Any]:
        """``items``, keeping this process's progress for ``state_dict()`` whoever reads (a ShardLoader, a
        StatefulDataLoader, a plain DataLoader); a finished pass moves on to the next epoch where
        ``moves_epoch`` (no configuring loader does it)."""
        p, slot = run.position, run.slot
        key, done = self.order_key(), run.skip
        for item in items:
            done += 1
            self._local.progress = progress_state(
                p, key, run.span, run.chunk, done, slot.count, slot.id
            )
            yield item
        following = next_epoch(p, self.num_samples)
        self._local.progress = to_state(following, key)
        if not moves_epoch:
            return
        if not slot.in_worker:
            self.reset(p.epoch + 1)
        else:
            self._local.loaded = (self._position.generation, following, 0)

    def _sender(self, slot: WorkerSlot, setup: LoaderSetup) -> Any:
        """This worker's transport for batches (see :mod:`shardstream.loader.transport`), if the loader gave one."""
        if not slot.in_worker or setup.sender is None or not self.default_collate:
            return None
        sender = self._local.sender
        if sender is None or sender[0] is not setup.sender:
            sender = self._local.sender = (setup.sender, setup.sender(slot.id))
        return sender[1]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        # open shards, transports and a pass's progress stay in this process
        state["_local"] = ProcessLocal()
        state["_setup"] = self._current_setup()  # a gone loader's transport is nobody's
        state["_loader"] = None
        if process_group_ready():  # a spawned worker has no process group: it inherits this rank
            state["_explicit_rank"] = resolve_rank(*self._explicit_rank, strict=False)
        return state


__all__ = [
    "Emitter",
    "Fixed",
    "PassRun",
    "PlannedDataset",
    "ProcessLocal",
    "ReadSettings",
    "Setting",
]
