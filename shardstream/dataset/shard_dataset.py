"""``ShardDataset``: an ``IterableDataset`` that executes the plan, decodes and transforms.

Every rank reads exactly ``len(ds)`` samples per epoch (computed from the manifest);
the epoch's order is a function of the seed, the epoch and the manifest alone; the
DataLoader's in-order output equals the rank's planned order for any number of workers;
and a loader's ``state_dict()`` resumes mid-epoch exactly. See :mod:`shardstream.plan`.

A loader configures its dataset through one call, :meth:`ShardDataset.configure`, with a
frozen :class:`LoaderSetup`; once a loader reads the dataset, its settings refuse changes. The
planning, resume and configuring parts are :class:`~shardstream.dataset.base.PlannedDataset`'s;
this module says how a pass reads the shards: decoded, transformed and collated samples, Arrow
rows by column, or raw bytes of local tars as locations in the files.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError, sample_name
from ..storage import ShardFetcher
from ..storage.settings import DEFAULT, StorageSettings
from .base import Fixed, PassRun, PlannedDataset, ReadSettings, Setting
from .batches.collate import collate
from .contract import Counters, PassStart, WorkerSlot
from .counters import CountedShards
from .following import OnNewVersion, VersionChoice, agreed_version
from .parallel import Parallel
from .samples.decode import Decoder, DecodeSpec, FieldSpec, written_types
from .samples.reader import SampleReader
from .setup import LoaderSetup
from .shard_pass import ShardPass, StoredDataset, open_stored
from .shards.readers import Chunk, OpenShards
from .state import resolve_window

_CHUNK_BYTES = 8 << 20  # raw batches a worker sends at once: about this many bytes


@dataclass(frozen=True)
class OpenedAs:
    """What a dataset was opened from, to open another version of it: the URL, the shuffle window asked
    for (each version's default differs), and which version it reads epoch by epoch."""

    url: str | os.PathLike[str] | Sequence[str]
    shuffle_window: int | None
    versions: VersionChoice


class ShardDataset(StoredDataset, PlannedDataset):
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
            sample, or a per-field mapping; see :class:`shardstream.dataset.samples.decode.Decoder`.
        fields: the fields samples keep, after decoding, with alternatives for mixed extensions:
            ``["jpg;png", "cls"]`` (named ``jpg`` and ``cls``) or ``{"image": "jpg;png", "label": "cls"}``.
        transform: a callable applied to each decoded sample: it receives the sample as a dict
            (``"__key__"`` and one entry per field, decoded as ``decode`` says, e.g. ``{"__key__":
            "cat/001", "jpg": uint8 tensor C×H×W, "cls": 3}``) and returns what the dataset yields,
            usually that dict with fields changed or added; batches collate what it returns.
        drop_last: drop the epoch's tail instead of padding so that ranks get equal counts.
        batch_size: yield collated batches of this size (set by :meth:`loader`).
        collate_fn: makes a batch from a list of samples (default: :func:`collate`).
        rank: this process's rank; overrides ``torch.distributed`` / ``RANK`` (default: from them, else 0).
        world_size: the number of ranks; overrides ``torch.distributed`` / ``WORLD_SIZE`` (default:
            from them, else 1).
        parallel: under tensor/context/pipeline parallelism, the data-parallel rank and size to split
            the data by (:class:`~shardstream.dataset.parallel.Parallel`), instead of rank/world_size.
        on_error: ``"raise"`` or ``"skip"``: a shard or sample that fails to load or decode is
            counted (:attr:`skipped`, across workers), logged once per shard, and replaced by the
            last good sample, so every rank still yields the same number of samples. An exception
            from ``transform`` is an error in code: it raises whatever ``on_error`` says.
        verify_checksums: check each local shard's sha256 against the manifest once per host
            before reading it (remote shards are always checked when downloaded).
        storage: remote-storage settings as one :class:`~shardstream.storage.StorageSettings`;
            the keywords below, where given, replace its fields.
        storage_options: fsspec options (``StorageSettings.options``).
        cache_dir: the host's shard cache (``StorageSettings.cache_dir``).
        cache_limit: the cache's limit (``StorageSettings.cache_limit``).
        prefetch: bytes downloaded ahead per worker (``StorageSettings.prefetch``).
        retries: attempts per request (``StorageSettings.retries``).
        timeout: seconds per request (``StorageSettings.timeout``).
        version: the dataset's version to read (``None``: the latest when it is made); it reads that
            version for as long as it lives, whatever is published meanwhile, and its resume states
            record it (:mod:`shardstream.manifest.versions`).
        on_new_version: ``"stay"`` (default) reads that one version, and a resume state of another
            version is refused; ``"next_epoch"`` resumes a state on the version it was saved on for
            the rest of its epoch, and starts every epoch on the latest version (checked at each
            epoch's start; see :mod:`shardstream.dataset.following`). Never mid-epoch.
    """

    decoder = Setting()
    transform = Setting()
    on_error = Setting()
    verify_checksums = Setting()
    _checked_at: int | None = None  # the position's generation the latest version was checked at

    def __init__(  # noqa: PLR0913 - keyword settings with defaults, as a DataLoader's
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
        parallel: Parallel | None = None,
        on_error: str = "raise",
        verify_checksums: bool = False,
        storage: StorageSettings | None = None,
        storage_options: dict[str, Any] | None = DEFAULT,
        cache_dir: str | os.PathLike[str] | None = DEFAULT,
        cache_limit: int | str | None = DEFAULT,
        prefetch: int | str = DEFAULT,
        retries: int = DEFAULT,
        timeout: float | None = DEFAULT,
        version: int | None = None,
        on_new_version: OnNewVersion = "stay",
    ):
        choice = VersionChoice(on_new_version)
        if choice.follows and not isinstance(url_or_urls, (str, os.PathLike)):
            raise UsageError(
                "on_new_version='next_epoch' follows a dataset's versions: give the folder or URL of "
                "a dataset with a manifest, not a list of tars"
            )
        if on_error not in ("raise", "skip"):
            raise UsageError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch_size must be at least 1, not {batch_size}")
        storage = StorageSettings.combine(
            storage,
            options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            prefetch=prefetch,
            retries=retries,
            timeout=timeout,
        )
        self._stored = open_stored(url_or_urls, storage, version)
        manifest = self.manifest
        decoder = Decoder(decode, fields, written_types(manifest))
        decoder.check_fields([f["name"] for f in manifest.fields if "name" in f], self.store.url)
        self._settings = ReadSettings(
            shuffle=shuffle,
            seed=int(seed),
            window=resolve_window(
                shuffle_window,
                self.sample_set.per_shard,
                manifest.nbytes,
                remote=not self.store.local,
            ),
            drop_last=drop_last,
            collate_fn=collate_fn or collate,
            verify_checksums=bool(verify_checksums),
            decoder=decoder,
            transform=transform,
            on_error=on_error,
        )
        if manifest.shard_format in ("arrow", "parquet"):
            import pyarrow.compute  # noqa: F401 - take() loads it lazily, inside the first batch otherwise
        self.sample_reader = SampleReader(self.store, self.sample_set)
        self._start_planning(rank, world_size, batch_size, parallel)
        # after the first reset: __init__ opened the version asked for
        self._opened_as = OpenedAs(url_or_urls, shuffle_window, choice)
        choice.choose(manifest.version)

    # -- which version it reads (see .following) ---------------------------------------------------
    def _reopen(self, version: int | None) -> None:
        """Read ``version`` (``None``: the latest) from now on, in this process; nothing changes if that
        is the manifest it reads."""
        opened = self._opened_as
        stored = open_stored(opened.url, self.storage, version)
        m = stored.manifest
        if m.version == self.manifest.version and m.fingerprint == self.manifest.fingerprint:
            return
        # not through the settings' refusal: a loader may read this dataset, and this is an epoch's start
        self._stored = stored
        self._settings = dataclasses.replace(
            self._settings,
            window=resolve_window(
                opened.shuffle_window,
                stored.samples.per_shard,
                m.nbytes,
                remote=not stored.store.local,
            ),
        )
        self.sample_reader.store, self.sample_reader.samples = stored.store, stored.samples
        self._local.shards = None
        self._order_fingerprint = None

    def _move_to(self, version: int | None) -> None:
        """Main process: every process reads ``version`` (``None``: the latest) from the next pass on."""
        self._reopen(version)
        self._opened_as.versions.choose(self.manifest.version)

    def _start_epoch_on_latest(self) -> None:
        """Main process, as a pass starts: with ``on_new_version="next_epoch"``, an epoch not begun yet
        starts on the latest version (checked once per position set)."""
        if not self._opened_as.versions.follows or self._checked_at == self.generation:
            return
        p = self._position.get()
        if self._fresh(p):
            before = self.manifest
            self._move_to(None)
            agreed = agreed_version(self.manifest.version)
            if (
                agreed != self.manifest.version
            ):  # another rank saw an older latest: all read that one
                self._move_to(agreed)
            if self.manifest is not before:
                super().reset(p.epoch)
        self._checked_at = self.generation

    def begin_pass(self) -> PassStart:
        """A loader's pass starts (main process); see :meth:`PlannedDataset.begin_pass`."""
        self._start_epoch_on_latest()
        return super().begin_pass()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``. With ``on_new_version="next_epoch"``, on the version it was saved on
        (reopened for the rest of its epoch; a state at an epoch's start starts it on the latest)."""
        follows = self._opened_as.versions.follows and not WorkerSlot.current().in_worker
        saved = state.get("dataset_version") if isinstance(state, dict) else None
        if follows and type(saved) is int and saved != self.manifest.version:
            self._move_to(saved)
        super().load_state_dict(state)
        if follows:
            self._start_epoch_on_latest()

    def __iter__(self) -> Iterator[Any]:
        if WorkerSlot.current().in_worker:
            chosen = self._opened_as.versions.other_than(self.manifest.version)
            if chosen is not None:  # the main process moved to another version
                self._reopen(chosen)
        else:
            self._start_epoch_on_latest()
        yield from super().__iter__()

    # -- where it reads from, and what the plan reads ----------------------------------------------
    @property
    def num_samples(self) -> int:
        """Samples of one epoch (:attr:`sample_set`'s)."""
        return self.sample_set.total

    @property
    def fingerprint(self) -> str:
        """The manifest's fingerprint (a sha256 over every shard's entry)."""
        return self.manifest.fingerprint

    @property
    def dataset_version(self) -> int | None:
        """The version of the dataset this reads (:attr:`Manifest.version`), recorded in resume states."""
        return self.manifest.version

    # -- what a loader needs to know ------------------------------------------------------------
    @property
    def raw(self) -> bool:
        """Batches hold stored bytes, undecoded and untransformed."""
        return self.decoder.keeps_bytes and self.transform is None

    @property
    def replaces_failures(self) -> bool:
        """Failing samples are replaced (``on_error="skip"``)."""
        return self.on_error == "skip"

    @property
    def mapped(self) -> bool:
        """Raw batches of local, uncompressed tars travel as locations in the shard files (the
        default collate only: a ``collate_fn`` of the user's gets the samples). Not for a merge that
        relabels classes: a label must be read to be mapped, so its batches hold bytes."""
        return (
            self.raw
            and self.store.local
            and self.manifest.shard_format == "tar"
            and not self.sample_set.relabels
            and self.default_collate
        )

    @property
    def columnar(self) -> bool:
        """Arrow and Parquet rows go to batches column by column, with no per-row Python."""
        return (
            self.manifest.shard_format in ("arrow", "parquet")
            and self.transform is None
            and self.default_collate
            and self.decoder.select is None
            and (self.decoder.keeps_bytes or not _has_binary_fields(self.manifest))
        )

    @property
    def default_collate(self) -> bool:
        """Batches are made by :func:`shardstream.dataset.batches.collate.collate` (which a transport can send cheaply)."""
        return self.collate_fn is collate

    @property
    def skipped(self) -> int:
        """Samples replaced under ``on_error="skip"`` by this dataset, in this process and its DataLoader
        workers together (counted as workers read them; set it to 0 to count afresh)."""
        return self.sample_reader.skipped

    @skipped.setter
    def skipped(self, value: int) -> None:
        self.sample_reader.skipped = int(value)

    @property
    def counters(self) -> Counters:
        """Stage times and counts of every process reading this dataset (see :mod:`.counters`)."""
        return self.sample_reader.counters

    @Fixed
    def prefetch(self) -> int:
        """Bytes each worker downloads ahead (``storage.prefetch``)."""
        return self.storage.prefetch_bytes

    def describe(self, shard: int, sample: int) -> str:
        return f"{self.store.url_of(self.manifest.paths[shard])}: {sample_name(sample)}"

    def worker_parts(self) -> dict[str, Any]:
        """The user's code that DataLoader workers run, by a label for messages ("the transform")."""
        parts: dict[str, Any] = {
            "the transform": self.transform,
            "the decode function": self.decoder.whole,
        }
        for name, how in self.decoder.fields.items():
            if callable(how):
                parts[f"the decoder of field {name!r}"] = how
        return {**parts, **super().worker_parts()}

    def batches_per_chunk(self, batch_size: int, num_workers: int) -> int:
        """Raw-bytes batches are cheap to make and dear to send (a fixed cost per transfer), so workers
        send about 8 MB at a time and the loader cuts it back into batches; decoded batches are large
        already, mapped ones a few kilobytes of locations, and remote ones wait for downloads (a pass's
        first batch would wait for its whole chunk of ranged reads)."""
        if (
            num_workers == 0
            or not self.raw
            or self.mapped
            or not self.default_collate
            or not self.store.local
        ):
            return 1
        per_sample = max(self.manifest.total_bytes / max(self.manifest.num_samples, 1), 1)
        return int(min(max(_CHUNK_BYTES // (batch_size * per_sample), 1), 16))

    def batch_bytes(self, samples: int) -> int:
        """Bytes of ``samples`` stored samples, from the manifest (tar headers and padding left out)."""
        m = self.manifest
        per_sample = m.total_bytes / max(m.num_samples, 1)
        if m.shard_format.startswith("tar"):
            # a 512-byte header and ~256 bytes of padding per member
            per_sample -= 768 * max(len(m.fields), 1)
        return int(max(per_sample, 0) * samples)

    # -- reading (worker processes, or the main one) -------------------------------------
    def read_pass(self, run: PassRun) -> Iterator[Any]:
        batched = self.batch_size is not None
        self.decoder.collated = batched and self.transform is None and self.default_collate
        # where random media clips start: from (seed, epoch, key)
        self.decoder.begin_pass(run.seed, run.position.epoch)
        shards = self.open_shards()
        shards.forget_failures()
        with ShardPass(
            run,
            self.sample_set,
            shuffle=self.shuffle,
            window=self.window,
            shards=shards,
            stored=self.stored,
            look_ahead=self.manifest.shard_format != "tar",
        ) as pass_:
            self.sample_reader.begin(
                self.decoder,
                self.transform,
                self.on_error,
                self.raw,
                pass_.candidates,
                self.decoder.collated,
            )
            yield from self._batches(pass_.chunks(), shards, run)

    def _batches(self, chunks: Iterator[Chunk], shards: OpenShards, run: PassRun) -> Iterator[Any]:
        batched = self.batch_size is not None
        mapped, columnar, reader = self.mapped, self.columnar, self.sample_reader
        for position, ids, offsets in chunks:
            run.reseed_for(position)
            if columnar and batched:
                yield run.emit(
                    functools.partial(reader.load_columns, shards, ids, offsets), ship=False
                )
            elif (
                mapped
                and batched
                and (found := reader.load_mapped(shards, ids, offsets)) is not None
            ):
                yield found  # locations in the shard files: nothing to check or send
            elif not batched:
                yield reader.load(shards, ids, offsets, batched)[0]
            else:
                samples = reader.load(shards, ids, offsets, batched)
                yield run.emit(functools.partial(reader.collate, self.collate_fn, samples))

    def open_shards(self) -> OpenShards:
        """The shards this process has open (made once per process, and again if ``verify_checksums``
        changed), holding as many as one shuffle window reads."""
        verify, shards = self._local.shards or (None, None)
        if shards is None or verify != self.verify_checksums:
            fetcher = ShardFetcher(
                self.store, self.manifest, self.disk_cache, verify_local=self.verify_checksums
            )
            shards = CountedShards(
                self.store,
                self.manifest,
                fetcher=fetcher,
                counters=self.sample_reader.counters,
                index_cache=self.storage.disk_cache,
            )
            self._local.shards = (self.verify_checksums, shards)
        shards.fit_window(self.window if self.shuffle else 1)  # as many open as one window reads
        return shards


def _has_binary_fields(manifest: Any) -> bool:
    # binary columns, and structs holding them (a Hugging Face Image is {bytes: binary, path: string})
    return any("binary" in str(f.get("type")) for f in manifest.fields)


__all__ = ["LoaderSetup", "ShardDataset"]
