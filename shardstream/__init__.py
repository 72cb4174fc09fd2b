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
    "ShardWriter",
    "ShardstreamError",
    "SourceError",
    "StorageError",
    "load_manifest",
    "pack",
]
