"""``gc``: remove what no kept version of a dataset needs: older version files, their shards, indexes and
shard tables, and what crashed runs left.

The newest ``keep`` versions are kept whole: nothing any of them names is ever removed. Version files go
first (so no readable version ever names a removed shard), then the files. Files of a run that holds the
destination's claim (``.shardstream-writing``: a pack or append under way, or one that crashed) are left
alone; the next run there, or a ``gc`` once it is gone, removes them. A dry run (the default) only says
what would go. Readers that opened a removed version keep their open shards only where they hold them
already: pin a version you read to keep it (``--keep``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import ShardstreamError, StorageError
from ..manifest.files import IN_PROGRESS, sync_folder
from ..manifest.schema import MANIFEST_NAME
from ..manifest.versions import list_versions, read_version, version_name
from ..storage import Store
from .destination import made_by_shardstream


@dataclass
class Collection:
    """What a ``gc`` kept and removed (or, in a dry run, would remove)."""

    kept: list[int]
    versions: list[int] = field(default_factory=list)  # version files removed
    files: list[str] = field(default_factory=list)  # shards, indexes, tables removed
    nbytes: int = 0
    deleted: bool = False


def collect(store: Store, keep: int, delete: bool = False) -> Collection:
    """Remove (with ``delete``; else only list) what the newest ``keep`` versions of ``store`` do not need."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ShardstreamError(f"--keep must be 1 or more (the latest version stays), not {keep!r}")
    numbers = list_versions(store)
    if not numbers:
        raise ShardstreamError(f"{store.url} holds no dataset ({MANIFEST_NAME} is missing)")
    kept, dropped = numbers[-keep:], numbers[:-keep]
    needed: set[str] = set()
    for number in kept:
        m = read_version(store, number)
        needed |= {*m.paths, *(p + ".idx" for p in m.paths)}
        if m.selection is not None:
            needed.add(m.selection.reference["file"])
        if m.image_sizes is not None:
            needed.add(m.image_sizes.reference["file"])
        needed |= _tables(store, number)
    busy = _claimed_run(store)
    files = [
        n
        for n in store.list_files()
        if n not in needed and made_by_shardstream(n) and (busy is None or busy not in n)
    ]
    result = Collection(kept, dropped, files, sum(store.size(n) for n in files))
    if delete:
        with store.locked():
            for number in dropped:
                if store.exists(version_name(number)):
                    store.remove(version_name(number))
            for name in files:
                store.remove(name)
        sync_folder(store)
        result.deleted = True
    return result


def _tables(store: Store, number: int) -> set[str]:
    """The shard table version ``number``'s head names, if any."""
    found = store.read_tagged(version_name(number)) or store.read_tagged(MANIFEST_NAME)
    try:
        shards = json.loads(found[0]).get("shards") if found else None
    except ValueError:
        return set()
    table = shards.get("table") if isinstance(shards, dict) else None
    return {table} if isinstance(table, str) else set()


def _claimed_run(store: Store) -> str | None:
    """The token of the run that holds the destination's claim, if one does."""
    try:
        return bytes(store.read_bytes(IN_PROGRESS)).decode("ascii", "replace").strip() or None
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise


__all__ = ["Collection", "collect"]
