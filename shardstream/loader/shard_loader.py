"""``ShardLoader``: the DataLoader ``ShardDataset.loader()`` builds, with resumable state.

Batches are collated in the workers (the dataset yields whole batches), so the
DataLoader itself runs with ``batch_size=None`` and only moves them. Its in-order
output is the rank's planned order for any ``num_workers``; ``state_dict()`` is a few
integers plus the epoch's remaining segment, and ``load_state_dict()`` continues with no
sample repeated or skipped, also with another ``num_workers`` or world size.

It follows the conventions trainers rely on (torchdata's StatefulDataLoader, Lightning,
accelerate): ``len()`` is the whole epoch on this rank, also after a resume; its sampler's
``set_epoch`` is the dataset's; a pass counts as complete when its last batch is handed out
and moves the dataset to the next epoch; ``load_state_dict`` applies to the next pass; rank
and world size are resolved when a pass starts; accelerate's ``prepare()`` returns it as it is.

It configures itself (workers, pinned memory, persistent workers, prefetch, per-worker
seeds) and checks, before its workers start, what would make them crash or hang later:
a ``/dev/shm`` too small for the batches in flight, parts that ``spawn`` workers cannot
unpickle, tensors a worker returns on a GPU (see :mod:`shardstream.loader.guards`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import get_worker_info

from ..dataset import LoaderSetup, Readable
from ..dataset.setup import READING, new_token, own_worker_init
from ..errors import ShardstreamError, UsageError
from ..host import loader_workers
from . import guards, worker_errors
from .stats import Callback, LoaderStats, StatsRecorder
from .threads import thread_count, threaded_pass
from .torch_adapter import AdaptedDataLoader, InfiniteSampler, read_from
from .transport import Receiver, Ring

log = logging.getLogger("shardstream")


def default_num_workers() -> int:
    """min(4 x GPUs, CPU cores - 1), shared among the training processes of this machine, at least 1."""
    return loader_workers()


def _from_worker(batch: Any) -> Any:
    """The DataLoader's collate_fn (batches are collated in the dataset already): in a worker,
    refuse tensors that are not in CPU memory before they are sent."""
    if get_worker_info() is not None:
        guards.check_worker_batch(batch)
    return batch


def in_flight(kwargs: dict[str, Any], ring: bool, ring_slots: int) -> tuple[float, int]:
    """Batches a worker keeps in shared memory, and those the main process holds there besides."""
    if ring:
        return ring_slots * 1.25, 0  # each worker's arenas, sized 1.25 x the largest batch
    return kwargs.get("prefetch_factor") or 2, 0 if kwargs.get("pin_memory") else 1


class EpochSampler(InfiniteSampler):
    """The loader's sampler (an IterableDataset's infinite one) whose ``set_epoch`` is the dataset's:
    Lightning, and accelerate's loaders, call ``sampler.set_epoch`` at each epoch."""

    def __init__(self, dataset: Readable):
        super().__init__()
        self.dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)


class ShardLoader(AdaptedDataLoader):
    """A DataLoader over a :class:`ShardDataset` that can save and restore its position.

    Defaults, each overridable: ``num_workers`` = min(4 x GPUs, CPU cores - 1), at least 1 (raw local
    tar batches: 1);
    ``pin_memory`` when CUDA is available; ``persistent_workers`` and ``prefetch_factor=2``
    with workers; a ``generator`` seeded from the dataset's seed (so creating an iterator
    does not draw from the global torch RNG). ``seed_workers`` (default: the dataset's,
    True) reseeds ``random``, ``numpy`` and ``torch`` in the workers before every batch from
    (seed, epoch, position of its first sample); see :mod:`shardstream.dataset.seeding`.
    ``shm_check``: ``"raise"`` (default), ``"warn"`` or ``"off"`` when ``/dev/shm`` looks
    too small for the batches in flight. An error of shardstream's own (a
    :class:`~shardstream.errors.ShardstreamError`: a corrupt shard, a sample that does not decode, a
    setting that cannot work), raised in a worker or while a pass reads, is raised as the same type
    with the same message and a traceback that starts here (not torch's "Caught ... in DataLoader
    worker process N" and the worker's traceback); ``exc.worker_traceback`` holds the whole traceback
    as text, and ``worker_tracebacks=True`` prints it as well. Errors from the user's code (a
    transform's) keep their whole traceback (see :mod:`shardstream.loader.worker_errors`).
    ``drop_last`` is the dataset's, and ``in_order=False`` is refused (either would break the planned
    order and the resume state). Raw local tar batches (``decode=None``, no transform, the default
    collate) carry only the values' locations, which one worker makes faster than the main process
    reads them: their default is one worker.
    ``workers``: ``"processes"`` (torch's worker processes), ``"threads"`` (``num_workers`` reader threads
    in this process: no fork, no pickling, no ``/dev/shm``; the same order and resume state; see
    :mod:`shardstream.loader.threads`), or ``"auto"`` (default): threads where they were measured to be
    faster (batches of stored bytes with no user code: ``decode=None``, no transform, the default
    collate, local or remote; a :class:`TokenDataset`'s windows with one worker or a small epoch, see
    ``TokenDataset.threads_win``), else processes. ``reader_threads`` says how many threads read (0: none).

    Args:
        dataset: what to read: a :class:`ShardDataset`, :class:`TokenDataset`, :class:`MixedDataset`
            or any :class:`~shardstream.dataset.Readable`.
        batch_size: samples per batch.
        num_workers: DataLoader worker processes (default: the formula above).
        seed_workers: reseed the workers' generators before every batch (default: the dataset's, True).
        shm_check: ``"raise"``, ``"warn"`` or ``"off"``.
        worker_tracebacks: also print a worker's whole traceback above an error's message.
        workers: ``"auto"``, ``"processes"`` or ``"threads"`` (see above).
        **kwargs: other ``torch.utils.data.DataLoader`` arguments (``pin_memory``,
            ``prefetch_factor``, ``collate_fn``, ...), which replace the defaults above.
    """

    _ragged_warned = False  # a field of images of different sizes was warned of (once per loader)

    def __init__(
        self,
        dataset: Readable,
        batch_size: int,
        num_workers: int | None = None,
        *,
        seed_workers: bool | None = None,
        shm_check: str = "raise",
        worker_tracebacks: bool = False,
        workers: str = "auto",
        **kwargs: Any,
    ):
        if batch_size is None:  # what a DataLoader rebuilt from a ShardLoader's attributes passes
            raise ShardstreamError(
                "ShardLoader got batch_size=None: a framework is rebuilding it from its attributes (Lightning's "
                "trainer.predict re-instantiates every DataLoader), which would read the dataset a second time; "
                "for predictions give trainer.predict torch's DataLoader(ShardDataset(..., shuffle=False), "
                "batch_size=...) over a dataset of its own, or iterate the ShardLoader yourself"
            )
        if batch_size < 1:
            raise UsageError(f"batch_size must be at least 1, not {batch_size}")
        if shm_check not in ("raise", "warn", "off"):
            raise UsageError(f"shm_check must be 'raise', 'warn' or 'off', not {shm_check!r}")
        if "drop_last" in kwargs:
            raise UsageError(
                "ShardLoader takes no drop_last: its dataset decides it, so that every rank reads "
                "len(ds) samples; pass ShardDataset(..., drop_last=True) instead"
            )
        if not kwargs.get("in_order", True):
            raise UsageError(
                "ShardLoader needs in_order=True: batches out of order break the planned order and its "
                "resume state; for more throughput raise num_workers or prefetch_factor instead"
            )
        # batches of locations (raw local tars): one worker outpaces the main process
        if num_workers is None:
            num_workers = min(default_num_workers(), 1) if dataset.mapped else default_num_workers()
        self.reader_threads = thread_count(dataset, num_workers, workers, kwargs)
        self._thread_depth = 2
        if self.reader_threads:  # torch reads in its main process, from the threads
            self._thread_depth = kwargs.pop("prefetch_factor", None) or 2
            kwargs.pop("persistent_workers", None)
            num_workers = 0
        kwargs.setdefault("pin_memory", torch.cuda.is_available())
        kwargs.setdefault("collate_fn", _from_worker)  # batches are collated in the dataset already
        kwargs.setdefault("generator", torch.Generator().manual_seed(dataset.seed))
        if num_workers > 0:
            kwargs.setdefault("persistent_workers", True)
            kwargs.setdefault("prefetch_factor", 2)
        per_chunk = dataset.batches_per_chunk(batch_size, num_workers) if num_workers > 0 else 1
        ring = num_workers > 0 and not kwargs.get("pin_memory") and dataset.default_collate
        ring_slots = (kwargs.get("prefetch_factor") or 2) + 2  # more arenas than batches in flight
        self.shm_check = shm_check
        self.worker_tracebacks = bool(worker_tracebacks)
        self._shm_free = guards.shm_free_bytes() if num_workers > 0 and shm_check != "off" else None
        # before anything changes: a refused loader leaves the dataset as it was
        if num_workers > 0:
            _check_workers(dataset, kwargs)
            # mapped raw batches are locations: nothing to hold in shared memory
            if not dataset.mapped:
                self._check_shm(
                    dataset.batch_bytes(batch_size * per_chunk),
                    num_workers,
                    kwargs,
                    ring,
                    ring_slots,
                    "estimated from the manifest's stored sample sizes; decoded images take more",
                )
        # the workers check their own first batch too, before sending it: by the time the main process
        # sees a batch, another worker's may already have failed to reach shared memory
        per_worker, extra = in_flight(kwargs, ring, ring_slots)
        check = (
            functools.partial(
                guards.check_first_batch,
                num_workers=num_workers,
                batches_per_worker=per_worker,
                extra_batches=extra,
                free=self._shm_free,
            )
            if shm_check == "raise" and self._shm_free is not None and not dataset.mapped
            else None
        )
        self.ring_slots = ring_slots
        self._receiver: Receiver | None = None
        self._setup = LoaderSetup(
            batch_size=batch_size,
            batches_per_chunk=per_chunk,
            seed_workers=dataset.seed_workers if seed_workers is None else bool(seed_workers),
            check_first_batch=check,
            token=new_token(),
        )
        if ring:
            self._receiver = Receiver(self._new_table(num_workers, ring_slots))
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        # last: a loader torch refuses leaves the dataset as it was
        dataset.configure(self, self._with_sender())
        self.set_sampler(EpochSampler(dataset))
        self.samples_per_batch = batch_size
        self._start: dict[str, Any] | None = None
        self._batches = 0
        # the pass that finished: start, batches, generation
        self._last: tuple[dict[str, Any], int, int] | None = None
        self._shm_measured = num_workers == 0 or shm_check == "off"
        self._stats = StatsRecorder(dataset)

    def _check_shm(
        self,
        batch_bytes: int,
        num_workers: int,
        kwargs: dict[str, Any],
        ring: bool,
        ring_slots: int,
        basis: str,
    ) -> None:
        """Batches in flight: each worker's ring arenas (sized 1.25 x the largest batch), or its
        ``prefetch_factor`` batches plus, without pinning, the one the training loop holds."""
        per_worker, extra = in_flight(kwargs, ring, ring_slots)
        guards.check_shm(
            batch_bytes,
            num_workers,
            per_worker,
            extra_batches=extra,
            basis=basis,
            action=self.shm_check,
            free=self._shm_free,
            path=guards.SHM_PATH,
        )

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank, also after a mid-epoch load_state_dict (the torchdata
        StatefulDataLoader convention: Lightning adds the batches its restored progress counts)."""
        return -(-len(self.dataset) // self.samples_per_batch)

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def new_iterator(self) -> Any:
        """torch's iterator, with workers that know they are this loader's (see ShardDataset's foreign-reader
        check); with reader threads, torch's single-process iterator over the threads' chunks."""
        if self.reader_threads:
            return read_from(
                self.torch_iterator(),
                threaded_pass(
                    self.dataset, self.reader_threads, self._setup.token, self._thread_depth
                ),
            )
        if self.num_workers == 0:
            return self.torch_iterator()
        user = self.worker_init_fn
        own = functools.partial(own_worker_init, self._setup.token, user)
        self.worker_init_fn = functools.partial(worker_errors.worker_init, own)
        try:
            return self.torch_iterator()
        finally:
            self.worker_init_fn = user

    def _with_sender(self) -> LoaderSetup:
        """The setup for the dataset, with worker rings that report to this loader's current table."""
        if self._receiver is None:
            return self._setup
        return dataclasses.replace(
            self._setup,
            sender=functools.partial(Ring, self._receiver.released, slots=self.ring_slots),
        )

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._pass()
        except Exception as exc:
            # its workers stop now, and the next pass starts new ones (left to the garbage collector, where
            # the error holds the loader in a reference cycle, each would wait torch's 5 s join timeout)
            self.stop_workers()
            # of ours: one line (see worker_errors); a user's: as it is
            if isinstance(exc, ShardstreamError) and worker_errors.cut(exc, self.worker_tracebacks):
                raise exc  # shortened: exc.worker_traceback has the rest; ShardLoader(worker_tracebacks=True) prints it
            raise

    def _pass(self) -> Iterator[Any]:
        ds = self.dataset
        begun = ds.begin_pass()  # rank and world size as they are when the pass starts
        start, generation, left = begun.state, begun.generation, begun.samples
        expected = -(-left // self.samples_per_batch)
        self._start, self._generation, self._batches = start, generation, 0
        self._stats.begin()
        skipped = self.dataset.skipped
        per_chunk = self._setup.batches_per_chunk
        receiver = self._receiver
        check_ragged = ds.default_collate  # images of different sizes in a field: warned of once
        if receiver is not None and not (self.persistent_workers and self.has_workers_running()):
            # new worker processes start their rings afresh, with a table of their own
            receiver.reset(self._new_table(self.num_workers, self.ring_slots))
            self.dataset.configure(self, self._with_sender())
        for chunk in self._own_chunks():
            if receiver is not None:
                chunk = receiver.receive(chunk)
            if not self._shm_measured:
                self._shm_measured = True
                self._check_shm(
                    guards.batch_nbytes(chunk),
                    self.num_workers,
                    {"prefetch_factor": self.prefetch_factor, "pin_memory": self.pin_memory},
                    receiver is not None,
                    self.ring_slots,
                    "measured on the first batch",
                )
            for batch in ds.cut_chunk(chunk, self.samples_per_batch) if per_chunk > 1 else (chunk,):
                if check_ragged and not self._ragged_warned:
                    self._check_ragged(batch)
                self._batches += 1
                last = self._batches >= expected
                if last:  # before handing out the last batch: a consumer that knows len() (Lightning) stops here
                    self._finish(start, generation, skipped)
                self._stats.delivered(
                    min(self.samples_per_batch, left - (self._batches - 1) * self.samples_per_batch)
                )
                yield batch
                self._stats.resumed()
                # the plan has no more; a worker starting this late would read the next epoch
                if last:
                    return
        self._finish(start, generation, skipped)

    def _check_ragged(self, batch: Any) -> None:
        """Warn once (then never check again) when a field of the batch is a list of images of
        different sizes: a model expecting one N×C×H×W tensor would fail far from the cause."""
        problem = guards.ragged_images(batch)
        if problem is not None:
            self._ragged_warned = True
            warnings.warn(problem, UserWarning, stacklevel=3)

    def _own_chunks(self) -> Iterator[Any]:
        """torch's iterator, advanced with this loader marked as the reader (main-process reads check it)."""
        it = super().__iter__()
        while True:
            token = READING.set(self._setup.token)
            try:
                chunk = next(it)
            except StopIteration:
                return
            finally:
                READING.reset(token)
            yield chunk

    def _finish(self, start: dict[str, Any], generation: int, skipped: int) -> None:
        """A pass read to its end moves the dataset to the next epoch, unless its epoch or position was set
        since the pass began (load_state_dict or set_epoch mid-pass apply to the next pass)."""
        # the workers logged each shard; this is the pass's total
        if self.dataset.skipped > skipped:
            log.warning(
                "epoch %d: skipped %d samples of rank %d (on_error='skip'); ds.skipped is %d",
                start["epoch"],
                self.dataset.skipped - skipped,
                self.dataset.rank,
                self.dataset.skipped,
            )
        if self.dataset.generation != generation:
            return
        self.dataset.reset(int(start["epoch"]) + 1)
        self._last = (start, self._batches, self.dataset.generation)

    @property
    def skipped(self) -> int:
        """Samples its dataset replaced under ``on_error="skip"``, in every worker (``dataset.skipped``)."""
        return self.dataset.skipped

    def stats(self) -> LoaderStats:
        """Batches and samples delivered, bytes read, stage times and skips, over all workers since this
        loader was made (see :mod:`shardstream.loader.stats`); ``.verdict()`` says what to fix."""
        return self._stats.stats()

    def report_stats(self, every: int = 100, callback: Callback | None = None) -> None:
        """Every ``every`` batches, pass ``stats().scalars()`` to ``callback`` (a logger's: W&B's ``wandb.log``,
        Lightning's ``log_dict``), or without one log a line at INFO; ``every=0`` stops."""
        self._stats.report_every(every, callback)

    @staticmethod
    def _new_table(num_workers: int, slots: int) -> torch.Tensor:
        return torch.full((num_workers, slots), -1, dtype=torch.int64).share_memory_()

    def state_dict(self, pending: int = 0) -> dict[str, Any]:
        """Where this rank is: epoch, seed, the epoch's segment and what it consumed of it.

        ``pending``: batches this loader has handed out that the training loop has not
        received yet (a prefetching wrapper's, such as :class:`DeviceLoader`); they count as
        not consumed, so a resume reads them again.
        """
        if self._start is None or self._generation != self.dataset.generation:
            last = self._last
            # the finished pass, not all
            if pending and last is not None and last[2] == self.dataset.generation:
                state, batches = dict(last[0]), last[1]  # of it received yet: resume inside it
                state["consumed"] = min(
                    state["consumed"] + max(batches - pending, 0) * self.samples_per_batch,
                    self.dataset.span_length(state),
                )
                return state
            # where the next pass starts: not iterated since it was set
            return self.dataset.pass_state()
        state = dict(self._start)
        span = self.dataset.span_length(state)
        taken = max(self._batches - pending, 0)
        state["consumed"] = min(state["consumed"] + taken * self.samples_per_batch, span)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next iteration."""
        self.dataset.load_state_dict(state)
        # a pass being iterated goes on as it was; the state applies to the next one
        self._start = None
        self._last = None
        self._batches = 0


def _check_workers(dataset: Readable, kwargs: dict[str, Any]) -> None:
    """Before workers start: spawn/forkserver workers must unpickle everything they get (name what
    cannot be); forked workers share the open files they inherit (warn)."""
    parts = dataset.worker_parts()
    if kwargs.get("collate_fn") is not _from_worker:
        parts["the collate_fn"] = kwargs.get("collate_fn")
    parts["the worker_init_fn"] = kwargs.get("worker_init_fn")
    method = guards.start_method(kwargs.get("multiprocessing_context"))
    if method == "fork":
        guards.warn_open_files(parts)
        return
    guards.check_picklable(parts, method)
    guards.check_dataset_picklable(dataset, method)
