"""shardstream: pack folders and tables into sharded datasets and stream them into PyTorch."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import (
    CorruptSampleError,
    CorruptShardError,
    DatasetExistsError,
    ManifestError,
    ShardstreamError,
    SourceError,
    StorageError,
    TransformError,
    UsageError,
)
from .manifest import Manifest, load_manifest
from .manifest.upgrade import upgrade
from .packing import PackResult, ShardWriter, pack
from .packing.compose import merge, split
from .storage import StorageSettings
from .version import __version__

if TYPE_CHECKING:
    from .manifest.index_tars import IndexResult

__all__ = [
    "AudioClip",
    "AudioCollate",
    "Bucketed",
    "CorruptSampleError",
    "CorruptShardError",
    "DatasetExistsError",
    "DeviceLoader",
    "FieldCollate",
    "LengthBucketing",
    "Manifest",
    "ManifestError",
    "MixedDataset",
    "PackResult",
    "Parallel",
    "ShardDataset",
    "SequencePacking",
    "ShardLoader",
    "ShardMap",
    "ShardWriter",
    "ShardstreamError",
    "SourceError",
    "StorageError",
    "StorageSettings",
    "TokenDataset",
    "TransformError",
    "UsageError",
    "VideoClip",
    "__version__",
    "aspect_ratio",
    "duration",
    "image_area",
    "index",
    "length_of",
    "load_manifest",
    "merge",
    "pack",
    "pad_sequences",
    "split",
    "upgrade",
]

_LAZY = {  # name -> module: these import torch (seconds); packing and the command line never need it
    "ShardDataset": "dataset",
    "TokenDataset": "dataset",
    "MixedDataset": "dataset",
    "ShardMap": "dataset",
    "LengthBucketing": "dataset",
    "Parallel": "dataset",
    "Bucketed": "dataset",
    "SequencePacking": "dataset",
    "aspect_ratio": "dataset.batches.bucketed",
    "duration": "dataset.batches.bucketed",
    "image_area": "dataset.batches.bucketed",
    "length_of": "dataset.batches.bucketed",
    "ShardLoader": "loader",
    "DeviceLoader": "device",
    "FieldCollate": "dataset.batches.collate",
    "AudioCollate": "dataset.batches.collate",
    "pad_sequences": "dataset.batches.collate",
    "VideoClip": "dataset.samples.media",
    "AudioClip": "dataset.samples.media",
}


def index(
    shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str] | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    force: bool = False,
    on_shard: Callable[[int], None] | None = None,
) -> IndexResult:
    """Make a dataset of files already in shards, read where they are: publish a manifest for existing
    WebDataset tars or for Parquet files, as ``shardstream index`` does (which one, by the inputs).

    Parquet files (``"data/*.parquet"``, files, or a Hugging Face folder of one split) become shards
    as they are, each with a row-group index (``.shardstream/<file>.idx`` beside it). Tars (``"shard-{000..009}.tar"``, files
    or a folder of them) are read once: their samples counted, a sample index written next to each
    uncompressed tar. Either way the data files are never changed, and the manifest is written last.

    Args:
        shards: a pattern, file, folder or URL, or a list of them (any fsspec URL).
        output: the folder for ``_manifest.json`` (default: a folder given, else the one holding every
            file); it must hold every file.
        storage_options: fsspec options for the files and ``output``.
        overwrite: replace a manifest already there.
        force: tars only: index a folder an unfinished pack left (``.shardstream-writing``).
        on_shard: called with each file's size once it is read (for progress).

    Returns:
        The manifest published (``result.manifest``), where (``result.url``), and warnings
        (``result.notes``; ``result.unkeyed``: tar members that belong to no sample).
    """
    from .manifest.index_parquet import index_parquet, is_parquet
    from .manifest.index_tars import index as index_tars

    one = isinstance(shards, (str, os.PathLike))
    sources = [os.fspath(shards)] if one else [os.fspath(s) for s in shards]  # type: ignore[union-attr]
    if not sources:
        raise UsageError("index was given no files: give a pattern, a folder or a list of files")
    out = None if output is None else os.fspath(output)
    if is_parquet(sources, storage_options):
        if force:
            raise UsageError(
                "force indexes the tars of an unfinished pack; Parquet files are indexed as they "
                "are: leave it out"
            )
        return index_parquet(sources, out, storage_options, overwrite, on_shard=on_shard)
    return index_tars(sources, out, storage_options, overwrite, on_shard=on_shard, force=force)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
