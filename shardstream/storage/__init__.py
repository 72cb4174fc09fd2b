"""Storage: every byte in or out of a dataset, by fsspec URL or local path.

``Store`` (one folder: ``LocalStore`` or ``FsspecStore``, chosen by its URL; retries under a
``RetryPolicy``, errors classified in ``classify``; URLs in ``urls``),
the host's shard cache (``DiskCache``), checked whole-shard downloads (``ShardFetcher``) and
background loading within a byte budget (``Prefetcher``). Storage knows nothing of manifests,
plans or ranks: it moves named bytes.
"""

from .cache import DiskCache, default_cache_dir
from .classify import describe_os_error, is_transient, storage_errors
from .fetch import ShardFetcher
from .fsspec_store import FsspecStore
from .local_store import LocalStore
from .prefetch import Prefetcher
from .retry import RetryPolicy
from .settings import StorageSettings
from .store import Store
from .urls import connection_options, is_url

__all__ = [
    "DiskCache",
    "FsspecStore",
    "LocalStore",
    "Prefetcher",
    "RetryPolicy",
    "ShardFetcher",
    "StorageSettings",
    "Store",
    "connection_options",
    "default_cache_dir",
    "describe_os_error",
    "is_transient",
    "is_url",
    "storage_errors",
]
