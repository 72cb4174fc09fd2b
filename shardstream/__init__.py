"""shardstream: pack folders and tables into sharded datasets and stream them into PyTorch."""

from . import _moved  # old module paths resolve to their new homes (see _moved.py)
from .errors import (
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
from .packing import PackResult, ShardWriter, pack
from .packing.compose import merge, split
from .storage import StorageSettings
from .version import __version__

__all__ = [
    "Bucketed",
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
    "__version__",
    "aspect_ratio",
    "image_area",
    "length_of",
    "load_manifest",
    "merge",
    "pack",
    "pad_sequences",
    "split",
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
    "aspect_ratio": "dataset.bucketed",
    "image_area": "dataset.bucketed",
    "length_of": "dataset.bucketed",
    "ShardLoader": "loader",
    "DeviceLoader": "device",
    "FieldCollate": "dataset.collate",
    "pad_sequences": "dataset.collate",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        module = _moved.MOVED.get(f"{__name__}.{name}")
        if module is not None:  # shardstream.collate and the like, as attributes
            return _moved.resolve(f"{__name__}.{name}")
        raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
