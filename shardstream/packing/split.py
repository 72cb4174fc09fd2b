"""``pack(..., split_by="cls")``: one dataset per class, and a labels file written last.

A class-balanced (or any per-label weighted) mix needs each label as a source of its own; splitting
at pack time costs nothing extra and lets the reader open the labels without reading a sample.
Each class's dataset keeps the whole tree's class list and its global ``cls`` value, so its samples
are the same as in a pack of the whole tree. The index (``_labels.json``) appears only once every
class's dataset is complete: an interrupted split is no split pack.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetExistsError, SourceError
from ..manifest.labels import LABELS_NAME, LabelEntry, LabelIndex, write_labels
from ..sizes import count, format_size
from ..sources import FolderSource
from ..storage import Store
from .driver import open_listed, pack_source
from .options import PackOptions

SPLIT_FIELDS = ("cls",)
_UNSAFE = str.maketrans({c: "_" for c in '/\\:*?"<>|'})


@dataclass
class SplitResult:
    """What a split pack produced: one :class:`~shardstream.packing.driver.PackResult` per label."""

    url: str
    index: LabelIndex
    parts: list[Any] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def samples(self) -> int:
        return sum(p.samples for p in self.parts)

    @property
    def shards(self) -> int:
        return sum(p.shards for p in self.parts)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def summary(self) -> str:
        sizes = sorted(e.samples for e in self.index.labels)
        per_label = (
            count(sizes[0], "sample")
            if sizes[0] == sizes[-1]
            else f"{sizes[0]:,} to {sizes[-1]:,} samples"
        )
        return (
            f"packed {count(self.samples, 'sample')} into {count(len(self.parts), 'dataset')} by "
            f"{self.index.split_by} ({per_label} per label), "
            f"{count(self.shards, 'shard')}, {format_size(self.nbytes)} in {self.seconds:.2f} s -> {self.url}"
        )


def folder_name(label: str, value: int) -> str:
    """A label's sub-folder: its name where that is a safe folder name, else ``label-<value>``."""
    name = label.translate(_UNSAFE).strip()
    return name if name and not name.startswith(".") else f"label-{value}"


def pack_split(
    source: str | os.PathLike[str], dest: str | os.PathLike[str], options: PackOptions
) -> SplitResult:
    """Pack ``source`` (an ImageFolder tree) as one dataset per class under ``dest`` (each packed with
    ``options``), then the index."""
    started = time.perf_counter()
    source, dest = os.fspath(source), os.fspath(dest)
    split_by, overwrite = options.split_by, options.overwrite
    storage_options = options.storage_options
    if split_by not in SPLIT_FIELDS:
        raise SourceError(
            f"cannot split by {split_by!r}: pack splits by {', '.join(SPLIT_FIELDS)} (the class of an "
            "ImageFolder tree); for other labels pack one dataset per label and give "
            "MixedDataset.by_label a {label: url} mapping"
        )
    src = open_listed(source, options)
    if not isinstance(src, FolderSource) or src.classes is None:
        raise SourceError(
            f"{source} is no ImageFolder tree (root/<class>/<image>): --split-by cls needs classes"
        )
    root = Store(dest, storage_options)
    if root.exists(LABELS_NAME):
        if not overwrite:
            raise DatasetExistsError(
                f"{root.url} already holds a split pack ({LABELS_NAME}); pass --overwrite "
                "(overwrite=True) to replace it, or choose another destination"
            )
        root.remove(LABELS_NAME)  # retracted first: nobody reads a half-replaced split
    counts = [0] * len(src.classes)
    for s in src.samples:
        counts[s.label] += 1  # type: ignore[index]
    names: dict[str, int] = {}
    entries, parts = [], []
    for value, label in enumerate(src.classes):
        if counts[value] == 0:
            continue
        name = folder_name(label, value)
        if name in names:
            name = f"{name}-{value}"
        names[name] = value
        subset = FolderSource(
            src.root,
            src.layout,
            [s for s in src.samples if s.label == value],
            src.classes,
            0,
            src.storage_options,
        )
        parts.append(
            pack_source(source, f"{root.url}/{name}", options.replace(split_by=None), src=subset)
        )
        entries.append(LabelEntry(label, value, name, counts[value]))
    index = LabelIndex(split_by, tuple(entries))
    write_labels(root, index, options.fsync)
    return SplitResult(root.url, index, parts, time.perf_counter() - started)


__all__ = ["SPLIT_FIELDS", "SplitResult", "folder_name", "pack_split"]
