"""shardstream: pack folders and tables into sharded datasets and stream them into PyTorch."""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    CorruptShardError,
    DatasetExistsError,
    ManifestError,
    ShardstreamError,
    SourceError,
    StorageError,
)
from .manifest import Manifest, load_manifest  # noqa: E402
from .packing import PackResult, pack  # noqa: E402
from .writer import ShardWriter  # noqa: E402

__all__ = [
    "CorruptShardError",
    "DatasetExistsError",
    "DeviceLoader",
    "FieldCollate",
    "Manifest",
    "ManifestError",
    "PackResult",
    "ShardDataset",
    "ShardLoader",
    "ShardWriter",
    "ShardstreamError",
    "SourceError",
    "StorageError",
    "load_manifest",
    "pack",
    "pad_sequences",
]

_LAZY = {  # name -> module: these import torch (seconds); packing and the command line never need it
    "ShardDataset": "dataset",
    "ShardLoader": "loader",
    "DeviceLoader": "device",
    "FieldCollate": "collate",
    "pad_sequences": "collate",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{module}", __name__), name)
