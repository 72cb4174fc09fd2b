"""A destination's life while packing: claim it, clear what an interrupted run left, publish.

The old manifest goes first and the new one comes last, so nobody ever reads a
half-written or half-replaced dataset.
"""

from __future__ import annotations

import os
import re

from ..errors import DatasetExistsError, StorageError
from ..manifest import MANIFEST_NAME, Manifest, write_manifest
from ..storage import Store

_SHARD_FILE = re.compile(r"^shard-\d{6}\.(tar|tar\.zst|tar\.gz|arrow)$")
_TEMP_FILE = re.compile(r"^\..*\.[0-9a-f]{8}\.tmp$")
# Present from the moment shardstream starts writing shards into a folder until its manifest
# is published: it marks leftover shards as ours, safe to replace on the next attempt.
IN_PROGRESS = ".shardstream-writing"


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


def prepare_destination(store: Store, overwrite: bool) -> None:
    """Make ``store`` ready for new shards: claim it, then clear what an interrupted
    shardstream run left there (its shards and temporary files).

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
    store.write_bytes(IN_PROGRESS, b"")
    for name in names:
        if _SHARD_FILE.match(name) or _TEMP_FILE.match(name):
            store.remove(name)


def publish(store: Store, manifest: Manifest) -> None:
    """Write the manifest (last, atomically): the shards in ``store`` become a dataset."""
    write_manifest(store, manifest)
    store.remove(IN_PROGRESS)
