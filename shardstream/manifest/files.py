"""A store's manifest file: find the dataset folder of a URL, read its manifest, publish one
(a pack publishes its own, conditionally: see :mod:`shardstream.packing.destination`).

Also the durability helpers every writer of a dataset shares: ``sync_file`` (a file's bytes on
disk before it is renamed into place) and ``sync_folder`` (renames in a folder on disk), for
local folders; an object store's PUT is durable when it returns, so they do nothing there.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from typing import IO, Any

from ..errors import ManifestError, StorageError
from ..storage import DiskCache, RetryPolicy, Store, describe_os_error
from .schema import MANIFEST_NAME, Manifest
from .side_names import NAMESPACE
from .table import TABLE_THRESHOLD, encode_table, is_table_name, table_reference

# Present from the moment shardstream starts writing shards into a folder until its manifest is
# published. It holds the writing run's token: leftover shards are ours to replace, and a run
# whose token is no longer there has lost the folder to a newer run and must not publish.
IN_PROGRESS = ".shardstream-writing"

# fsync on a folder, or on a file system that cannot sync: nothing to do there, not an error.
_CANNOT_SYNC = {
    errno.EINVAL,
    errno.ENOTSUP,
    errno.EOPNOTSUPP,
    errno.EBADF,
    errno.EISDIR,
    errno.EACCES,
}


def sync_file(store: Store, f: IO[bytes], name: str) -> None:
    """Put the bytes written to ``f`` (a file of :meth:`Store.open_write`) on disk, before its rename."""
    if not store.local:
        return
    try:
        f.flush()
        os.fsync(f.fileno())
    except OSError as exc:
        if exc.errno not in _CANNOT_SYNC:
            raise StorageError(
                f"cannot write {store.url_of(name)}: {describe_os_error(exc)}"
            ) from exc


def _fsync_and_close(fd: int, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_SYNC:
            raise StorageError(f"cannot sync {what}: {describe_os_error(exc)}") from exc
    finally:
        os.close(fd)


def sync_folder(store: Store, name: str | None = None) -> None:
    """Put the renames and removals made in the store's folder and its ``.shardstream`` folder on disk (and
    the folders' own entries); ``name``: also those of the folders of the file ``name`` (in a subfolder)."""
    if not store.local:
        return
    own = os.path.join(store.root, NAMESPACE)
    inner: list[str] = []
    parts = (name or "").split("/")[:-1]
    for depth in range(len(parts), 0, -1):
        inner.append(os.path.join(store.root, *parts[:depth]))
    folders = (*inner, os.path.join(own, "versions"), own, store.root, os.path.dirname(store.root))
    for folder in dict.fromkeys(folders):
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as exc:
            if exc.errno in _CANNOT_SYNC or exc.errno == errno.ENOENT:
                continue
            raise StorageError(
                f"cannot sync the folder {folder}: {describe_os_error(exc)}"
            ) from exc
        _fsync_and_close(fd, f"the folder {folder}")


def sync_existing(store: Store, names: list[str]) -> None:
    """Put files that are already in place (``names``, written by others) and their folders on disk."""
    if not store.local:
        return
    folders = set()
    for name in names:
        path = store.path(name)
        folders.add(os.path.dirname(path))
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise StorageError(
                f"cannot read {store.url_of(name)}: {describe_os_error(exc)}"
            ) from exc
        _fsync_and_close(fd, store.url_of(name))
    for folder in sorted(folders - {store.root}):
        sync_folder(Store(folder))
    sync_folder(store)


def dataset_store(
    url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
) -> Store:
    """The store of the dataset at ``url`` (its folder, or the folder of a ``_manifest.json`` URL)."""
    url = str(url)
    if url.rstrip("/").endswith("/" + MANIFEST_NAME) or url == MANIFEST_NAME:
        url = url.rstrip("/")[: -len(MANIFEST_NAME)] or "."
    return Store(url, storage_options, retry)


def read_head(store: Store, cache: Callable[[], DiskCache] | None = None) -> Manifest:
    """The manifest ``_manifest.json`` holds (the latest version, unless a publish was cut short).
    ``cache``: the host's shard cache (made when first needed), through which a remote dataset's shard
    table is read: once per host, not once per rank (the table is named by its content, so a cached
    copy is never stale)."""
    try:
        data = store.read_bytes(MANIFEST_NAME)
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            if _exists(store, IN_PROGRESS):
                raise ManifestError(
                    f"{store.url} holds an unfinished shardstream pack ({IN_PROGRESS} is there, {MANIFEST_NAME} "
                    "is not): its shards are not a dataset yet; re-run the pack"
                ) from None
            raise ManifestError(
                f"{store.url} holds no dataset: {MANIFEST_NAME} is missing. Pack data there with "
                "'shardstream pack', or write a manifest for existing WebDataset tars with "
                "'shardstream index'"
            ) from None
        raise exc
    return parse_manifest(store, bytes(data), MANIFEST_NAME, cache)


def parse_manifest(
    store: Store, data: bytes, name: str, cache: Callable[[], DiskCache] | None = None
) -> Manifest:
    """The manifest in ``data`` (the file ``name`` of ``store``), its shard table read from ``store``
    (through ``cache``, see :func:`read_head`)."""
    manifest = Manifest.from_json(
        data, store.url_of(name), lambda table: _read_table(store, table, cache)
    )
    if manifest.roots:  # its shards are read where they are, beside this dataset
        store.reach(manifest.roots)
    return manifest


def _read_table(store: Store, name: str, cache: Callable[[], DiskCache] | None = None) -> bytes:
    if cache is None or store.local:
        return _read_table_now(store, name)
    host = cache()
    key = hashlib.sha256(f"shard table\0{store.url_of(name)}".encode()).hexdigest()
    prefix = name.rsplit("shards-", 1)[-1][:16]  # the first 16 hex of its sha256
    for _ in range(2):
        found = host.get(key, lambda: _read_table_now(store, name))
        data = bytes(found)
        if hasattr(found, "close"):
            found.close()
        if hashlib.sha256(data).hexdigest().startswith(prefix):
            return data
        host.discard(key)  # damaged in the cache: fetched again
    return data  # the table's sha256 check says what is wrong


def _read_table_now(store: Store, name: str) -> bytes:
    try:
        return bytes(store.read_bytes(name))
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            raise ManifestError(
                f"{store.url_of(MANIFEST_NAME)} names the shard table {name}, which is missing; "
                "re-create the dataset (pack again, or 'shardstream index')"
            ) from None
        raise


def _exists(store: Store, name: str) -> bool:
    try:
        return store.exists(name)
    except StorageError:
        return False


def manifest_files(
    manifest: Manifest, table_threshold: int = TABLE_THRESHOLD
) -> list[tuple[str, bytes]]:
    """(name, bytes) of the files that publish ``manifest``, in the order they are written: from
    ``table_threshold`` shards on, its shard table (``.shardstream/shards-<hash>.arrow``) first, then the JSON head
    (``_manifest.json``, last) that names it; below, the one JSON file."""
    side = (
        []
        if manifest.selection is None
        else [(manifest.selection.reference["file"], manifest.selection.data())]
    )
    sizes = manifest.image_sizes
    if sizes is not None and sizes.data is not None:
        side.append((sizes.reference["file"], sizes.data))
    media = manifest.media
    if media is not None and media.data is not None:
        side.append((media.reference["file"], media.data))
        if media.blocks_data is not None:
            side.append((media.reference["blocks"]["file"], media.blocks_data))
    if manifest.num_shards < table_threshold:
        return [*side, (MANIFEST_NAME, manifest.to_json())]
    data = encode_table(
        manifest.paths,
        manifest.stored_counts,
        manifest.nbytes,
        manifest.sha256,
        manifest.index_sha256,
    )
    reference = table_reference(data, manifest.num_shards)
    return [
        *side,
        (str(reference["table"]), data),
        (MANIFEST_NAME, manifest.to_json(reference)),
    ]


def write_manifest(
    store: Store, manifest: Manifest, fsync: bool = True, table_threshold: int = TABLE_THRESHOLD
) -> str | None:
    """Publish the dataset: the manifest is written last, atomically, and (with ``fsync``) durably:
    its bytes are on disk before its rename, and the rename is on disk when this returns.

    With ``table_threshold`` shards or more, the shard columns go first to a shard table
    (``.shardstream/shards-<hash>.arrow``), whose name is returned; the JSON head names it."""
    files = manifest_files(manifest, table_threshold)
    for name, data in files:
        write_durably(store, name, data, fsync)
    tables = [name for name, _ in files if is_table_name(name)]
    return tables[0] if tables else None


def write_durably(store: Store, name: str, data: bytes, fsync: bool = True) -> None:
    """``data`` at ``name``, atomically; with ``fsync`` its bytes, then its rename, on disk before this returns.

    Every byte or an error: the store's file takes the whole of ``data`` or raises (a full disk is a
    :class:`StorageError` naming ``name``), and its size is checked before it is published, so nothing
    that names this file (a manifest, an index) can ever point at a cut copy."""
    with store.open_write(name) as f:
        f.write(data)
        if fsync:
            sync_file(store, f, name)
        _check_size(store, f, name, len(data))
    if fsync:
        sync_folder(store, name)


def _check_size(store: Store, f: IO[bytes], name: str, expected: int) -> None:
    """Raise unless the file ``f`` being written for ``name`` holds ``expected`` bytes."""
    try:
        size = os.fstat(f.fileno()).st_size
    except (OSError, AttributeError, ValueError):  # no file descriptor: its position says as much
        size = f.tell()
    if size != expected:
        raise StorageError(
            f"cannot write {store.url_of(name)}: {size} of its {expected} bytes were written (the "
            "disk, or the temporary folder an upload is spooled to, is full?); free some space or "
            "choose another destination"
        )
