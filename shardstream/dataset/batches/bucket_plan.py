"""Bucketed batches planned for the whole epoch from image sizes recorded at pack time.

Where a dataset's manifest names recorded image sizes (:mod:`shardstream.manifest.image_sizes`) for the
field of an :func:`~shardstream.dataset.batches.bucketed.aspect_ratio` or
:func:`~shardstream.dataset.batches.bucketed.image_area` key, every sample's bucket is known before
anything is read: the epoch's batches come from :func:`shardstream.plan.buckets.epoch_batches` (the same
for any world size and worker count), each rank's from :func:`~shardstream.plan.buckets.rank_batches`,
and a DataLoader reads each batch's samples by index (:class:`~shardstream.dataset.shard_map.ShardMap`,
decoded as the dataset decodes them). The resume state is the batches read per rank and on what world
size, so a resume on another world size is exact too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from ...errors import UsageError
from ...host import loader_workers
from ...manifest.image_sizes import read_image_sizes
from ...manifest.media_facts import read_media_facts
from ...plan.buckets import epoch_batches, rank_batches
from ..shard_dataset import ShardDataset
from ..shard_map import ShardMap
from .collate import collate

log = logging.getLogger("shardstream")


def recorded_sizes(dataset: Any, field: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Every sample's (width, height) of ``field``, in the order of the dataset's samples, from the
    recorded sizes (one per stored sample: a split takes its selected ones); None where the plan cannot
    come from them (no sizes recorded for ``field``, a sample without one, a transform that may change
    the image). A size file that does not match the manifest is an error naming it."""
    if not isinstance(dataset, ShardDataset) or dataset.transform is not None:
        return None
    m, samples = dataset.manifest, dataset.sample_set
    if m.image_sizes is None or field not in m.image_sizes.fields:
        return None
    sizes = read_image_sizes(
        m.image_sizes.reference, dataset.store.read_bytes, m.paths, m.stored_counts
    )
    widths, heights = sizes.widths[field], sizes.heights[field]
    if samples.selected:  # the stored samples the split reads, in the dataset's order
        picked = samples.stored_numbers()
        widths, heights = widths[picked], heights[picked]
    if len(widths) == 0 or not (widths > 0).all():
        log.info(
            "%s: %d samples have no recorded size of %r; buckets are found as the samples are read",
            dataset.store.url,
            int((widths == 0).sum()),
            field,
        )
        return None
    return widths, heights


def recorded_durations(dataset: Any, field: str) -> np.ndarray:
    """Every sample's duration in seconds of the video or audio ``field``, in the order of the dataset's
    samples, from the media facts recorded at pack time (a split takes its selected samples'). A dataset
    the plan cannot come from (not a ``ShardDataset``, one with a ``transform``, no facts recorded for
    ``field``, a sample without a recorded duration) is a one-line :class:`UsageError` naming the fix."""
    name = f"duration({field!r})"
    if not isinstance(dataset, ShardDataset):
        raise UsageError(
            f"{name} plans the epoch from the durations recorded in a ShardDataset's manifest, which a "
            f"{type(dataset).__name__} does not have; bucket a ShardDataset"
        )
    if dataset.transform is not None:
        raise UsageError(
            f"{name} plans the epoch from recorded durations and reads each batch by index, without "
            "the dataset's transform; drop the transform and do its work in collate_fn"
        )
    m, samples, url = dataset.manifest, dataset.sample_set, dataset.store.url
    if m.media is None or field not in m.media.fields:
        recorded = f" (it records {', '.join(m.media.fields)})" if m.media is not None else ""
        raise UsageError(
            f"{name}: {url} records no media facts for {field!r}{recorded}; re-pack it with PyAV "
            "installed (pip install 'shardstream[media]') and without --no-image-sizes "
            f"(image_sizes=False), or run `shardstream index {url} --overwrite`"
        )
    seconds = read_media_facts(m.media.reference, dataset.store.read_bytes, m.stored_counts)
    seconds = seconds.columns[field]["duration"]
    picked = samples.stored_numbers() if samples.selected else np.arange(len(seconds))
    unknown = picked[seconds[picked] <= 0]
    if len(unknown):
        starts = np.cumsum(m.stored_counts)
        shard = int(np.searchsorted(starts, unknown[0], side="right"))
        offset = int(unknown[0]) - (int(starts[shard - 1]) if shard else 0)
        raise UsageError(
            f"{name}: {len(unknown)} samples of {url} have no recorded duration of {field!r} (the "
            f"first: sample {offset} of shard {m.paths[shard]}): they lack the field or its headers "
            "do not read; re-pack without them"
        )
    return seconds[picked]


CHUNK = 8  # batches a worker reads and sends at once (one trip through the DataLoader's queues)


def chunk_bounds(batches: int) -> list[int]:
    """Where each chunk of batches starts (and the end): 1, 2, 4, then ``CHUNK`` batches a chunk, so the
    first batch waits for one read only."""
    bounds, size = [0], 1
    while bounds[-1] < batches:
        bounds.append(min(bounds[-1] + size, batches))
        size = min(2 * size, CHUNK)
    return bounds


_SHARD_LOADER_ONLY = frozenset({"seed_workers", "shm_check", "worker_tracebacks", "workers"})


def default_workers(dataset: Any) -> int:
    """Workers when none are asked for, as the dataset's loader chooses: at most one for raw local tars
    (the batches are locations), else :func:`shardstream.host.loader_workers`."""
    return min(loader_workers(), 1) if dataset.mapped else loader_workers()


class _PlannedReads(Dataset):
    """Chunk ``k`` of the rank's planned batches (:func:`chunk_bounds`), read in a DataLoader worker: over
    raw local tars as locations in the shard files (:class:`MappedBytes`, as a plain raw batch: nothing
    copied), else each batch's samples read by index (``ShardMap``, decoded as the dataset decodes) and
    collated."""

    def __init__(
        self,
        dataset: ShardDataset,
        samples: ShardMap,
        batches: Sequence[np.ndarray],
        collate_fn: Callable[[list[Any]], Any],
        mapped: bool,
    ):
        self.dataset, self.samples, self.batches = dataset, samples, batches
        self.collate_fn, self.mapped = collate_fn, mapped
        self.bounds = chunk_bounds(len(batches))

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, k: int) -> list[Any]:
        return [self.read(rows) for rows in self.batches[self.bounds[k] : self.bounds[k + 1]]]

    def read(self, rows: np.ndarray) -> Any:
        """One batch: the samples at ``rows`` (indices in manifest order)."""
        if self.mapped:
            samples = self.dataset.sample_set
            shards, offsets = samples.locate_many(rows)
            found = self.dataset.sample_reader.load_mapped(
                self.dataset.open_shards(), shards, samples.stored_rows(shards, offsets)
            )
            if found is not None:
                return found
        return self.collate_fn(self.samples.__getitems__(rows.tolist()))


def _as_read(batches: Any) -> Any:
    return batches  # each item is a chunk of whole batches already


class PlannedBuckets:
    """The planned path of :class:`~shardstream.dataset.batches.bucketed.Bucketed` (see the module's notes)."""

    def __init__(  # Bucketed's settings, passed on
        self,
        dataset: ShardDataset,
        buckets: np.ndarray,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any],
        num_workers: int | None,
        loader_kwargs: dict[str, Any],
    ):
        self.dataset, self.buckets, self.batch_size = dataset, buckets, batch_size
        self.collate_fn = collate_fn
        self.num_workers = default_workers(dataset) if num_workers is None else int(num_workers)
        # a DataLoader's own arguments (pin_memory, prefetch_factor, ...); the ShardLoader's are its own
        self.loader_kwargs = {k: v for k, v in loader_kwargs.items() if k not in _SHARD_LOADER_ONLY}
        self.map = ShardMap(  # the version the dataset reads, not the latest
            dataset.store.url,
            decode=None,
            storage=dataset.storage,
            version=dataset.manifest.version,
        )
        self.map.decoder = dataset.decoder  # decoded as the dataset decodes
        self.epoch = dataset.epoch
        self.consumed: list[tuple[int, int]] = []  # (batches per rank, world size) read before
        self.emitted = 0  # batches given in this stretch
        self._planned: tuple[Any, list[np.ndarray]] | None = None

    def batches(self) -> list[np.ndarray]:
        """This rank's batches still to read in the epoch (planned once per epoch and resume point)."""
        ds = self.dataset
        key = (ds.seed, self.epoch, ds.shuffle, ds.world_size, ds.rank, tuple(self.consumed))
        if self._planned is None or self._planned[0] != key:
            planned = epoch_batches(self.buckets, self.batch_size, ds.seed, self.epoch, ds.shuffle)
            self._planned = key, rank_batches(planned, ds.world_size, ds.rank, self.consumed)
        return self._planned[1]

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self) -> Iterator[Any]:
        if self.emitted:  # a pass left before its end: go on after what it gave
            self.consumed.append((self.emitted, self.dataset.world_size))
            self.emitted = 0
        mine = self.batches()
        mapped = self.collate_fn is collate and self.dataset.mapped
        loader = DataLoader(
            _PlannedReads(self.dataset, self.map, mine, self.collate_fn, mapped),
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_as_read,
            **self.loader_kwargs,
        )
        read = (batch for chunk in loader for batch in chunk)
        for group, batch in zip(mine, read):
            self.emitted += 1
            if isinstance(batch, dict):
                batch["__bucket__"] = int(self.buckets[int(group[0])])
            yield batch
        self.consumed, self.emitted = [], 0
        self.epoch += 1  # the next pass reads the next epoch unless set_epoch says otherwise

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.consumed, self.emitted = [], 0
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        consumed = [*self.consumed, (self.emitted, self.dataset.world_size)]
        return {"planned": {"epoch": self.epoch, "consumed": [list(c) for c in consumed]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        planned = state["planned"]
        self.epoch = int(planned["epoch"])
        self.consumed = [(int(k), int(w)) for k, w in planned["consumed"]]
        self.emitted = 0


__all__ = ["PlannedBuckets", "recorded_durations", "recorded_sizes"]
