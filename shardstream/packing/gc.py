"""``gc``: remove what no kept version of a dataset needs: older version files, their shards, indexes and
shard tables, and what crashed runs left. Only files shardstream can prove it wrote: the shards and
``.shardstream/`` files a version names or a run made, and, of a dataset of an older format, an index
beside a shard only where its sha256 is the one a version recorded (Megatron-Energon and DALI keep their
own indexes under the same names).

The newest ``keep`` versions are kept whole: nothing any of them names is ever removed, nor anything a run
that holds the destination's claim (``.shardstream-writing``: a pack or append under way, or one that
crashed) may be about to publish: its files, named with its token, and, while any run holds the claim, the
files runs write without their token (shard tables, side files, temporary files). The next run there, or a
``gc`` once the claim is gone, removes what such a run left. Probes of conditional writes
(``.shardstream-probe-<token>``, a few bytes, which a run writes and removes again, some before it claims the
destination) are left to the runs' own clean-up. A dry run (the default) only says what would go.

What to remove is decided at one instant although it takes several reads: the claim is read, then the
versions are listed and the kept ones read, then the folder is listed; then the claim is read again and the
versions listed again, and if a version was published meanwhile, all of it is read again. A run whose files
the listing found, and that publishes after the second look at the versions, still held the claim at the
second look at the claim (a run releases its claim only after it publishes, and one that lost the claim can
no longer publish), so its files are spared. Locally that holds for every run (a run's last check of its
claim and its publish are one step under the folder's lock); on object storage a run checks its claim and
then publishes by a second request, so a run that another run's claim overtook between those two requests,
and whose publish lands while ``gc`` removes files, is not covered.

The head (``_manifest.json``) is moved forward to the newest kept version first if a publish was cut short
before moving it; then the older version files go (so no readable version ever names a removed shard), then
the files. Readers that opened a removed version keep their open shards only where they hold them already:
pin a version you read to keep it (``--keep``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from ..errors import ManifestError, ShardstreamError, StorageError
from ..manifest.files import IN_PROGRESS, parse_manifest, sync_folder
from ..manifest.schema import MANIFEST_NAME, Manifest
from ..manifest.versions import list_versions, move_head, version_file, version_name, version_of
from ..storage import Store
from ..storage.classify import is_missing
from .destination import (
    dataset_files,
    files_of,
    is_probe,
    made_by_shardstream,
    may_be_written_by,
    own_beside_indexes,
)

_ATTEMPTS = 8  # looks at a dataset that versions are published to meanwhile, before giving up


@dataclass
class Collection:
    """What a ``gc`` kept and removed (or, in a dry run, would remove)."""

    kept: list[int]
    versions: list[int] = field(default_factory=list)  # version files removed
    files: list[str] = field(default_factory=list)  # shards, indexes, tables removed
    nbytes: int = 0
    deleted: bool = False


class _Changed(Exception):
    """A version gc was reading went away meanwhile: look again."""


def collect(store: Store, keep: int, delete: bool = False) -> Collection:
    """Remove (with ``delete``; else only list) what the newest ``keep`` versions of ``store`` do not need."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ShardstreamError(f"--keep must be 1 or more (the latest version stays), not {keep!r}")
    for _ in range(_ATTEMPTS):
        result = _plan(store, keep)
        if result is not None:
            break
    else:
        raise ShardstreamError(
            f"{store.url} changed each of the {_ATTEMPTS} times gc read it (versions were published or "
            "removed meanwhile); nothing was removed: run gc again"
        )
    result.nbytes = sum(_size(store, n) for n in result.files)
    if delete:
        _complete_head(store, result.kept[-1])
        for number in result.versions:
            for old in (False, True):
                _remove(store, version_name(number, old))
        for name in result.files:
            _remove(store, name)
        sync_folder(store)
        result.deleted = True
    return result


def _plan(store: Store, keep: int) -> Collection | None:
    """What to keep and remove, or ``None`` if a version was published or removed while it was read (see the
    module: the claim and the versions are looked at before and after the folder is listed)."""
    held = {_claimed_run(store)}
    numbers = _numbers(store)
    if not numbers:
        raise ShardstreamError(f"{store.url} holds no dataset ({MANIFEST_NAME} is missing)")
    kept, dropped = numbers[-keep:], numbers[:-keep]
    needed: set[str] = set()
    try:
        versions = {n: _version(store, n) for n in numbers}
    except _Changed:
        return None
    names = dataset_files(store)
    for number in kept:
        needed |= files_of(versions[number], store, set(names))
    held.add(
        _claimed_run(store)
    )  # the claim before the versions: a run releases it after publishing
    if _numbers(store) != numbers:
        return None
    tokens = {token for token in held if token is not None}
    ours = set(
        own_beside_indexes(store, names, list(versions.values()))
    )  # indexes beside shards: where proven ours
    files = [
        n
        for n in names
        if n not in needed
        and (made_by_shardstream(n) or n in ours)
        and not may_be_written_by(n, tokens)
        and not is_probe(n)
    ]
    return Collection(kept, dropped, files)


def _numbers(store: Store) -> list[int]:
    return [n for n in list_versions(store) if n > 0]


def _version(store: Store, number: int) -> Manifest:
    """Version ``number`` of the dataset (raises :class:`_Changed` if it went meanwhile)."""
    found = version_file(store, number)
    if found is None:  # a version without its file: the head's (a dataset packed before versions)
        raw, name = _read(store, MANIFEST_NAME), MANIFEST_NAME
        if raw is None or version_of(raw) != number:
            raise _Changed
    else:
        raw, name = found
    m = parse_manifest(store, raw, name)
    if m.version != number:
        raise ManifestError(
            f"{store.url_of(name)} is damaged: it says it is version {m.version}; restore it or "
            "remove that version's file"
        )
    return m


def _read(store: Store, name: str) -> bytes | None:
    try:
        return bytes(store.read_bytes(name))
    except StorageError as exc:
        if is_missing(exc):
            return None
        raise


def _size(store: Store, name: str) -> int:
    """``name``'s size, 0 if it went meanwhile (a losing run removes its files, an overwrite what it replaced)."""
    try:
        return store.size(name)
    except StorageError as exc:
        if is_missing(exc):
            return 0
        raise


def _remove(store: Store, name: str) -> None:
    """Remove ``name`` unless it went meanwhile."""
    try:
        store.remove(name)
    except StorageError as exc:
        if not is_missing(exc):
            raise


def _complete_head(store: Store, latest: int) -> None:
    """Move ``_manifest.json`` forward to version ``latest`` if a publish was cut short before moving it, so
    that it never names a version whose files are removed."""
    head = _read(store, MANIFEST_NAME)
    if head is None or version_of(head) >= latest:
        return
    found = version_file(store, latest)
    if found is None:
        return
    honoured = store.honours_conditions(f".shardstream-probe-{uuid.uuid4().hex[:16]}")
    with store.locked():
        move_head(store, found[0], latest, True, honoured)


def _claimed_run(store: Store) -> str | None:
    """The token of the run that holds the destination's claim, if one does."""
    found = _read(store, IN_PROGRESS)
    return None if found is None else found.decode("ascii", "replace").strip() or None


__all__ = ["Collection", "collect"]
