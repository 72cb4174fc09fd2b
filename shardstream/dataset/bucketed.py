"""``Bucketed``: batches whose samples share a bucket (an aspect ratio, a size, a length, a class).

Each window of samples is grouped by bucket (:func:`shardstream.plan.packing.bucket_batches`) and each
bucket cut into batches of ``batch_size``; the key of a sample is a number it holds (a field such as
``cls`` or a length) or one read from a value without decoding it: :func:`image_size` and
:func:`aspect_ratio` read an image's width and height from its header (Pillow's lazy open reads the
header only), or from a decoded image's shape.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from ..plan.packing import bucket_batches, bucket_of, split_largest
from .collate import collate
from .windowed import WindowedBatches


def image_size(value: Any) -> tuple[int, int]:
    """(width, height) of an image: encoded bytes (from the header, without decoding the pixels), a
    PIL image, a CHW torch tensor or an HWC numpy array."""
    if isinstance(value, (bytes, bytearray, memoryview)):
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


def aspect_ratio(field: str) -> Callable[[dict[str, Any]], float]:
    """A key: the width / height of the image in ``field``."""

    def key(sample: dict[str, Any]) -> float:
        width, height = image_size(sample[field])
        return width / max(height, 1)

    key.__name__ = f"aspect_ratio({field!r})"
    return key


def length_of(field: str) -> Callable[[dict[str, Any]], int]:
    """A key: the length of the sequence in ``field``."""

    def key(sample: dict[str, Any]) -> int:
        return len(sample[field])

    key.__name__ = f"length_of({field!r})"
    return key


def _value(sample: Any, key: str | Callable[[Any], Any]) -> float:
    value = key(sample) if callable(key) else sample[key]
    if isinstance(value, torch.Tensor):
        value = value.item()
    return float(value)


class Bucketed(WindowedBatches):
    """Batches of up to ``batch_size`` samples of one bucket each.

    Args:
        dataset: a :class:`ShardDataset` or :class:`MixedDataset`.
        key: a field name holding a number (``"cls"``), or a callable of the sample dict
            (:func:`aspect_ratio`, :func:`length_of`, or your own).
        boundaries: increasing edges: bucket ``b`` holds keys in ``[boundaries[b-1], boundaries[b])``;
            ``None``: each distinct key is a bucket (classes).
        batch_size: the most samples per batch.
        window: samples grouped together; larger windows leave fewer short batches (each bucket's last
            batch of a window may be short).
        collate_fn: makes the batch (default: :func:`shardstream.dataset.collate.collate`); batches
            also hold ``__bucket__``.
        num_workers, loader_kwargs: for ``dataset.loader``.

    Every sample of the epoch is in exactly one batch; every rank yields the same number of batches
    (a rank that needs fewer halves its largest batches); batch sizes vary up to ``batch_size``.
    """

    def __init__(  # noqa: PLR0913 - keyword settings with defaults, as LengthBucketing's
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
            raise ValueError(f"batch_size must be 1 or more, not {batch_size!r}")
        self.key, self.batch_size = key, batch_size
        self.boundaries = None if boundaries is None else [float(b) for b in boundaries]
        if self.boundaries is not None:
            bucket_of(np.zeros(0), self.boundaries)  # checks that they increase
        self.collate_fn = collate_fn or collate
        super().__init__(dataset, window, num_workers, loader_kwargs)

    def buckets(self, samples: list[Any]) -> np.ndarray:
        """The bucket of each sample (with ``boundaries=None``: its key, as an integer)."""
        values = np.array([_value(s, self.key) for s in samples], dtype=np.float64)
        if self.boundaries is not None:
            return bucket_of(values, self.boundaries)
        return values.astype(np.int64)

    def plan(self, samples: list[Any]) -> list[np.ndarray]:
        """The window's batches; ``last_buckets`` keeps each of its samples' bucket."""
        buckets = self.buckets(samples)
        self.last_buckets = buckets
        return bucket_batches(buckets, self.batch_size)

    def fit(self, groups: list[np.ndarray], count: int) -> list[np.ndarray]:
        return split_largest(groups, count)

    def make(self, samples: list[Any], group: np.ndarray) -> Any:
        batch = self.collate_fn([samples[i] for i in group.tolist()])
        if isinstance(batch, dict):
            batch["__bucket__"] = int(self.last_buckets[int(group[0])])
        return batch


__all__ = ["Bucketed", "aspect_ratio", "image_size", "length_of"]
