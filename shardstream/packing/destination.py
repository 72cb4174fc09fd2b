"""A destination's life while packing: claim it, write under this run's names, publish exclusively, clean up.

Every run has a token of its own (16 hex digits) and names its shards with it
(``shard-000000-<token>.tar``, and ``.shardstream/<shard>.idx`` for their sample indexes; a large manifest's shard
table is named by the hash of columns that name them), so no run ever writes where another run's bytes
live, published or not. The manifest, written last, names exactly the objects this run wrote, and is
published by an exclusive create: into an empty destination, of ``_manifest.json``; over a dataset (an
append, or an ``overwrite``), of the version file of the next version after the one the run found when
it claimed the destination (``.shardstream/versions/00000N.json``, then ``_manifest.json`` is moved forward: see
:mod:`shardstream.manifest.versions`), so that every writer over one dataset contends for the same object.
Locally that is a hard link of the finished file; on S3 a PUT with ``If-None-Match: *``. Of two runs at
once, at most one publishes; the other removes what it wrote and says so in its one-line error. On object storage the run
also re-reads the manifest after writing it and fails loudly if it is not its own: the only check a store
that ignores the condition allows (asked once per publish,
:meth:`~shardstream.storage.store.Store.honours_conditions`; there two packs at once are not safe, the
errors guide says so), and a second line of defence where a server checks the condition apart from the write.

Only once its manifest is published does a run remove what it replaces: the files shardstream makes that
were in the destination when the run claimed it (the previous dataset's shards, indexes and shard table,
and what interrupted runs left). Whatever run wrote them started before this publish, and its own
conditional publish can no longer succeed, so nothing a published manifest names is ever removed while
it is published. Until then the previous dataset stays whole and readable.

The ``.shardstream-writing`` marker holds the token of the run that claimed the destination last; a
run, or a worker of a killed run, that finds another token there removes what it wrote and stops. In a
local folder the claim, and a run's last check of it with its publish, are made under a lock on the folder
(``flock``), so a run that lost the claim can never publish: there a new run removes at once what other
runs left and no published manifest names (a re-run after a crash on a full disk has its room back).
With ``fsync`` (the default) every shard is on disk before the manifest is written, and the manifest
before it appears (local folders; object stores' PUT is durable).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import DatasetExistsError, ShardstreamError, StorageError, UsageError
from ..manifest import MANIFEST_NAME, Manifest, shard_name
from ..manifest.combine import appended
from ..manifest.files import IN_PROGRESS, manifest_files, sync_folder, write_durably
from ..manifest.image_sizes import (
    SIZES_PREFIX,
    SIZES_SUFFIX,
    ImageSizes,
    join_image_sizes,
    read_image_sizes,
)
from ..manifest.media_facts import (
    BLOCKS_PREFIX,
    BLOCKS_SUFFIX,
    MEDIA_PREFIX,
    MEDIA_SUFFIX,
    facts_of_shards,
    recorded_media,
)
from ..manifest.selection import SELECTION_PREFIX, SELECTION_SUFFIX
from ..manifest.side_names import NAMESPACE, index_names, old_index_name, side_file_pattern
from ..manifest.versions import (
    commit_version,
    list_versions,
    read_version,
    record_head,
    version_files,
    version_name,
    version_of,
)
from ..sources.remote import is_remote
from ..storage import Store
from ..storage.conditional import Expect, WriteConflict

__all__ = [
    "IN_PROGRESS",
    "Claim",
    "dataset_files",
    "files_of",
    "own_beside_indexes",
    "DestinationLost",
    "check_claim",
    "check_outside",
    "check_written",
    "is_probe",
    "made_by_shardstream",
    "may_be_written_by",
    "prepare_destination",
    "run_token",
]

log = logging.getLogger(__name__)

_FORMATS = r"(?:tar|tar\.zst|tar\.gz|arrow|tokens)"
_SHARD = rf"shard-[0-9]{{6,}}-(?P<run>[0-9a-f]{{16}})\.{_FORMATS}"
# a run's shards, and their sample indexes in .shardstream/ (beside them: an older format's, or another tool's)
_RUN_SHARD = re.compile(rf"^{_SHARD}$")
_RUN_INDEX = re.compile(rf"^{re.escape(NAMESPACE)}/{_SHARD}\.idx$")
# an index beside a shard, as formats before 4 wrote them (Energon's and DALI's have the same names)
_BESIDE_INDEX = re.compile(rf"^(?:{_SHARD}|shard-[0-9]{{6}}\.{_FORMATS})\.idx$")
# names of packs made before run tokens
_PLAIN_SHARD = re.compile(rf"^(?:{re.escape(NAMESPACE)}/)?shard-[0-9]{{6}}\.{_FORMATS}(?:\.idx)?$")
# the store's temporary names, beside their file or in .shardstream/
_TEMP_FILE = re.compile(rf"^(?:{re.escape(NAMESPACE)}/(?:versions/)?)?\..*\.[0-9a-f]{{8,32}}\.tmp$")
# a large manifest's shard table (manifest.table)
_SHARD_TABLE = re.compile(rf"^(?:{re.escape(NAMESPACE)}/|_)shards-[0-9a-f]{{16}}\.arrow$")
# a split's selection (manifest.selection)
_SELECTION = side_file_pattern(SELECTION_PREFIX, SELECTION_SUFFIX)
# each sample's recorded image size (manifest.image_sizes)
_IMAGE_SIZES = side_file_pattern(SIZES_PREFIX, SIZES_SUFFIX)
# each video and audio sample's recorded facts (manifest.media)
_MEDIA = side_file_pattern(MEDIA_PREFIX, MEDIA_SUFFIX)
# the block digests of large video and audio fields (manifest.media's blocks)
_MEDIA_BLOCKS = side_file_pattern(BLOCKS_PREFIX, BLOCKS_SUFFIX)
# a run's test of conditional writes
_PROBE = re.compile(r"^\.shardstream-probe-(?P<run>[0-9a-f]{16})$")
# one being written
_RUN_TEMP = re.compile(
    rf"^(?:{re.escape(NAMESPACE)}/)?\.shard-[0-9]{{6,}}-(?P<run>[0-9a-f]{{16}})\..*\.[0-9a-f]{{8,32}}\.tmp$"
)


def made_by_shardstream(name: str) -> bool:
    """Whether ``name`` (in a dataset's folder, or its ``.shardstream`` folder) is a file a pack makes there
    besides the manifest and the version files: a shard, a sample index, a shard table, a side file, a
    temporary file or a probe of conditional writes. An index beside a shard (formats before 4) is not
    counted: another tool keeps its own under the same name (:func:`own_beside_indexes` proves ours)."""
    return any(
        p.match(name)
        for p in (
            _RUN_SHARD,
            _RUN_INDEX,
            _PLAIN_SHARD,
            _TEMP_FILE,
            _SHARD_TABLE,
            _SELECTION,
            _IMAGE_SIZES,
            _MEDIA,
            _MEDIA_BLOCKS,
            _PROBE,
        )
    ) and not _BESIDE_INDEX.match(name)


def dataset_files(store: Store) -> list[str]:
    """The files of a dataset's folder that a pack's clean-up considers: those in the folder, and those in
    its ``.shardstream`` folder (named ``.shardstream/…``); a Parquet dataset's data folders are not
    listed (nothing there is removed)."""
    inner = Store(f"{store.url}/{NAMESPACE}", store.storage_options, store.retry)
    try:
        own = inner.list_files(recursive=True)
    except StorageError as exc:
        if not isinstance(exc.__cause__, FileNotFoundError):
            raise
        own = []
    return store.list_files() + [f"{NAMESPACE}/{n}" for n in own]


def own_beside_indexes(store: Store, names: list[str], manifests: list[Manifest]) -> list[str]:
    """Of ``names`` (files in the folder), the sample indexes beside shards (formats before 4) that
    shardstream wrote: those whose sha256 is the one a manifest of ``manifests`` records for the shard.
    Another tool's index under the same name (Megatron-Energon's, DALI's) is never among them."""
    recorded: dict[str, set[str]] = {}
    for m in manifests:
        for path, digest in zip(m.paths, m.index_sha256 or []):
            if digest:
                recorded.setdefault(old_index_name(path), set()).add(digest)
    out = []
    for name in names:
        if _BESIDE_INDEX.match(name) and name in recorded:
            try:
                data = bytes(store.read_bytes(name))
            except StorageError:
                continue
            if hashlib.sha256(data).hexdigest() in recorded[name]:
                out.append(name)
    return out


def run_token(name: str) -> str | None:
    """The token of the run that wrote ``name`` (a shard, its sample index, a temporary file of one, a probe of
    conditional writes), or ``None`` if its name carries none."""
    match = (
        _RUN_SHARD.match(name)
        or _RUN_INDEX.match(name)
        or _PROBE.match(name)
        or _RUN_TEMP.match(name)
    )
    return None if match is None else match["run"]


def is_probe(name: str) -> bool:
    """Whether ``name`` is a run's probe of conditional writes (``.shardstream-probe-<token>``)."""
    return _PROBE.match(name) is not None


def may_be_written_by(name: str, tokens: set[str]) -> bool:
    """Whether ``name`` may be a file of one of the runs whose tokens are ``tokens`` (runs that hold, or held, the
    destination's claim): one named with such a token, or, while there is any, a file that runs write without
    their token (a shard table, a side file, a temporary file of one): nothing tells whose those are."""
    if not tokens:
        return False
    token = run_token(name)
    return token in tokens if token is not None else not _PLAIN_SHARD.match(name)


class DestinationLost(ShardstreamError):
    """Another pack claimed or published the destination while this one was writing: nothing of this run
    was published (and, said in the message, what it wrote was removed)."""

    cleaned = False  # set on the error a run raises once it removed its files


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass
class Claim:
    """One run's hold on a destination (see the module's documentation): its token, the names it writes,
    its exclusive publish, and the clean-up of what it replaces or, when it loses, of what it wrote."""

    store: Store
    token: str
    fsync: bool = True
    # version tag of the manifest this run replaces; None: there was none
    replaces: str | None = None
    # shardstream's files found when claimed: removed once published
    leftovers: list[str] = field(default_factory=list)
    # files of this run whose names carry no token (its shard table)
    extra: list[str] = field(default_factory=list)
    published: bool = False
    # the version this run publishes, and (appends) the one its shards are added to
    version: int = 1
    base: Manifest | None = None
    # the version number the manifest this run replaces says it is
    replaced_version: int = 0

    def shard_name(self, index: int, shard_format: str) -> str:
        """The name this run writes shard ``index`` to: ``shard-000000-<token>.tar``."""
        return shard_name(index, shard_format, self.token)

    def owns(self, name: str) -> bool:
        """Whether this run wrote ``name`` (its token is in it, or it is one of the run's untokened files)."""
        return run_token(name) == self.token or name in self.extra

    def check(self) -> None:
        """Raise :class:`DestinationLost` unless this run still holds the destination's claim."""
        check_claim(self.store, self.token)

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Around a run's writing and publishing: if another run takes the destination meanwhile (a
        :class:`DestinationLost` from here or a worker), this run's files are removed and its error says so."""
        try:
            yield
        except DestinationLost as exc:
            if exc.cleaned:
                raise
            raise self.lost(
                f"{self.store.url} was claimed by another pack while this one was writing",
                "let one pack at a time write there",
            ) from None
        except (
            Exception
        ) as exc:  # another failure: this run's own, unless it lost the destination meanwhile
            if self.published or self._holds_claim():
                raise
            raise self.lost(
                f"{self.store.url} was claimed by another pack while this one was writing (and this "
                f"one failed: {' '.join(str(exc).split())})",
                "let one pack at a time write there",
            ) from exc

    def lost(self, what: str, advice: str) -> DestinationLost:
        """The error of a run that lost the destination (``what`` happened), once its own files are removed."""
        try:
            names = [n for n in dataset_files(self.store) if self.owns(n)]
            for name in names:
                self.store.remove(name)
            self._release()
            removed = f" and its {_plural(len(names), 'file')} {'was' if len(names) == 1 else 'were'} removed"
        except StorageError as exc:
            removed = (
                f"; removing its files (those named with {self.token}) failed, remove them yourself: "
                f"{' '.join(str(exc).split())}"
            )
        error = DestinationLost(f"{what}; this run's shards were not published{removed}; {advice}")
        error.cleaned = True
        return error

    def publish(self, manifest: Manifest) -> Manifest:
        """Write ``manifest`` (last; its shards all written by this run) if the destination still holds what
        it held when this run claimed it, then remove what it replaces; returns the manifest published (for an
        append: the dataset's shards, then this run's). Raises :class:`DestinationLost`,
        having removed this run's files, if another run claimed the destination or published first."""
        store = self.store
        manifest = self._versioned(manifest)
        with self.guard():
            self.check()
            honoured = store.honours_conditions(f".shardstream-probe-{self.token}")
            files = manifest_files(manifest)
            head = files[-1][1]
            for name, data in files[:-1]:  # the shard table
                self.extra.append(name)
                write_durably(store, name, data, self.fsync)
            if self.fsync:
                sync_folder(store)  # every shard (and the table) on disk before the manifest
        try:
            # locally, no run claims the folder between check and write
            with (
                self.guard(),
                store.locked(),
            ):
                self.check()
                # over a dataset (an append, an overwrite): its version's exclusive create is the publish
                if self.versioned:
                    replaces = (str(self.replaces), self.replaced_version)
                    commit_version(store, head, self.version, self.fsync, honoured, replaces)
                elif honoured:  # a fresh dataset: _manifest.json must still be free
                    store.write_if(
                        MANIFEST_NAME, head, Expect(None), self.fsync, locked=store.local
                    )
                else:
                    store.write_bytes(MANIFEST_NAME, head)
            if self.fsync:
                sync_folder(store)
        except WriteConflict:
            # (else a retried request whose first attempt had landed)
            if not self._is_published(head):
                raise self._conflict() from None
        # a server that ignored, or raced, the condition
        if not store.local and not self._is_published(head):
            why = "" if honoured else f"; {store.protocol}:// takes no conditional writes"
            raise self.lost(
                f"{store.url}: another pack published a dataset over this one ({MANIFEST_NAME} is not "
                f"this run's right after it was written{why})",
                "let one pack at a time write there",
            )
        self.published = True
        try:  # the dataset is published: what follows tidies up, and a failure there is only a warning
            self._release()
            self._clean_up()
        except StorageError as exc:
            log.warning(
                "%s is published, but tidying up after it failed: %s; the next pack there tidies up",
                store.url,
                " ".join(str(exc).split()),
            )
        return manifest

    @property
    def versioned(self) -> bool:
        """Whether this run publishes a version over a dataset (an append, or an overwrite of one): by the
        exclusive create of its version file, which every writer over that dataset contends for."""
        return self.base is not None or self.replaces is not None

    def _is_published(self, head: bytes) -> bool:
        name = version_name(self.version) if self.versioned else MANIFEST_NAME
        found = self.store.read_tagged(name)
        return found is not None and found[0] == head

    def _conflict(self) -> DestinationLost:
        """The error of a publish another writer beat (this run's files removed)."""
        if self.base is not None:
            return self.lost(
                f"{self.store.url}: another writer published version {self.version} first",
                "run it again: it builds on the latest version",
            )
        if self.replaces is None:
            state = f"{MANIFEST_NAME} appeared"
        elif self.store.exists(version_name(self.version)):
            state = f"version {self.version} was published first"
        else:
            state = f"{MANIFEST_NAME} was replaced"
        return self.lost(
            f"{self.store.url}: another pack published a dataset there while this one was writing "
            f"({state})",
            "pack again with --overwrite (overwrite=True) to "
            "replace it, or let one pack at a time write there",
        )

    def _versioned(self, manifest: Manifest) -> Manifest:
        """``manifest`` as the version this run publishes: after the base's shards for an append (its own
        files removed if they cannot join them)."""
        if self.base is None:
            manifest.version = self.version
            return manifest
        try:
            sizes = self._joined_sizes(manifest)
            joined = appended(self.base, manifest, self.store.url, self.version, sizes)
            joined.media = facts_of_shards(  # the base's facts, then this run's
                [
                    (
                        recorded_media(self.store, self.base),
                        self.base.stored_counts,
                        range(self.base.num_shards),
                    ),
                    (manifest.media, manifest.stored_counts, range(manifest.num_shards)),
                ]
            )
            return joined
        except ShardstreamError:
            for name in [n for n in dataset_files(self.store) if self.owns(n)]:
                self.store.remove(name)
            raise

    def _joined_sizes(self, manifest: Manifest) -> ImageSizes | None:
        """The recorded image sizes of the base's shards and this run's (an append), where both have them;
        None otherwise (then buckets by image size are computed as they are read)."""
        base = self.base
        if base is None or base.image_sizes is None or manifest.image_sizes is None:
            return None
        recorded = read_image_sizes(
            base.image_sizes.reference,
            lambda name: bytes(self.store.read_bytes(name)),
            base.paths,
            base.stored_counts,
        )
        return join_image_sizes(recorded, manifest.image_sizes)

    def _holds_claim(self) -> bool:
        """Whether the claim marker still holds this run's token (``True`` when it cannot be read)."""
        try:
            self.check()
        except DestinationLost:
            return False
        except StorageError:
            return True
        return True

    def _release(self) -> None:
        """Remove the claim marker if it is still this run's."""
        try:
            held = bytes(self.store.read_bytes(IN_PROGRESS)).decode("ascii", "replace").strip()
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return
            raise
        if held == self.token:
            self.store.remove(IN_PROGRESS)

    def _clean_up(self) -> None:
        """After the publish: remove what the new manifest replaced (the leftovers found when claimed)."""
        failed: list[str] = []
        problem = ""
        for name in self.leftovers:
            try:
                self.store.remove(name)
            except StorageError as exc:
                failed.append(name)
                problem = " ".join(str(exc).split())
        if failed:
            log.warning(
                "%s is published, but %s it replaced could not be removed (%s, ...): %s; remove them "
                "yourself",
                self.store.url,
                _plural(len(failed), "file"),
                failed[0],
                problem,
            )
        if self.fsync and self.leftovers:
            sync_folder(self.store)


def prepare_destination(
    store: Store, overwrite: bool, fsync: bool = True, append: bool = False, appendable: bool = True
) -> Claim:
    """Claim ``store`` for a new run: refuse a destination that holds a dataset unless ``overwrite`` (which
    replaces it) or ``append`` (which adds a version to it), note the version this run replaces or builds
    on and the files shardstream left there, and write the claim marker with this run's token. The
    published dataset's files are removed only once this run publishes (and never by an append: earlier
    versions stay readable): until then the previous dataset stays whole and readable. In a local folder,
    what other runs left and no version names is removed at once (the claim and a run's final check of
    its own are made under a lock on the folder, so none of those runs can publish any more); on object
    storage, after this run's publish (see the module's documentation).

    Shard-named files that no shardstream run left behind (WebDataset tars, say) are only replaced with
    ``overwrite``. ``appendable``: the caller can append (the refusal suggests it only then).
    """
    if store.local and os.path.exists(store.root) and not os.path.isdir(store.root):
        raise StorageError(f"{store.url} is a file; the destination must be a folder")
    store.makedirs()
    with store.locked():
        current = store.read_tagged(MANIFEST_NAME)
        if current is not None and not (overwrite or append):
            add = ", --append (append=True) to add to it" if appendable else ""
            raise DatasetExistsError(
                f"{store.url} already holds a dataset ({MANIFEST_NAME}); pass --overwrite "
                f"(overwrite=True) to replace it{add}, or choose another destination"
            )
        names = dataset_files(store)
        plain = [n for n in names if _PLAIN_SHARD.match(n)]
        if plain and not overwrite and current is None and IN_PROGRESS not in names:
            raise DatasetExistsError(
                f"{store.url} holds shard files that shardstream did not leave there ({plain[0]}, ...); "
                "pass --overwrite (overwrite=True) to replace them, or choose another destination"
            )
        token = uuid.uuid4().hex[:16]
        base = _append_base(store, token) if append and current is not None else None
        latest = None if current is None else (base or read_version(store)).version
        store.write_bytes(IN_PROGRESS, token.encode())
    leftovers = _leftovers(store, names, current, base)
    if fsync:
        # the claim survives a crash: the files it found stay the next run's to remove
        sync_folder(store)
    return Claim(
        store,
        token,
        fsync,
        None if current is None else current[1],
        leftovers,
        version=1 if latest is None else latest + 1,
        base=base,
        replaced_version=0 if current is None else version_of(current[0]),
    )


def check_outside(source: str, store: Store) -> None:
    """Refuse a destination (``store``) that is ``source`` or inside it: the pack would read what it writes."""
    if is_remote(source):
        if store.url == source.rstrip("/") or store.url.startswith(source.rstrip("/") + "/"):
            raise ShardstreamError(
                f"destination {store.url} is inside the source {source}; choose one outside it"
            )
        return
    if not store.local:
        return
    src, dst = os.path.realpath(source), os.path.realpath(store.root)
    if dst == src or dst.startswith(src.rstrip(os.sep) + os.sep):
        raise ShardstreamError(
            f"destination {store.root} is inside the source {source}; choose a folder outside it"
        )


def _leftovers(
    store: Store,
    names: list[str],
    current: tuple[bytes, str] | None,
    base: Manifest | None,
) -> list[str]:
    """The files shardstream made in ``names`` that a publish replaces (none for an append); locally, what no
    published version names is removed now (a re-run after a crash needs the room). An index beside a
    shard (formats before 4) counts only where its sha256 proves it is the one a version recorded."""
    published = _published(store)
    leftovers = [n for n in names if made_by_shardstream(n)]
    leftovers += own_beside_indexes(store, names, [] if published is None else published[1])
    if store.local:
        named = _named_by_versions(store) if base is not None else _named_by(store, current)
        for name in [n for n in leftovers if named is not None and n not in named]:
            store.remove(name)
        leftovers = [n for n in leftovers if named is None or n in named]
    if base is not None:
        return []  # an append removes nothing once published: its versions name it all
    if current is not None:  # an overwrite: the earlier versions go with their shards
        leftovers += version_files(store)
    return leftovers


def _published(
    store: Store, listed: set[str] | None = None
) -> tuple[set[str], list[Manifest]] | None:
    """The files the readable versions name, and those versions (``None`` if one cannot be read);
    ``listed``: the folder's files (see :func:`files_of`)."""
    names: set[str] = set()
    manifests = []
    for number in list_versions(store):
        try:
            m = read_version(store, number)
        except UsageError:
            raise
        except ShardstreamError:
            return None
        manifests.append(m)
        names |= files_of(m, store, listed)
    return names, manifests


def _append_base(store: Store, token: str) -> Manifest:
    """The version an append builds on (the latest), with its version file written if it has none yet (a
    dataset packed before versions); refused where the store takes no conditional writes."""
    if not store.honours_conditions(f".shardstream-probe-{token}"):
        raise StorageError(
            f"cannot append to {store.url}: {store.protocol}:// takes no conditional writes here, so two "
            "appends at once could lose one; append to a local folder or an S3 bucket, or pack it again "
            "with --overwrite"
        )
    base = read_version(store)
    record_head(store)
    return base


def _named_by_versions(store: Store) -> set[str] | None:
    """The files any readable version names (``None`` if one cannot be read)."""
    found = _published(store)
    return None if found is None else found[0]


def _named_by(store: Store, current: tuple[bytes, str] | None) -> set[str] | None:
    """The files the published manifest ``current`` (its bytes and tag) names; ``None`` if it cannot be
    read."""
    if current is None:
        return set()
    try:
        m = Manifest.from_json(
            current[0], store.url_of(MANIFEST_NAME), lambda name: bytes(store.read_bytes(name))
        )
    except (ValueError, ShardstreamError):
        return None
    return files_of(m)


def files_of(m: Manifest, store: Store | None = None, listed: set[str] | None = None) -> set[str]:
    """The files of its own folder a manifest names: shards, their indexes, its shard table and side files.
    A shard's index is where readers find it: in ``.shardstream/``, or beside the shard (formats before 4);
    with ``listed`` (the folder's files) the one of them a reader takes (where both are there, the first
    whose sha256 is the manifest's, read from ``store``), else both."""
    side = [] if m.table is None else [m.table]
    if m.selection is not None:
        side.append(m.selection.reference["file"])
    if m.image_sizes is not None:
        side.append(m.image_sizes.reference["file"])
    if m.media is not None:
        side.append(m.media.reference["file"])
        if "blocks" in m.media.reference:
            side.append(m.media.reference["blocks"]["file"])
    digests = m.index_sha256 or [""] * m.num_shards
    indexes = [_used_index(p, d, store, listed) for p, d in zip(m.paths, digests) if d]
    return {*m.paths, *(n for found in indexes for n in found), *side}


def _used_index(
    path: str, digest: str, store: Store | None, listed: set[str] | None
) -> tuple[str, ...]:
    """The names of shard ``path``'s index that a reader may take (see :func:`files_of`)."""
    new, old = index_names(path)
    if listed is None or store is None:
        return new, old
    if new in listed and old in listed:
        try:
            same = hashlib.sha256(bytes(store.read_bytes(new))).hexdigest() == digest
        except StorageError:
            same = False
        return (new,) if same else (old,)
    return tuple(n for n in (new, old) if n in listed)


def check_claim(store: Store, token: str) -> None:
    """Raise :class:`DestinationLost` unless the destination is still claimed by the run that owns ``token``."""
    try:
        found = bytes(store.read_bytes(IN_PROGRESS)).decode("ascii", "replace").strip()
    except StorageError as exc:
        if not isinstance(exc.__cause__, FileNotFoundError):
            raise
        found = None
    if found != token:
        raise DestinationLost(
            f"{store.url} was claimed by another pack while this one was writing ({IN_PROGRESS} "
            f"{'is gone' if found is None else 'holds another run'}); this run's shards were not published; "
            "let one pack at a time write there"
        )


def check_written(store: Store, names: list[str], sizes: list[int]) -> None:
    """Before the manifest: every shard written by another machine is at its name, as large as the task
    that wrote it said (its checksum is the task's own, over the bytes it wrote)."""
    for name, size in zip(names, sizes):
        found = store.size(name) if store.exists(name) else None
        if found != size:
            what = "is missing" if found is None else f"holds {found} bytes, its task wrote {size}"
            raise ShardstreamError(
                f"{store.url_of(name)} {what}; another process changed the destination "
                "during the pack: pack again"
            )
