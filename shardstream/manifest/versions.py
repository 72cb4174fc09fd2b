"""A dataset's versions: every publish is one, and earlier ones stay readable.

Version ``N`` of a dataset is the manifest head ``.shardstream/versions/00000N.json`` (``_versions/`` in
datasets written before manifest format 4, read as they are; its shard table, if it has one, is named by
its hash); ``_manifest.json`` holds a copy of the latest. A publish of version ``N`` over a dataset (an
append, a ``pack --overwrite``, an ``index --overwrite``) is an exclusive create of its version file (a
hard link locally, a PUT with ``If-None-Match: *`` on S3): of two writers that both build on version
``N - 1``, one creates it and the other is refused, so no update is ever lost. ``_manifest.json`` is
moved forward afterwards (only forward); a reader that finds a newer version file than the head it read
(a publish cut short between the two writes) follows it, so the latest version is the head's, or the
first missing number after it, minus one: one extra small request per open.

That request asks for a file that is usually missing. S3 answers a GET of a missing key with 403, not
404, to a caller that may read but not list the bucket, so a 403 there is taken as "no newer version"
too (:func:`~shardstream.storage.classify.is_missing`): the head was read with the same credentials
just before, and the head is moved right after each version file is written, so the most such a
reader can miss is a publish cut short or still under way, and it reads the head's version, a
complete published one. (Asking without a GET would need a listing, which such callers may not do
either, or trusting the head alone, which would miss a publish cut short for every reader.)

Datasets packed before versions existed, and fresh packs, have no version files: their ``_manifest.json``
is version 1, and the first publish over it writes ``.shardstream/versions/000001.json`` for it. Version
files are always written to ``.shardstream/versions/``; a dataset of an older format appended to keeps
its earlier ones in ``_versions/``, and readers look in both.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError, StorageError, UsageError
from ..storage import DiskCache, Store
from ..storage.classify import is_missing
from ..storage.conditional import Expect, WriteConflict
from .files import (
    dataset_store,
    manifest_files,
    parse_manifest,
    read_head,
    write_durably,
    write_manifest,
)
from .schema import MANIFEST_NAME, NAMESPACE_FORMAT, Manifest
from .side_names import OLD_VERSIONS, VERSIONS, version_name

_VERSION_FILE = re.compile(r"^([0-9]{6,})\.json$")
_MOVES = 16  # attempts to move _manifest.json forward while other writers move it too
_FOLDERS: weakref.WeakKeyDictionary[Store, dict[bool, Store]] = weakref.WeakKeyDictionary()


def load_manifest(
    dataset: Store | str | os.PathLike[str],
    version: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: Callable[[], DiskCache] | None = None,
) -> Manifest:
    """The manifest of the dataset at ``dataset`` (a URL, a folder, or its :class:`Store`): its latest
    version, or with ``version`` that one (see :mod:`shardstream.manifest.versions`); a clear error if
    there is none. Datasets packed before versions existed are version 1.

    Args:
        dataset: the dataset's folder (a local path or an fsspec URL), or its ``Store``.
        version: the version to read (default: the latest).
        storage_options: fsspec options for ``dataset`` given as a URL.
        cache: makes the host's shard cache, through which a remote dataset's shard table is read
            once per host (see :func:`~shardstream.manifest.files.read_head`).

    Returns:
        The checked :class:`~shardstream.manifest.schema.Manifest`.
    """
    store = dataset if isinstance(dataset, Store) else dataset_store(dataset, storage_options)
    return read_version(store, version, cache)


def read_version(
    store: Store, version: int | None = None, cache: Callable[[], DiskCache] | None = None
) -> Manifest:
    """Version ``version`` of the dataset in ``store`` (``None``: the latest); a one-line error naming the
    versions there are if it has no such version."""
    head = read_head(store, cache)
    if version is None:
        return _follow(store, head, cache)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UsageError(f"version must be a whole number of 1 or more, not {version!r}")
    if version == head.version:
        return head
    found, name = version_file(store, version) or (None, version_name(version))
    if found is None:
        have = ", ".join(map(str, list_versions(store))) or "none"
        raise ManifestError(
            f"{store.url} has no version {version} (its versions: {have}); 'shardstream log "
            f"{store.url}' lists them (a version removed by 'shardstream gc' cannot be read)"
        )
    manifest = parse_manifest(store, found, name, cache)
    if manifest.version != version:
        raise ManifestError(
            f"{store.url_of(name)} is damaged: it says it is version "
            f"{manifest.version}; restore it or pin another version"
        )
    return manifest


def version_file(store: Store, version: int) -> tuple[bytes, str] | None:
    """Version ``version``'s file (its bytes and name): in ``.shardstream/versions/``, or where a dataset of
    an older format keeps its earlier versions (``_versions/``); None if it has none."""
    for old in (False, True):
        name = version_name(version, old)
        found = _read_optional(store, name)
        if found is not None:
            return found, name
    return None


def _follow(
    store: Store, manifest: Manifest, cache: Callable[[], DiskCache] | None = None
) -> Manifest:
    """The newest version from ``manifest`` on: its successors' files, while there are any (for a head of an
    older format, in the older versions folder too: a publish by an older shardstream cut short)."""
    while True:
        names = [version_name(manifest.version + 1)]
        if manifest.format < NAMESPACE_FORMAT:
            names.append(version_name(manifest.version + 1, old=True))
        found = None
        for name in names:
            # a 403 too: what S3 answers for a missing key to a reader that may not list (see the module)
            found = _read_optional(store, name, hidden=True)
            if found is not None:
                break
        if found is None:
            return manifest
        manifest = parse_manifest(store, found, name, cache)


def _read_optional(store: Store, name: str, hidden: bool = False) -> bytes | None:
    """The file ``name`` of ``store``, or None if there is none (``hidden``: or if it may not be read,
    see :func:`~shardstream.storage.classify.is_missing`): one GET (asking whether it exists first would
    cost a request more, and on S3 a listing more)."""
    try:
        return bytes(store.read_bytes(name))
    except StorageError as exc:
        if is_missing(exc, hidden):
            return None
        raise


def versions_folder(store: Store, old: bool = False) -> Store:
    """The store of ``store``'s versions folder (``old``: that of datasets of an older format), made once per
    store: a new store connects anew (on S3 a new client, about half a second here)."""
    folders = _FOLDERS.get(store)
    if folders is None:
        folders = _FOLDERS[store] = {}
    folder = folders.get(old)
    if folder is None:
        name = OLD_VERSIONS if old else VERSIONS
        folder = folders[old] = Store(f"{store.url}/{name}", store.storage_options, store.retry)
    return folder


def version_files(store: Store) -> list[str]:
    """The version files in ``store`` (``.shardstream/versions/…`` and an older format's ``_versions/…``)."""
    out = []
    for old, prefix in ((False, VERSIONS), (True, OLD_VERSIONS)):
        try:
            names = versions_folder(store, old).list_files()
        except StorageError as exc:
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            names = []
        out += [f"{prefix}/{n}" for n in names if _VERSION_FILE.match(n)]
    return out


def list_versions(store: Store) -> list[int]:
    """The numbers of the versions of the dataset in ``store`` that can be read, oldest first."""
    names = [n.rsplit("/", 1)[-1] for n in version_files(store)]
    numbers = {int(m.group(1)) for m in map(_VERSION_FILE.match, names) if m is not None}
    with contextlib.suppress(ManifestError):
        numbers.add(head_version(store))
    return sorted(numbers)


def head_version(store: Store) -> int:
    """The version number ``_manifest.json`` holds (a cheap read of its head, not of its shard table)."""
    found = _read_optional(store, MANIFEST_NAME)
    if found is None:
        raise ManifestError(f"{store.url} holds no dataset: {MANIFEST_NAME} is missing")
    return version_of(found)


def version_of(head: bytes) -> int:
    """The version a manifest head's bytes say (1 for none, as manifests written before versions)."""
    try:
        version = json.loads(head).get("version", 1)
    except (ValueError, AttributeError):
        return 0
    return version if type(version) is int else 0


def commit_version(
    store: Store,
    head: bytes,
    version: int,
    fsync: bool = True,
    honoured: bool = True,
    replaces: tuple[str, int] | None = None,
) -> None:
    """Publish the manifest head ``head`` (its shard table already written) as version ``version``: an
    exclusive create of its version file, then ``_manifest.json`` moved forward to it. Raises
    :class:`~shardstream.storage.conditional.WriteConflict` if another writer published ``version`` first
    (or replaced ``_manifest.json`` meanwhile, see :func:`move_head`; then the version file is removed again).
    ``honoured``: the store refuses a conditional write whose condition fails (else the write is plain,
    and the caller checks afterwards). Locally the caller holds the folder's lock
    (:meth:`~shardstream.storage.store.Store.locked`)."""
    name = version_name(version)
    if honoured:
        store.write_if(name, head, Expect(None), fsync, locked=store.local)
    else:
        write_durably(store, name, head, fsync)
    try:
        move_head(store, head, version, fsync, honoured, replaces)
    except WriteConflict:
        # no reader follows it (the head says it is that version), no writer builds on it
        store.remove(name)
        raise


def move_head(
    store: Store,
    head: bytes,
    version: int,
    fsync: bool,
    honoured: bool,
    replaces: tuple[str, int] | None = None,
) -> None:
    """Make ``_manifest.json`` hold ``head`` (version ``version``) unless it holds a newer version already.
    Raises :class:`~shardstream.storage.conditional.WriteConflict` where moving it would silently drop what
    another writer published without a version file (``write_manifest``, a shardstream before versions): if
    it holds another version ``version``, or (``replaces``: the tag and version of the head the writer found
    when it began) if it was replaced by one no newer than that head."""
    for _ in range(_MOVES):
        found = store.read_tagged(MANIFEST_NAME)
        if found is not None and (
            (version_of(found[0]) == version and found[0] != head)
            or (
                replaces is not None
                and found[1] != replaces[0]
                and version_of(found[0]) <= replaces[1]
            )
        ):
            raise WriteConflict(
                f"cannot publish version {version} of {store.url}: {MANIFEST_NAME} was replaced by "
                "another writer meanwhile (another writer was first)"
            )
        if found is not None and version_of(found[0]) >= version:
            return
        if not honoured:
            write_durably(store, MANIFEST_NAME, head, fsync)
            return
        try:
            store.write_if(
                MANIFEST_NAME,
                head,
                Expect(None if found is None else found[1]),
                fsync,
                locked=store.local,
            )
            return
        except WriteConflict:
            continue  # another writer moved it meanwhile: look again


def record_head(store: Store) -> None:
    """Write the version file of the version ``_manifest.json`` holds if it has none (a dataset packed before
    versions, or a fresh pack), byte for byte the head, so that it stays readable as that version once a
    newer one is published. Exclusive: a conflict means another writer wrote it first, the same bytes.
    Locally the caller holds the folder's lock."""
    head = store.read_tagged(MANIFEST_NAME)
    if head is None:
        return
    version = version_of(head[0])
    if version < 1 or any(
        store.read_tagged(version_name(version, old)) is not None for old in (False, True)
    ):
        return
    with contextlib.suppress(WriteConflict):
        store.write_if(version_name(version), head[0], Expect(None), locked=store.local)


def publish_next(
    store: Store, manifest: Manifest, fsync: bool = True, built_on: int | None = None
) -> Manifest:
    """Publish ``manifest`` in ``store`` in place of what is there, as the dataset's next version: version 1
    (``_manifest.json`` written) where there is no version yet, else the latest version plus one, published
    as an append publishes one (the shard table, then the exclusive create of its version file, then
    ``_manifest.json`` moved forward), so that readers never follow an older version past it and a writer
    that publishes the same number at once is refused. Earlier versions stay readable, their files left
    as they are ('shardstream gc' removes them). Raises
    :class:`~shardstream.storage.conditional.WriteConflict` if another writer published that version first,
    or (``built_on``: the version ``manifest`` was made from) if the latest is another one now.
    """
    numbers = [n for n in list_versions(store) if n > 0]
    if built_on is not None and (not numbers or max(numbers) != built_on):
        raise WriteConflict(
            f"{store.url} changed meanwhile (its latest version is "
            f"{max(numbers) if numbers else 'gone'}, not {built_on}); run it again"
        )
    if not numbers:
        manifest.version = 1
        write_manifest(store, manifest, fsync)
        return manifest
    manifest.version = max(numbers) + 1
    files = manifest_files(manifest)
    for name, data in files[:-1]:  # side files and the shard table, before the head that names them
        write_durably(store, name, data, fsync)
    honoured = store.honours_conditions(f".shardstream-probe-{uuid.uuid4().hex[:16]}")
    with store.locked():
        record_head(store)
        commit_version(store, files[-1][1], manifest.version, fsync, honoured)
    return manifest


@dataclass(frozen=True)
class VersionEntry:
    """One line of a dataset's log."""

    version: int
    at: str  # when it was published (its creation info), "" if unknown
    samples: int
    shards: int
    fingerprint: str
    operation: str  # pack, append, merge, split, index


def history(store: Store) -> list[VersionEntry]:
    """The dataset's readable versions, oldest first: number, time, samples, shards, fingerprint."""
    out = []
    for number in list_versions(store):
        m = read_version(store, number)
        created: dict[str, Any] = m.created
        out.append(
            VersionEntry(
                number,
                str(created.get("at", "")),
                m.num_samples,
                m.num_shards,
                m.fingerprint,
                str(created.get("operation", "pack")),
            )
        )
    return out


__all__ = [
    "VERSIONS",
    "load_manifest",
    "VersionEntry",
    "commit_version",
    "head_version",
    "history",
    "list_versions",
    "move_head",
    "publish_next",
    "read_version",
    "record_head",
    "version_file",
    "version_files",
    "version_name",
    "versions_folder",
    "version_of",
]
