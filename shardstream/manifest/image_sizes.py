"""Each sample's image width and height, recorded at pack time in a side file the manifest names.

``pack`` (and ``shardstream index``, for tars packed before) reads the width and height of every image
field (``jpg``, ``jpeg``, ``png``, ``gif``, ``bmp``, ``webp``) **from its header**
(:mod:`shardstream.formats.image_header`, never decoding a pixel) and writes them once per dataset to
``.shardstream/image_sizes-<16 hex>-<16 hex>.npy`` (:mod:`.side_names`); ``image_sizes`` in the manifest's head names it
(``{file, sha256, fields, samples}``). The file is a flat NumPy ``uint32`` array: the number of shards
``n``, the number of fields ``k``, each shard's sample count, then per field every sample's width, then
every sample's height (samples in manifest order). 0 means unknown (the sample lacks the field, or its
header does not parse). 8 bytes per sample and field; read only by what plans from it
(:class:`~shardstream.dataset.batches.bucketed.Bucketed`), never by a plain read.

Older readers ignore the head's key; the shards and their sample indexes are unchanged. The file
is untrusted input: its sha256 is checked before it is parsed (``allow_pickle=False``), and its sample
count per shard against the manifest's, naming the first shard that differs.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from ..errors import ManifestError
from ..formats.image_header import image_size
from ..formats.media_header import media_kind
from .media_facts import ShardMedia
from .side_arrays import encode_array, load_array
from .side_names import side_name_fits

SIZES_PREFIX, SIZES_SUFFIX = "image_sizes-", ".npy"
# fields whose values are encoded images: the last part of the field's name
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "gif", "bmp", "webp"})
_LIMIT = (1 << 32) - 1


def is_image_field(name: str) -> bool:
    """Whether field ``name`` holds encoded images (``jpg``, ``left.png``, ...)."""
    return name.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS


def header_size(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(width, height) of an encoded image from its header; (0, 0) where it does not parse."""
    try:
        found = image_size(data)
    # a header cut short: unknown, not an error
    except (ValueError, IndexError, TypeError, struct.error):
        found = None
    if found is None or not (0 < found[0] <= _LIMIT and 0 < found[1] <= _LIMIT):
        return 0, 0
    return int(found[0]), int(found[1])


class ShardSizes:
    """What a writer records of one shard: per image field, each sample's (width, height)."""

    def __init__(self) -> None:
        self.samples = 0
        self.found: dict[str, list[tuple[int, tuple[int, int]]]] = {}
        # field -> 1: images, 2: video or audio, 0: neither
        self._kinds: dict[str, int] = {}
        self.media = ShardMedia()  # video and audio fields' header facts (manifest.media)

    def record(self, name: str, data: bytes | bytearray | memoryview) -> None:
        """Record field ``name`` of the current sample (read at once: ``data`` may be a reused buffer)."""
        kind = self._kinds.get(name)
        if kind is None:
            media = media_kind(name.rsplit(".", 1)[-1].lower()) is not None
            kind = self._kinds[name] = 1 if is_image_field(name) else 2 if media else 0
        if kind == 1:
            found = self.found.get(name)
            if found is None:
                found = self.found[name] = []
            found.append((self.samples, header_size(data)))
        elif kind == 2:
            self.media.record(name, data)

    def end_sample(self) -> None:
        """The current sample is complete; the next ``record`` is of the next one."""
        self.samples += 1
        self.media.end_sample()

    def add(self, fields: Sequence[tuple[str, Any]]) -> None:
        """Record the next sample, given as (field, encoded bytes) pairs."""
        for name, data in fields:
            if isinstance(data, (bytes, bytearray, memoryview)):
                self.record(name, data)
        self.end_sample()

    def arrays(self, fields: Sequence[str]) -> np.ndarray:
        """(fields, 2, samples) ``uint32``: widths and heights, 0 where unknown."""
        out = np.zeros((len(fields), 2, self.samples), dtype=np.uint32)
        for f, name in enumerate(fields):
            found = self.found.get(name)
            if found:
                sizes = chain.from_iterable([size for _, size in found])
                pairs = np.fromiter(sizes, dtype=np.uint32, count=2 * len(found)).reshape(-1, 2)
                out[f][:, [i for i, _ in found]] = pairs.T
        return out


@dataclass
class ImageSizes:
    """The image sizes of a dataset: ``widths[field]`` and ``heights[field]`` per sample (manifest
    order, 0: unknown); ``reference`` is what the manifest's head holds; ``data`` the side file's bytes
    while it is still to be written."""

    counts: np.ndarray
    fields: list[str]
    widths: dict[str, np.ndarray] = field(default_factory=dict)
    heights: dict[str, np.ndarray] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    data: bytes | None = None


def encode_image_sizes(shards: Sequence[ShardSizes]) -> ImageSizes | None:
    """The side file of the shards' recorded sizes (in manifest order): of the image fields with at least
    one size found; None when there are none."""
    fields = sorted(
        {name for s in shards for name, found in s.found.items() if any(w for _, (w, _) in found)}
    )
    if not fields:
        return None
    counts = np.array([s.samples for s in shards], dtype=np.int64)
    per_shard = [s.arrays(fields) for s in shards]
    table = (
        np.concatenate(per_shard, axis=2)
        if per_shard
        else np.zeros((len(fields), 2, 0), dtype=np.uint32)
    )
    return _encoded(counts, fields, table)


def join_image_sizes(base: ImageSizes, added: ImageSizes) -> ImageSizes:
    """The sizes of ``base``'s shards then ``added``'s (an append), as a new side file: the union of their
    fields, 0 (unknown) for a field one side does not record."""
    fields = sorted({*base.fields, *added.fields})
    parts = []
    for sizes in (base, added):
        total = int(np.asarray(sizes.counts).sum())
        table = np.zeros((len(fields), 2, total), dtype=np.uint32)
        for f, name in enumerate(fields):
            if name in sizes.widths:
                table[f, 0], table[f, 1] = sizes.widths[name], sizes.heights[name]
        parts.append(table)
    counts = np.concatenate([np.asarray(base.counts), np.asarray(added.counts)]).astype(np.int64)
    return _encoded(counts, fields, np.concatenate(parts, axis=2))


def select_shards(sizes: ImageSizes, keep: Sequence[int]) -> ImageSizes:
    """The sizes of shards ``keep`` of ``sizes``, in that order, as a new side file (a split part lists
    only the shards it selects samples of; its readers index the sizes by their stored samples)."""
    counts = np.asarray(sizes.counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    rows = [np.arange(starts[i], starts[i + 1]) for i in keep]
    picked = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    table = np.zeros((len(sizes.fields), 2, len(picked)), dtype=np.uint32)
    for f, name in enumerate(sizes.fields):
        table[f, 0], table[f, 1] = sizes.widths[name][picked], sizes.heights[name][picked]
    return _encoded(counts[list(keep)], list(sizes.fields), table)


def _encoded(counts: np.ndarray, fields: list[str], table: np.ndarray) -> ImageSizes:
    """The side file of ``table`` (fields, 2, samples) for shards of ``counts`` samples."""
    array = np.concatenate(
        [np.array([len(counts), len(fields)], dtype=np.uint32), counts.astype(np.uint32)]
        + [table.reshape(-1)]
    ).astype(np.uint32)
    data, reference = encode_array(array, SIZES_PREFIX, SIZES_SUFFIX)
    reference.update(fields=fields, samples=int(counts.sum()))
    widths = {name: table[f, 0] for f, name in enumerate(fields)}
    heights = {name: table[f, 1] for f, name in enumerate(fields)}
    return ImageSizes(counts, fields, widths, heights, reference, data)


def reference_problem(ref: Any) -> str | None:
    """What keeps ``ref`` (the head's ``image_sizes``) from naming a size file, or None."""
    if not isinstance(ref, dict):
        return f"'image_sizes' is {type(ref).__name__}, not an object"
    name, digest, fields = ref.get("file"), ref.get("sha256"), ref.get("fields")
    fine = (
        set(ref) == {"file", "sha256", "fields", "samples"}
        and side_name_fits(name, SIZES_PREFIX, SIZES_SUFFIX, digest)
        and isinstance(fields, list)
        and all(isinstance(f, str) for f in fields)
        and type(ref.get("samples")) is int
    )
    if not fine:
        return (
            f"its image_sizes reference {str(ref)[:120]} is not {{file, sha256, fields, samples}}"
        )
    return None


def read_image_sizes(
    ref: dict[str, Any], read: Callable[[str], bytes], paths: Sequence[str], samples: np.ndarray
) -> ImageSizes:
    """The recorded sizes the head's ``ref`` names, read with ``read`` and checked against the manifest's
    shards (``paths``, ``samples``); a :class:`ManifestError` naming the file or shard otherwise."""
    problem = reference_problem(ref)
    if problem is not None:
        raise ManifestError(f"the dataset's manifest: {problem}; re-index it (shardstream index)")
    name = ref["file"]
    fix = "re-create it with `shardstream index --overwrite` or re-pack the dataset"
    array = load_array(ref, read, fix)
    if array.dtype != np.uint32 or array.ndim != 1 or len(array) < 2:
        raise ManifestError(f"{name} is not a flat uint32 array; {fix}")
    n, k = int(array[0]), int(array[1])
    counts = array[2 : 2 + n].astype(np.int64)
    if len(counts) != n or n != len(samples) or k != len(ref["fields"]):
        raise ManifestError(
            f"{name} records {n} shards and {k} fields, the manifest {len(samples)} shards and "
            f"{len(ref['fields'])} fields; {fix}"
        )
    differ = np.flatnonzero(counts != np.asarray(samples, dtype=np.int64))
    if len(differ):
        i = int(differ[0])
        raise ManifestError(
            f"{name} records {int(counts[i])} samples of shard {i} ({paths[i]}), which has "
            f"{int(samples[i])}; {fix}"
        )
    total = int(counts.sum())
    table = array[2 + n :]
    if len(table) != k * 2 * total or total != ref["samples"]:
        raise ManifestError(f"{name} holds {len(table)} sizes, not {k * 2 * total}; {fix}")
    table = table.reshape(k, 2, total)
    fields = list(ref["fields"])
    return ImageSizes(
        counts,
        fields,
        {f: table[i, 0] for i, f in enumerate(fields)},
        {f: table[i, 1] for i, f in enumerate(fields)},
        dict(ref),
    )


__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageSizes",
    "ShardSizes",
    "encode_image_sizes",
    "header_size",
    "is_image_field",
    "join_image_sizes",
    "read_image_sizes",
    "reference_problem",
    "select_shards",
]
