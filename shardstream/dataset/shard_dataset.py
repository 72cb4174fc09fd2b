"""``ShardDataset``: an ``IterableDataset`` that executes the plan, decodes and transforms.

Every rank reads exactly ``len(ds)`` samples per epoch (computed from the manifest);
the epoch's order is a function of the seed, the epoch and the manifest alone; the
DataLoader's in-order output equals the rank's planned order for any number of workers;
and a loader's ``state_dict()`` resumes mid-epoch exactly. See :mod:`shardstream.plan`.

A loader configures its dataset through one call, :meth:`ShardDataset.configure`, with a
frozen :class:`LoaderSetup`; once a loader reads the dataset, its settings refuse changes.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from .. import plan
from ..errors import ManifestError, ShardstreamError
from ..manifest import open_dataset
from ..storage import Prefetcher, ShardFetcher
from ..storage.settings import DEFAULT, StorageSettings
from .collate import collate
from .counters import CountedShards
from .decode import Decoder, DecodeSpec, FieldSpec, written_types
from .ranks import process_group_ready, resolve_rank
from .readers import Chunk, OpenShards, RangedReads, looking_ahead, release_stale_maps
from .samples import SampleReader
from .seeding import seed_batch
from .setup import LoaderSetup, reader_is, refuse_change, refuse_foreign_reader, refuse_reconfiguration
from .state import Position, Resumable, SharedPosition, next_epoch, order_key, progress_state, resolve_window, to_state


class ShardDataset(Resumable, IterableDataset):
    """Stream a shardstream dataset (or WebDataset tars) to DDP ranks and DataLoader workers.

    Args:
        url_or_urls: a dataset folder or its ``_manifest.json`` (any fsspec URL), or
            WebDataset tars without a manifest (a brace pattern or a list).
        shuffle: permute shards per epoch and samples within ``shuffle_window``.
        seed: with the epoch, fixes the order; the same on every rank.
        shuffle_window: samples per shuffle window (default: about 64 shards, 1,024 to 2^20 samples;
            over remote shards at most 1 GiB of them, and at least four shards); 0 or 1: no shuffle
            within windows, shards still permuted.
        decode: ``"torch"``, ``"numpy"``, ``"pil"``, ``None`` (bytes), a callable on the
            sample, or a per-field mapping; see :class:`shardstream.dataset.decode.Decoder`.
        fields: the fields samples keep, after decoding, with alternatives for mixed extensions:
            ``["jpg;png", "cls"]`` (named ``jpg`` and ``cls``) or ``{"image": "jpg;png", "label": "cls"}``.
        transform: a callable applied to each decoded sample dict.
        drop_last: drop the epoch's tail instead of padding so that ranks get equal counts.
        batch_size: yield collated batches of this size (set by :meth:`loader`).
        collate_fn: makes a batch from a list of samples (default: :func:`collate`).
        rank, world_size: override ``torch.distributed`` / ``RANK`` / ``WORLD_SIZE``.
        on_error: ``"raise"`` or ``"skip"``: a shard or sample that fails to load or decode is
            counted (:attr:`skipped`, across workers), logged once per shard, and replaced by the
            last good sample, so every rank still yields the same number of samples. An exception
            from ``transform`` is an error in code: it raises whatever ``on_error`` says.
        verify_checksums: check each local shard's sha256 against the manifest once per host
            before reading it (remote shards are always checked when downloaded).
        storage: remote-storage settings as one :class:`~shardstream.storage.StorageSettings`;
            the keywords below, where given, replace its fields.
        storage_options, cache_dir, cache_limit, prefetch, retries, timeout: the fields of
            :class:`~shardstream.storage.StorageSettings` (fsspec options, the host's shard
            cache and its limit, bytes downloaded ahead per worker, retries and timeout).
    """

    def __init__(
        self,
        url_or_urls: str | os.PathLike[str] | Sequence[str],
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_window: int | None = None,
        decode: DecodeSpec = "torch",
        fields: FieldSpec = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        drop_last: bool = False,
        batch_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "raise",
        verify_checksums: bool = False,
        storage: StorageSettings | None = None,
        storage_options: dict[str, Any] | None = DEFAULT,
        cache_dir: str | os.PathLike[str] | None = DEFAULT,
        cache_limit: int | str | None = DEFAULT,
        prefetch: int | str = DEFAULT,
        retries: int = DEFAULT,
        timeout: float | None = DEFAULT,
    ):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        storage = StorageSettings.combine(storage, options=storage_options, cache_dir=cache_dir,
                                          cache_limit=cache_limit, prefetch=prefetch, retries=retries, timeout=timeout)
        store, manifest = open_dataset(url_or_urls, storage.options, storage.retry)
        if manifest.num_samples == 0:
            raise ManifestError(f"{store.url} holds no samples")
        fixed = {"storage": storage, "store": store, "manifest": manifest,
                 "disk_cache": None if store.local else storage.disk_cache()}
        self.__dict__.update(fixed)  # set once: __setattr__ refuses them
        release_stale_maps()  # this process's maps of shard files replaced or deleted since (a re-pack)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.window = resolve_window(shuffle_window, manifest.samples, manifest.nbytes, remote=not self.store.local)
        self.decoder = Decoder(decode, fields, written_types(manifest))
        self.decoder.check_fields([f["name"] for f in manifest.fields if "name" in f], store.url)
        self.transform = transform
        self.batch_size = batch_size
        self.collate_fn = collate_fn or collate
        self.on_error = on_error
        self.verify_checksums = bool(verify_checksums)
        self.seed_workers = True  # without a loader's setup: reseed per batch (see shardstream.dataset.seeding)
        if manifest.shard_format == "arrow":
            import pyarrow.compute  # noqa: F401 - take() loads it lazily, inside the first batch otherwise
        self._samples = SampleReader(store, manifest)
        self._setup: LoaderSetup | None = None  # set by the loader that reads this dataset (configure)
        self._loader: Callable[[], Any] | None = None  # a weak reference to that loader
        self._explicit_rank = (rank, world_size)
        self.rank, self.world_size = resolve_rank(rank, world_size, strict=False)  # provisional: see _refresh_rank
        self.epoch = 0
        self._position = SharedPosition()
        self.reset(0)

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_change(name, self._reading())
        if name in ("seed_workers", "batch_size"):  # properties over the dataset's own values (see setup)
            name = "_" + name
        super().__setattr__(name, value)

    def _reading(self) -> bool:
        """Whether a loader reads this dataset now (in the process that made the loader)."""
        loader = self.__dict__.get("_loader")
        return loader is not None and loader() is not None

    # -- what a loader needs to know, and the one call by which it configures the dataset ----------
    @property
    def raw(self) -> bool:
        """Batches hold stored bytes, undecoded and untransformed."""
        return self.decoder.keeps_bytes and self.transform is None

    @property
    def mapped(self) -> bool:
        """Raw batches of local, uncompressed tars travel as locations in the shard files (the
        default collate only: a ``collate_fn`` of the user's gets the samples)."""
        return self.raw and self.store.local and self.manifest.shard_format == "tar" and self.default_collate

    @property
    def columnar(self) -> bool:
        """Arrow rows go to batches column by column, with no per-row Python."""
        return (self.manifest.shard_format == "arrow" and self.transform is None and self.default_collate
                and self.decoder.select is None
                and (self.decoder.keeps_bytes or not _has_binary_fields(self.manifest)))

    @property
    def default_collate(self) -> bool:
        """Batches are made by :func:`shardstream.dataset.collate.collate` (which a transport can send cheaply)."""
        return self.collate_fn is collate

    @property
    def batch_size(self) -> int | None:
        """Samples per batch it yields: its loader's while one reads it, else its own (``None``: samples),
        so that a dataset whose loader is gone yields samples to a plain DataLoader again."""
        setup = self._current_setup()
        return self.__dict__["_batch_size"] if setup is None else setup.batch_size

    @property
    def seed_workers(self) -> bool:
        """Workers reseed ``random``, ``numpy`` and ``torch`` per batch (the loader's setting, if one reads)."""
        setup = self._current_setup()
        return self.__dict__["_seed_workers"] if setup is None else setup.seed_workers

    @property
    def skipped(self) -> int:
        """Samples replaced under ``on_error="skip"`` by this dataset, in this process and its DataLoader
        workers together (counted as workers read them; set it to 0 to count afresh)."""
        return self._samples.skipped

    @skipped.setter
    def skipped(self, value: int) -> None:
        self._samples.skipped = int(value)

    @property
    def prefetch(self) -> int:
        """Bytes each worker downloads ahead (``storage.prefetch``)."""
        return self.storage.prefetch_bytes

    @property
    def counts(self) -> np.ndarray:
        """Samples per shard (``manifest.samples``)."""
        return self.manifest.samples

    def worker_parts(self) -> dict[str, Any]:
        """The user's code that DataLoader workers run, by a label for messages ("the transform")."""
        parts: dict[str, Any] = {"the transform": self.transform, "the decode function": self.decoder.whole}
        for name, how in self.decoder.fields.items():
            if callable(how):
                parts[f"the decoder of field {name!r}"] = how
        if not self.default_collate:
            parts["the dataset's collate_fn"] = self.collate_fn
        return parts

    def configure(self, loader: Any, setup: LoaderSetup) -> None:
        """Let ``loader`` read this dataset with ``setup``: refused while another loader reads it; the
        same loader may give it a new transport (``sender``) later, never other batches."""
        setup.check()
        current = self._loader() if self._loader is not None else None
        if current is not None and current is not loader:
            raise ShardstreamError(
                "this ShardDataset already feeds a loader, whose batches and resume state depend on it; "
                "make another ShardDataset for a second loader (or drop the first one)"
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
        return self._current_setup() or LoaderSetup(batch_size=self.batch_size or 1,
                                                    seed_workers=self.__dict__["_seed_workers"])

    # -- reading (worker processes, or the main one) -------------------------------------
    def __iter__(self) -> Iterator[Any]:
        setup = self.setup
        batched = self.batch_size is not None
        self.decoder.copied_later = batched and self.transform is None and self.default_collate
        info = get_worker_info()
        num_workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
        p, skip, own = self._pass_start(info)
        span = p.span(self.drop_last)
        order = plan.EpochOrder.create(self.manifest.samples, self.seed, p.epoch, self.shuffle, self.window)
        order = order.restrict(*plan.span_bounds(p.segment, span))  # keep only this rank's shards
        chunk = (self.batch_size or 1) * setup.batches_per_chunk
        shards = self._open_shards()
        shards.forget_failures()
        sender = self._sender(info, setup)

        def candidates() -> Iterator[tuple[int, int]]:
            """The rank's (shard, offset) pairs in order: stand-ins for samples that fail before any loads."""
            for start in range(span[0], span[1], 64):
                idx = np.arange(start, min(start + 64, span[1]))
                yield from zip(*order.samples(plan.segment_positions(p.segment, idx)))

        self._samples.begin(self.decoder, self.transform, self.on_error, self.raw, candidates,
                            self.decoder.copied_later)

        def planned() -> Iterator[Chunk]:
            for lo, hi in itertools.islice(plan.worker_chunks(span, chunk, num_workers, worker_id, p.consumed),
                                           skip, None):
                positions = plan.segment_positions(p.segment, np.arange(lo, hi))
                yield (int(positions[0]), *order.samples(positions))

        chunks: Iterable[Chunk] = planned()
        prefetcher = None
        if not self.store.local:  # fetch the next shards of this worker's plan while it reads these
            prefetcher = Prefetcher(shards.load, lambda i: int(self.manifest.nbytes[i]), self.storage.prefetch_bytes)
            shards.take = shards.timed(prefetcher.take)
            shards.ranged = RangedReads(self.manifest, shards.fetcher, prefetcher)  # the first samples
        if prefetcher is not None or self.manifest.shard_format != "tar":  # decompressed shards: let go of passed ones
            chunks = looking_ahead(chunks, -(-2 * self.window // (chunk * num_workers)) + 1, prefetcher, shards)
        try:
            user_code = any(part is not None for part in self.worker_parts().values())  # may draw random numbers
            reseed = info is not None and setup.seed_workers and user_code  # augmentations per batch, reproducibly
            check = setup.check_first_batch if info is not None else None
            items = self._batches(chunks, shards, sender, p.epoch if reseed else None, check)
            yield from self._tracked(items, p, skip, own, span, chunk, info)
        finally:
            if prefetcher is not None:
                prefetcher.close()
                shards.take = shards.ranged = None

    def _pass_start(self, info: Any) -> tuple[Position, int, bool]:
        """Where this pass starts, chunks of this worker to skip, and whether the configuring loader reads."""
        current = self._current_setup()
        own = current is not None and reader_is(current, info is not None)
        if current is not None and not own:
            refuse_foreign_reader(info is not None)
        p, skip = (self._position.get(), 0) if own else self._foreign_position(info)
        return p, skip, own

    def _tracked(self, items: Iterable[Any], p: Position, skip: int, own: bool, span: tuple[int, int], chunk: int,
                 info: Any) -> Iterator[Any]:
        """``items``; read by another DataLoader (a StatefulDataLoader), keeping this process's progress
        for ``state_dict()`` and moving a finished pass on to the next epoch."""
        if own:
            yield from items
            return
        num_workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
        key, done = order_key(self), skip
        for item in items:
            done += 1
            self.__dict__["_progress"] = progress_state(p, key, span, chunk, done, num_workers, worker_id)
            yield item
        following = next_epoch(p, self.manifest.num_samples)
        self.__dict__["_progress"] = to_state(following, key)
        if info is None:
            self.reset(p.epoch + 1)
        else:
            self.__dict__["_local"] = (self._position.generation, following, 0)

    def _batches(self, chunks: Iterable[Chunk], shards: OpenShards, sender: Any, seed_epoch: int | None,
                 check: Callable[[Any], None] | None) -> Iterator[Any]:
        batched = self.batch_size is not None
        mapped, columnar = self.mapped, self.columnar

        def checked(batch: Any) -> Any:
            """The batch, once the pass's first one has been checked."""
            nonlocal check
            if check is not None:
                check, first = None, check
                first(batch)
            return batch

        for position, ids, offsets in chunks:
            if seed_epoch is not None:
                seed_batch(self.seed, seed_epoch, position)
            if columnar and batched:
                batch = self._samples.load_columns(shards, ids, offsets)
            elif mapped and batched and (found := self._samples.load_mapped(shards, ids, offsets)) is not None:
                yield found  # locations in the shard files: nothing to check or send
                continue
            else:
                samples = self._samples.load(shards, ids, offsets, batched)
                if not batched:
                    yield samples[0]
                    continue
                if sender is not None:
                    with sender.batch() as ship:  # collate allocates in the sender's arena inside this block
                        shipment = ship(checked(self._samples.collate(self.collate_fn, samples)))
                    yield shipment  # outside the block: its allocator must not stay active while suspended
                    continue
                batch = self._samples.collate(self.collate_fn, samples)
            yield checked(batch)

    def _sender(self, info: Any, setup: LoaderSetup) -> Any:
        """This worker's transport for batches (see :mod:`shardstream.loader.transport`), if the loader gave one."""
        if info is None or setup.sender is None or not self.default_collate:
            return None
        sender = self.__dict__.get("_worker_sender")
        if sender is None or sender[0] is not setup.sender:
            sender = (setup.sender, setup.sender(info.id))
            self.__dict__["_worker_sender"] = sender
        return sender[1]

    def _open_shards(self) -> OpenShards:
        verify, shards = self.__dict__.get("_shards", (None, None))
        if shards is None or verify != self.verify_checksums:
            fetcher = ShardFetcher(self.store, self.manifest, self.disk_cache, verify_local=self.verify_checksums)
            shards = CountedShards(self.store, self.manifest, fetcher=fetcher, stats=self._samples.stats)
            self.__dict__["_shards"] = (self.verify_checksums, shards)
        shards.fit_window(self.window if self.shuffle else 1)  # as many open as one window reads
        return shards

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_shards", None)  # open shards (memory maps) stay in the process that opened them
        state.pop("_worker_sender", None)  # each worker process has its own arenas
        state.pop("_progress", None)  # this process's reading
        state.pop("_local", None)
        state["_setup"] = self._current_setup()  # a gone loader's transport is nobody's
        state["_loader"] = None
        if process_group_ready():  # a spawned worker has no process group: it inherits this rank
            state["_explicit_rank"] = resolve_rank(*self._explicit_rank, strict=False)
        return state

    # -- loaders ----------------------------------------------------------------------
    def loader(self, batch_size: int, num_workers: int | None = None, **dataloader_kwargs: Any) -> Any:
        """A :class:`~shardstream.loader.ShardLoader` over this dataset: a DataLoader whose
        in-order output is this rank's planned order, with ``state_dict()``."""
        import importlib

        # by name, like fsspec's registry: the dataset stage never imports the loader stage above it
        loader_class = importlib.import_module("shardstream.loader").ShardLoader
        return loader_class(self, batch_size, num_workers, **dataloader_kwargs)


def _has_binary_fields(manifest: Any) -> bool:
    return any(f.get("type") in ("binary", "large_binary") for f in manifest.fields)


__all__ = ["LoaderSetup", "ShardDataset"]
