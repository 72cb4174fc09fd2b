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
]


def __getattr__(name: str):
    # The readers import torch (seconds); packing and the command line never need it.
    if name == "ShardDataset":
        from .dataset import ShardDataset

        return ShardDataset
    if name == "ShardLoader":
        from .loader import ShardLoader

        return ShardLoader
    raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
