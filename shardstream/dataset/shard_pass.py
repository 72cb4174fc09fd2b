"""One dataset's shards: opening the dataset, and one pass over its shards in one process.

Shared by the datasets that read one manifest's shards (``ShardDataset``, ``TokenDataset``):
:func:`open_stored` finds the dataset and its storage settings; :class:`ShardPass` turns a
:class:`~shardstream.dataset.base.PassRun` into this worker's chunks of the epoch's order, with
remote shards downloaded ahead in the order the plan reads them and passed shards let go.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import plan
from ..errors import ManifestError
from ..manifest import Manifest, open_dataset
from ..manifest.sample_set import SampleSet, samples_of
from ..storage import DiskCache, Prefetcher, Store
from ..storage.settings import StorageSettings
from .base import Fixed, PassRun
from .shards.readers import Chunk, OpenShards, RangedReads, looking_ahead, release_stale_maps


@dataclass(frozen=True)
class Stored:
    """A dataset as found in storage: the settings it is read with, its store and manifest, the samples it
    names (:func:`~shardstream.manifest.sample_set.samples_of`), and the host's shard cache (``None`` for
    local datasets, which are read in place)."""

    storage: StorageSettings
    store: Store
    manifest: Manifest
    disk_cache: DiskCache | None
    samples: SampleSet


class StoredDataset:
    """A dataset that reads one stored dataset: what it was opened from, fixed when it is made (its
    ``stored``), and these views of it."""

    _stored: Stored

    @Fixed
    def stored(self) -> Stored:
        """What the dataset was opened from: its storage, manifest and samples."""
        return self._stored

    @Fixed
    def store(self) -> Store:
        """The dataset's storage location (folder or bucket prefix)."""
        return self.stored.store

    @Fixed
    def manifest(self) -> Manifest:
        """The dataset's manifest, as read when the dataset was made."""
        return self.stored.manifest

    @Fixed
    def sample_set(self) -> SampleSet:
        """Which samples of which shard the dataset reads, with which labels (the one answer)."""
        return self.stored.samples

    @Fixed
    def storage(self) -> StorageSettings:
        """The settings remote shards are read with."""
        return self.stored.storage

    @Fixed
    def disk_cache(self) -> DiskCache | None:
        """The host's shard cache (``None`` for a local dataset, read in place)."""
        return self.stored.disk_cache


def open_stored(
    url_or_urls: str | os.PathLike[str] | Sequence[str],
    storage: StorageSettings,
    version: int | None = None,
) -> Stored:
    """The dataset at ``url_or_urls`` (a folder, a manifest, or WebDataset tars), read with ``storage``: its
    latest version, or ``version``. Read once: the dataset reads that version however many are published
    after it."""
    made: list[DiskCache] = []

    def cache() -> DiskCache:  # made once, and only for a remote dataset
        if not made:
            made.append(storage.disk_cache())
        return made[0]

    store, manifest = open_dataset(
        url_or_urls, storage.options, storage.retry, version, cache, storage.trusted_roots
    )
    samples = samples_of(manifest)
    if samples.total == 0:
        raise ManifestError(f"{store.url} holds no samples")
    release_stale_maps()  # this process's maps of shard files replaced or deleted since (a re-pack)
    return Stored(storage, store, manifest, None if store.local else cache(), samples)


class ShardPass:
    """This process's chunks of one pass: (first position, shards, stored offsets) per batch (or chunk of
    batches), from the epoch's order of the dataset's ``samples`` restricted to the rank's span; over remote shards a
    prefetcher downloads the next ones while these are read, and samples of a pass's first batches may
    come by ranged reads. Use it as a context manager: leaving it stops the downloads."""

    def __init__(
        self,
        run: PassRun,
        samples: SampleSet,
        *,
        shuffle: bool,
        window: int,
        shards: OpenShards,
        stored: Stored,
        look_ahead: bool,
    ):
        self.run, self.shards, self.window = run, shards, window
        self.samples = samples
        p = run.position
        order = plan.EpochOrder.create(samples.per_shard, run.seed, p.epoch, shuffle, window)
        # keep only this rank's shards
        self.order = order.restrict(*plan.span_bounds(p.segment, run.span))
        self.prefetcher: Prefetcher[Any] | None = None
        # fetch the next shards of this worker's plan while it reads these
        if not stored.store.local:
            nbytes = stored.manifest.nbytes
            self.prefetcher = Prefetcher(
                shards.load, lambda i: int(nbytes[i]), stored.storage.prefetch_bytes
            )
            ranged = RangedReads(
                stored.manifest, shards.fetcher, self.prefetcher, indexes=shards.indexes
            )
            shards.attach(self.prefetcher, ranged)
        # decompressed shards: let go of passed ones
        self.look_ahead = look_ahead or self.prefetcher is not None

    def candidates(self) -> Iterator[tuple[int, int]]:
        """The rank's (shard, offset) pairs in order: stand-ins for samples that fail before any loads."""
        p, span = self.run.position, self.run.span
        for start in range(span[0], span[1], 64):
            idx = np.arange(start, min(start + 64, span[1]))
            yield from zip(
                *self._in_shards(*self.order.samples(plan.segment_positions(p.segment, idx)))
            )

    def chunks(self) -> Iterator[Chunk]:
        """This worker's chunks, in the plan's order."""
        planned: Iterable[Chunk] = self._planned()
        if self.look_ahead:
            run = self.run
            depth = -(-2 * self.window // (run.chunk * run.slot.count)) + 1
            planned = looking_ahead(planned, depth, self.prefetcher, self.shards)
        return iter(planned)

    def _planned(self) -> Iterator[Chunk]:
        for positions in self.run.positions():
            yield (int(positions[0]), *self._in_shards(*self.order.samples(positions)))

    def _in_shards(self, shards: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The plan's offsets as stored offsets in the shards (a split's selection maps them)."""
        return shards, self.samples.stored_rows(shards, offsets)

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.shards.detach()

    def __enter__(self) -> ShardPass:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ShardPass", "Stored", "StoredDataset", "open_stored"]
