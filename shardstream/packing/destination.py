"""A destination's life while packing: claim it, clear what an interrupted run left, publish.

The old manifest goes first and the new one comes last, so nobody ever reads a
half-written or half-replaced dataset. A run claims the folder with a token of its own in
the ``.shardstream-writing`` marker; shards written by worker processes wait under temporary
names carrying that token, and only the run that still holds the claim renames them into
place and publishes, so the workers of a killed run cannot touch a newer run's dataset.
With ``fsync`` (the default) every shard is on disk before its rename, the renames before the
manifest, and the manifest before its own rename (local folders; object stores' PUT is durable).
"""

from __future__ import annotations

import os
import re
import uuid

from ..errors import DatasetExistsError, ShardstreamError, StorageError
from ..manifest import MANIFEST_NAME, Manifest, write_manifest
from ..manifest.files import IN_PROGRESS, sync_folder
from ..storage import Store, describe_os_error

__all__ = ["IN_PROGRESS", "check_claim", "claim_destination", "commit_shard", "prepare_destination", "publish",
           "staged_name"]

_SHARD_FILE = re.compile(r"^shard-\d{6}\.(tar|tar\.zst|tar\.gz|arrow|tokens)(\.idx)?$")  # shards, sample indexes
_TEMP_FILE = re.compile(r"^\..*\.[0-9a-f]{8,32}\.tmp$")  # the store's temporary names and staged shards
_SHARD_TABLE = re.compile(r"^_shards-[0-9a-f]{16}\.arrow$")  # a large manifest's shard table (manifest.table)


def claim_destination(store: Store, overwrite: bool) -> None:
    """Refuse a destination that holds a dataset unless ``overwrite``; then retract its manifest.

    The old manifest goes first, so nobody reads a half-replaced dataset.
    """
    if store.local and os.path.exists(store.root) and not os.path.isdir(store.root):
        raise StorageError(f"{store.url} is a file; the destination must be a folder")
    if store.exists(MANIFEST_NAME):
        if not overwrite:
            raise DatasetExistsError(
                f"{store.url} already holds a dataset ({MANIFEST_NAME}); pass --overwrite "
                "(overwrite=True) to replace it, or choose another destination"
            )
        store.remove(MANIFEST_NAME)


def prepare_destination(store: Store, overwrite: bool, fsync: bool = True) -> str:
    """Make ``store`` ready for new shards: claim it, then clear what an interrupted
    shardstream run left there (its shards and temporary files). Returns this run's token.

    Shard-named files that no shardstream run left behind (WebDataset tars, say) are
    only replaced with ``overwrite``.
    """
    claim_destination(store, overwrite)
    store.makedirs()
    names = store.list_files()
    shards = [n for n in names if _SHARD_FILE.match(n)]
    if shards and not overwrite and IN_PROGRESS not in names:
        raise DatasetExistsError(
            f"{store.url} holds shard files that shardstream did not leave there ({shards[0]}, ...); "
            "pass --overwrite (overwrite=True) to replace them, or choose another destination"
        )
    token = uuid.uuid4().hex[:16]
    store.write_bytes(IN_PROGRESS, token.encode())
    for name in names:
        if _SHARD_FILE.match(name) or _TEMP_FILE.match(name) or _SHARD_TABLE.match(name):
            store.remove(name)
    if fsync:
        sync_folder(store)  # the claim and the clean-up survive a crash: leftovers stay ours
    return token


def staged_name(name: str, token: str) -> str:
    """The temporary name a worker writes shard ``name`` to, until the run that owns ``token`` commits it."""
    return f".{name}.{token}.tmp"


def check_claim(store: Store, token: str) -> None:
    """Raise unless the destination is still claimed by the run that owns ``token``."""
    try:
        found = bytes(store.read_bytes(IN_PROGRESS)).decode("ascii", "replace").strip()
    except StorageError as exc:
        if not isinstance(exc.__cause__, FileNotFoundError):
            raise
        found = None
    if found != token:
        raise ShardstreamError(
            f"{store.url} was claimed by another pack while this one was writing ({IN_PROGRESS} "
            f"{'is gone' if found is None else 'holds another run'}); this run's shards were not published; "
            "let one pack at a time write there"
        )


def commit_shard(store: Store, token: str, name: str) -> None:
    """Rename a worker's staged shard ``name`` into place, if this run (``token``) still holds the folder."""
    check_claim(store, token)
    try:
        os.replace(store.path(staged_name(name, token)), store.path(name))
        if os.path.exists(store.path(staged_name(name + ".idx", token))):  # its sample index, if written
            os.replace(store.path(staged_name(name + ".idx", token)), store.path(name + ".idx"))
    except OSError as exc:
        raise StorageError(f"cannot write {store.url_of(name)}: {describe_os_error(exc)}") from exc


def publish(store: Store, manifest: Manifest, token: str | None = None, fsync: bool = True) -> None:
    """Write the manifest (last, atomically): the shards in ``store`` become a dataset.

    With ``token``, only while this run still holds the destination. With ``fsync``, the
    shards' renames are on disk before the manifest is written, and the manifest after.
    """
    if token is not None:
        check_claim(store, token)
    if fsync:
        sync_folder(store)
    write_manifest(store, manifest, fsync)
    store.remove(IN_PROGRESS)


def check_written(store: Store, names: list[str], sizes: list[int]) -> None:
    """Before the manifest: every shard written by another machine is at its name, as large as the task
    that wrote it said (its checksum is the task's own, over the bytes it wrote)."""
    for name, size in zip(names, sizes):
        found = store.size(name) if store.exists(name) else None
        if found != size:
            what = "is missing" if found is None else f"holds {found} bytes, its task wrote {size}"
            raise ShardstreamError(f"{store.url_of(name)} {what}; another process changed the destination "
                                   "during the pack: pack again")
