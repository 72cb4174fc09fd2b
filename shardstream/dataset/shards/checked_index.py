"""A local shard is read through its sample index only once the index was checked against the tar's headers
(:func:`~shardstream.formats.index_check.check_index`), once per host for each version of the shard file.

The record of a check that passed is a small file in the private cache folder's ``checked/`` (as the
cache's own checks), keyed by the file's path, device, inode, size and modification time and the
index's sha256: a shard or index replaced since, even with the same size, is checked again; every
other open of that shard, by any worker, process or run on the host, costs one small locked read.
"""

from __future__ import annotations

import os

from ...errors import StorageError
from ...formats.index_check import check_index
from ...formats.tar_index import SampleIndex
from ...storage import ShardFetcher
from ...storage.cache import DiskCache
from ...storage.checked import once_per_host


def check_index_once(
    fetcher: ShardFetcher,
    path: str,
    version: tuple[int, ...] | None,
    data,
    index: SampleIndex,
    name: str,
    index_sha256: str,
) -> None:
    """Raise :class:`~shardstream.errors.CorruptShardError` unless the local tar at ``path``, mapped as
    ``data`` while the file was ``version`` (device, inode, size, modification time), holds what its
    ``index`` (whose sha256 the manifest gave) says; checked at most once per host for that version of the
    file. Without a version, or a place for the record (no cache folder can be made), every call checks."""
    try:
        if version is None:
            raise FileNotFoundError(path)
        if fetcher.cache is None:
            fetcher.cache = DiskCache()
        root = fetcher.cache.root
    except (OSError, StorageError):
        check_index(data, index, name)
        return
    identity = "\0".join(map(str, ("tar-index", os.path.realpath(path), *version, index_sha256)))
    try:
        once_per_host(root, identity, lambda: check_index(data, index, name))
    except (
        OSError,
        StorageError,
    ):  # the record could not be read or written: the check itself decides
        check_index(data, index, name)


__all__ = ["check_index_once"]
