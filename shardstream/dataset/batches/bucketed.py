"""``Bucketed``: batches whose samples share a bucket (an aspect ratio, a size, a length, a class).

Where image sizes were recorded at pack time, the epoch is planned from them up front
(:mod:`.bucket_plan`). Otherwise each pool of samples is grouped by bucket (:func:`shardstream.plan.bins.bucket_batches`) and each
bucket cut into batches of ``batch_size``; the key of a sample is a number it holds (a field such as
``cls`` or a length) or one read from a value without decoding it: :func:`image_size` and
:func:`aspect_ratio` read an image's width and height from its header (Pillow's lazy open reads the
header only), or from a decoded image's shape.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import UsageError
from ...formats.image_header import image_size as header_size
from ...formats.media_header import media_header
from ...plan.bins import bucket_batches, bucket_of, cut_largest
from ..shards.mapped import MappedBytes
from .bucket_plan import PlannedBuckets, recorded_durations, recorded_sizes
from .collate import collate
from .pooled import PooledBatches, pool_of, pool_samples


def image_size(value: Any) -> tuple[int, int]:
    """(width, height) of an image: encoded bytes (from the header, without decoding the pixels: a
    header parser for JPEG, PNG, GIF, BMP and WebP, else Pillow's lazy open), a PIL image, a CHW torch
    tensor or an HWC numpy array."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        found = header_size(value)
        if found is not None:
            return found
        from PIL import Image

        with Image.open(io.BytesIO(value)) as image:  # lazy: reads the header only
            return image.size
    if isinstance(value, torch.Tensor):
        return int(value.shape[-1]), int(value.shape[-2])
    if isinstance(value, np.ndarray):
        return int(value.shape[1]), int(value.shape[0])
    if hasattr(value, "size") and isinstance(value.size, tuple):
        return value.size
    raise UsageError(f"cannot tell the size of a {type(value).__name__} as an image")


@dataclass(frozen=True)
class aspect_ratio:  # a key, used like a function
    """A key: the width / height of the image in ``field`` (from its header when it is encoded).

    Args:
        field: the sample's image field (``"jpg"``).
    """

    field: str

    def __call__(self, sample: dict[str, Any]) -> float:
        width, height = image_size(sample[self.field])
        return width / max(height, 1)

    def from_size(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """The key of images of these widths and heights (from sizes recorded at pack time)."""
        return width.astype(np.float64) / np.maximum(height, 1).astype(np.float64)


@dataclass(frozen=True)
class image_area:  # a key, used like a function
    """A key: the width × height, in pixels, of the image in ``field`` (from its header when it is
    encoded): buckets of similar size, for resolution-dependent batch sizes or crops.

    Args:
        field: the sample's image field (``"jpg"``).
    """

    field: str

    def __call__(self, sample: dict[str, Any]) -> float:
        width, height = image_size(sample[self.field])
        return float(width * height)

    def from_size(self, width: np.ndarray, height: np.ndarray) -> np.ndarray:
        """The key of images of these widths and heights (from sizes recorded at pack time)."""
        return width.astype(np.float64) * height.astype(np.float64)


@dataclass(frozen=True)
class duration:  # a key, used like a function
    """A key: the duration in seconds of the video or recording in ``field``.

    ``Bucketed`` plans the whole epoch from the durations recorded at pack time (the dataset's media
    facts), decoding nothing; a dataset without them for ``field`` is an error naming the fix. Called on
    a sample, it reads the duration from the encoded value's container headers.

    Args:
        field: the sample's video or audio field (``"wav"``, ``"mp4"``).
    """

    field: str

    def __call__(self, sample: dict[str, Any]) -> float:
        value = sample[self.field]
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise UsageError(
                f"duration({self.field!r}) reads encoded media, not a {type(value).__name__}; "
                f"read the field with decode={{{self.field!r}: None}}"
            )
        found = media_header(value, self.field.rsplit(".", 1)[-1].lower())
        if found is None or found.duration <= 0:
            raise ValueError(
                f"sample {sample.get('__key__')!r}: the headers of its {self.field!r} do not give "
                "its duration"
            )
        return found.duration


@dataclass(frozen=True)
class length_of:  # a key, used like a function
    """A key: the length of the sequence in ``field``.

    Args:
        field: the sample's sequence field (``"input_ids"``).
    """

    field: str

    def __call__(self, sample: dict[str, Any]) -> int:
        return len(sample[self.field])


def _value(sample: Any, key: str | Callable[[Any], Any]) -> float:
    value = key(sample) if callable(key) else sample[key]
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode()  # an undecoded number (a cls field read raw)
    return float(value)


KEYS = "__keys__"


@dataclass
class KeyedPool:
    """A pool's samples and each one's key (computed in the DataLoader worker)."""

    samples: Sequence[Any]
    keys: np.ndarray


def keyed_pool(key: str | Callable[[Any], Any], samples: list[Any]) -> dict[str, Any]:
    """The pool's samples (as :func:`pool_of` ships them) with their keys: computed in the worker,
    next to the read, so the main process only groups numbers."""
    keys = np.array([_value(s, key) for s in samples], dtype=np.float64)
    return {**pool_of(samples), KEYS: keys}


def _mapped_keys(batch: dict[str, Any], key: str | Callable[[Any], Any]) -> np.ndarray:
    """The key of each sample of a batch of locations (:class:`MappedBytes`): each value viewed in place,
    an image's header read without a copy of the rest; a stored value's length from the locations alone."""
    n = len(batch["__key__"])
    field = key if isinstance(key, str) else getattr(key, "field", None)
    value = batch.get(field) if field is not None else None
    if isinstance(key, length_of) and isinstance(value, MappedBytes):
        return value.sizes.astype(np.float64)  # the stored bytes' length: no read at all
    if isinstance(key, (aspect_ratio, image_area)) and isinstance(value, MappedBytes):
        view = value.view  # each image's header read in place
        sizes = np.array([image_size(view(i)) for i in range(n)], dtype=np.float64).reshape(n, 2)
        return key.from_size(sizes[:, 0], sizes[:, 1])
    if isinstance(key, str) and isinstance(value, MappedBytes):
        return np.array([_value({field: value.view(i)}, key) for i in range(n)], dtype=np.float64)
    views = {
        name: (value.view if isinstance(value, MappedBytes) else value.__getitem__)
        for name, value in batch.items()
    }
    return np.array(
        [_value({name: view(i) for name, view in views.items()}, key) for i in range(n)],
        dtype=np.float64,
    )


def _as_bytes(sample: Any) -> Any:
    """A pool's sample with its raw values (views of the pool's memory) as ``bytes``."""
    if not isinstance(sample, dict):
        return sample
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()}


def _take(value: Any, rows: np.ndarray) -> Any:
    """Rows ``rows`` of a batch's field: locations stay locations, arrays are indexed, lists picked."""
    if isinstance(value, MappedBytes):
        ids = value.identities
        return MappedBytes(
            value.paths, value.shards[rows], value.starts[rows], value.sizes[rows], ids
        )
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return value[torch.from_numpy(rows) if isinstance(value, torch.Tensor) else rows]
    return [value[i] for i in rows.tolist()]


class Bucketed(PooledBatches):
    """Batches of up to ``batch_size`` samples of one bucket each.

    Args:
        dataset: a :class:`ShardDataset` or :class:`MixedDataset`.
        key: a field name holding a number (``"cls"``), or a callable of the sample dict
            (:func:`aspect_ratio`, :func:`duration`, :func:`length_of`, or your own).
        boundaries: increasing edges: bucket ``b`` holds keys in ``[boundaries[b-1], boundaries[b])``;
            ``None``: each distinct key is a bucket (classes).
        batch_size: the most samples per batch.
        window: the pool's size, the samples grouped together; larger pools leave fewer short
            batches (each bucket's last batch of a pool may be short).
        collate_fn: makes the batch (default: :func:`shardstream.dataset.batches.collate.collate`); batches
            also hold ``__bucket__``. Raw batches of local tars (``decode=None``, the default collate)
            stay locations in the shard files (:class:`MappedBytes`): each value's key is read in
            place, and no value is copied.
        num_workers: for ``dataset.loader``.
        loader_kwargs: other arguments of ``dataset.loader``.

    Every sample of the epoch is in exactly one batch; every rank yields the same number of batches
    (a rank that needs fewer halves its largest batches); batch sizes vary up to ``batch_size``.

    With an :func:`aspect_ratio` or :func:`image_area` key over a :class:`ShardDataset` whose manifest records the image
    sizes of its field (``pack`` and ``shardstream index`` record them; no ``transform``; a split part
    plans from its selected samples' sizes), the whole epoch is planned from them before anything is read
    (:mod:`shardstream.dataset.batches.bucket_plan`; ``window`` is then unused) and resumes exactly on any
    world size; :attr:`planned_up_front` says so. Otherwise buckets are found per pool as read.
    A :func:`duration` key is always planned, from the media facts recorded at pack time; a dataset
    without them for its field (or with a ``transform``, which a planned read does not apply) is an
    error naming the fix. Decoded audio of varying length is batched by a ``collate_fn`` such as
    :class:`~shardstream.dataset.batches.collate.AudioCollate`.
    """

    def __init__(  # keyword settings with defaults, as LengthBucketing's
        self,
        dataset: Any,
        key: str | Callable[[Any], Any],
        boundaries: Sequence[float] | None = None,
        batch_size: int = 32,
        *,
        window: int = 1024,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int | None = None,
        **loader_kwargs: Any,
    ):
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise UsageError(f"batch_size must be 1 or more, not {batch_size!r}")
        self.key, self.batch_size = key, batch_size
        self.boundaries = None if boundaries is None else [float(b) for b in boundaries]
        if self.boundaries is not None:
            bucket_of(np.zeros(0), self.boundaries)  # checks that they increase
        self.collate_fn = collate_fn or collate
        self.planned = _planned(self, dataset, num_workers, loader_kwargs)
        if self.planned is not None:
            self.dataset, self.window, self.in_place = dataset, window, False
            return
        # raw local tars: pools of locations, grouped without copying a value
        self.in_place = collate_fn is None and bool(dataset.mapped)
        keyed = None if self.in_place else functools.partial(keyed_pool, key)
        super().__init__(dataset, window, num_workers, loader_kwargs, collate=keyed)

    # -- planned from recorded sizes, or per pool -------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        return iter(self.planned) if self.planned is not None else super().__iter__()

    def set_epoch(self, epoch: int) -> None:
        if self.planned is not None:
            self.planned.set_epoch(epoch)
        else:
            super().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where to go on: planned, the batches read per rank (and on what world size); else the pool's."""
        return self.planned.state_dict() if self.planned is not None else super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (one saved by a ``Bucketed`` planned the same way)."""
        if (self.planned is not None) != ("planned" in state):
            raise UsageError(
                "this resume state was saved by a Bucketed "
                + (
                    "planned per window"
                    if self.planned is not None
                    else "planned from recorded sizes"
                )
                + "; resume with the same dataset (with or without recorded image sizes) and key"
            )
        if self.planned is not None:
            self.planned.load_state_dict(state)
        else:
            super().load_state_dict(state)

    @property
    def planned_up_front(self) -> bool:
        """Whether the epoch's batches were planned from sizes recorded at pack time (no pools read)."""
        return self.planned is not None

    def received(self, pool: Any) -> Any:
        """A pool of locations as it is; one made by :func:`keyed_pool`: its samples and keys."""
        if isinstance(pool, dict) and KEYS in pool:
            return KeyedPool(pool_samples(pool), pool[KEYS])
        return pool

    def buckets(self, keys: np.ndarray) -> np.ndarray:
        """The bucket of each key (with ``boundaries=None``: the key, as an integer)."""
        if self.boundaries is not None:
            return bucket_of(keys, self.boundaries)
        return keys.astype(np.int64)

    def plan(self, samples: KeyedPool | dict[str, Any]) -> list[np.ndarray]:
        """The pool's batches; ``last_buckets`` keeps each of its samples' bucket."""
        keys = samples.keys if isinstance(samples, KeyedPool) else _mapped_keys(samples, self.key)
        buckets = self.buckets(keys)
        self.last_buckets = buckets
        return bucket_batches(buckets, self.batch_size)

    def fit(self, groups: list[np.ndarray], count: int) -> list[np.ndarray]:
        return cut_largest(groups, count)

    def make(self, samples: KeyedPool | dict[str, Any], group: np.ndarray) -> Any:
        if isinstance(samples, dict):
            batch = {name: _take(value, group) for name, value in samples.items()}
        else:
            chosen = [samples.samples[i] for i in group.tolist()]
            if self.collate_fn is not collate:  # the user's: raw values as bytes, as they were read
                chosen = [_as_bytes(s) for s in chosen]
            batch = self.collate_fn(chosen)
        if isinstance(batch, dict):
            batch["__bucket__"] = int(self.last_buckets[int(group[0])])
        return batch


def _planned(
    shape: Bucketed, dataset: Any, num_workers: int | None, loader_kwargs: dict[str, Any]
) -> PlannedBuckets | None:
    """The whole epoch planned from recorded image sizes, where the dataset has them for the key's field,
    or from recorded durations (which a :func:`duration` key requires)."""
    if isinstance(shape.key, duration):
        keys = recorded_durations(dataset, shape.key.field)
    elif isinstance(shape.key, (aspect_ratio, image_area)):
        sizes = recorded_sizes(dataset, shape.key.field)
        if sizes is None:
            return None
        keys = shape.key.from_size(*sizes)
    else:
        return None
    planned = PlannedBuckets(
        dataset, shape.buckets(keys), shape.batch_size, shape.collate_fn, num_workers, loader_kwargs
    )
    if planned.map.manifest.fingerprint != dataset.manifest.fingerprint:
        if isinstance(shape.key, duration):
            raise UsageError(
                f"duration({shape.key.field!r}): {dataset.store.url} now holds another version than "
                "the one the dataset reads; open the dataset again"
            )
        return None  # another version of the dataset than the one it reads
    return planned


__all__ = [
    "Bucketed",
    "KeyedPool",
    "aspect_ratio",
    "duration",
    "image_area",
    "image_size",
    "keyed_pool",
    "length_of",
]
