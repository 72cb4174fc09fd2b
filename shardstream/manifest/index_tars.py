"""``index``: write a manifest for existing WebDataset tars (brace pattern, list or folder)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import posixpath
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from braceexpand import braceexpand

from ..errors import CorruptShardError, DatasetExistsError, ShardstreamError, StorageError
from ..formats import TAR_COMPRESSION, TAR_FORMAT, shard_format_of
from ..formats import tar as tar_format
from ..formats.compression import decompress, true_compression
from ..formats.tar import build_index
from ..storage import Store, is_url
from ..storage.conditional import WriteConflict
from .files import IN_PROGRESS, sync_existing, write_durably
from .image_sizes import ShardSizes, encode_image_sizes
from .media_facts import encode_media_facts
from .schema import MANIFEST_NAME, Manifest, creation_info
from .side_names import index_name
from .versions import publish_next

log = logging.getLogger("shardstream")


@dataclass
class IndexResult:
    """What an index published: the manifest, the dataset's URL, and what to warn of (tar members of
    no sample, notes); for tars, each tar's sample index and whether it was written."""

    manifest: Manifest
    url: str
    unkeyed: list[str] = field(default_factory=list)  # members without a KEY.EXT name
    notes: list[str] = field(default_factory=list)  # warnings, one line each
    # each tar's sample index, with member checksums (None for tars no index can hold: sparse members)
    indexes: list[bytes | None] | None = None
    indexes_written: bool = False  # next to their shards, their sha256 in the manifest


def expand_sources(
    sources: Sequence[str], storage_options: dict[str, Any] | None = None
) -> list[str]:
    """Shard URLs from brace patterns (``shard-{000..009}.tar``), plain URLs and folders."""
    urls: list[str] = []
    for source in sources:
        for item in braceexpand(str(source)):
            store = Store(item, storage_options)
            if store.is_dir():
                found = [n for n in store.list_files() if shard_format_of(n) in TAR_COMPRESSION]
                if not found:
                    raise ShardstreamError(
                        f"folder {item} holds no .tar, .tar.gz, .tar.zst, .tar.xz or .tar.bz2 files"
                    )
                urls += [store.url_of(n) for n in found]
            else:
                urls.append(item)
    if not urls:
        raise ShardstreamError("no shards given; name tar files, a brace pattern or a folder")
    return urls


def common_folder(urls: list[str]) -> str:
    """The deepest folder that holds every URL (where an index's manifest goes by default)."""
    if all(not is_url(u) for u in urls):
        return os.path.commonpath([os.path.dirname(os.path.abspath(u)) for u in urls])
    parts = [u.split("/")[:-1] for u in urls]
    common = []
    for segs in zip(*parts):
        if len(set(segs)) != 1:
            break
        common.append(segs[0])
    return "/".join(common)


def relative_name(url: str, root: Store) -> str:
    """``url``'s path inside ``root`` (a shard path of the manifest); refused outside it."""
    if root.local and not is_url(url):
        rel = os.path.relpath(os.path.abspath(url), root.root)
        rel = rel.replace(os.sep, "/")
    else:
        rel = url[len(root.url) + 1 :] if url.startswith(root.url + "/") else ".."
    if rel.startswith("../") or rel == "..":
        raise ShardstreamError(
            f"shard {url} is not inside the output folder {root.url}; choose an output folder that holds every shard"
        )
    return posixpath.normpath(rel)


def scan(
    sources: Sequence[str],
    output: str | None = None,
    storage_options: dict[str, Any] | None = None,
    on_shard: Callable[[int], None] | None = None,
) -> IndexResult:
    """Read every tar, count its samples and fields: the manifest they would have (not written).

    ``output`` (the folder the shard paths are relative to) defaults to the folder that
    holds all the shards.
    """
    urls = expand_sources(sources, storage_options)
    return _scan(
        urls,
        Store(output if output is not None else common_folder(urls), storage_options),
        on_shard,
    )


def _scan(urls: list[str], root: Store, on_shard: Callable[[int], None] | None) -> IndexResult:
    named = {u: shard_format_of(u) for u in urls}
    if not set(named.values()) <= TAR_COMPRESSION.keys():
        odd = next(u for u, f in named.items() if f not in TAR_COMPRESSION)
        raise ShardstreamError(
            f"{odd} is not a tar shard (.tar, .tar.gz, .tar.zst, .tar.xz, .tar.bz2); index tars only"
        )
    names = [relative_name(u, root) for u in urls]
    if len(set(names)) != len(names):
        raise ShardstreamError("the same shard is named twice; give each shard once")
    shards = _Shards()
    # the shard's sha256 in a thread while this one reads its headers and hashes its samples
    # (hashlib lets go of the GIL on large buffers)
    with ThreadPoolExecutor(1, thread_name_prefix="shardstream-sha256") as hasher:
        for name, url in zip(names, urls):
            data = root.read_bytes(name)
            digest = hasher.submit(lambda d: hashlib.sha256(d).hexdigest(), data)
            shards.add(data, root.url_of(name), named[url])
            shards.digests.append(digest.result())
            if on_shard:
                on_shard(len(data))
    kinds = Counter(shards.compressions)
    manifest = Manifest(
        # each shard is read by its own first bytes; a folder that mixes compressions is "tar"
        shard_format=TAR_FORMAT[shards.compressions[0]] if len(kinds) == 1 else "tar",
        paths=names,
        stored_counts=shards.samples,
        nbytes=shards.nbytes,
        sha256=shards.digests,
        fields=[
            {"name": k, "type": "bytes", "samples": c} for k, c in sorted(shards.counts.items())
        ],
        created=creation_info(
            source="index",
            operation="index",
            indexed=len(names),
            compressions=", ".join(
                f"{k or 'none'} {n}"
                for k, n in sorted(kinds.items(), key=lambda kn: kn[0] or "none")
            ),
            **({"left_out": shards.left_out_text()} if shards.left_out else {}),
        ),
    )
    manifest.image_sizes = encode_image_sizes(shards.sizes)
    manifest.media = encode_media_facts([s.media for s in shards.sizes])
    indexes = shards.indexes if any(i is not None for i in shards.indexes) else None
    return IndexResult(manifest, root.url, shards.unkeyed, shards.notes, indexes)


class _Shards:
    """What indexing the shards one after the other finds: the manifest's columns, and the warnings."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.nbytes: list[int] = []
        self.digests: list[str] = []
        self.compressions: list[str | None] = []
        self.indexes: list[bytes | None] = []
        self.sizes: list[ShardSizes] = []  # each image's width and height, from its header
        self.counts: Counter[str] = Counter()
        self.unkeyed: list[str] = []
        self.notes: list[str] = []
        self.left_out: dict[str, tuple[int, list[str]]] = {}
        self._previous: tuple[str, set[str]] | None = None

    def add(self, data: bytes, where: str, named: str | None) -> None:
        """Read one shard (``data``, at ``where``, whose name says ``named``); its sha256 is the caller's."""
        if len(data) == 0:
            raise CorruptShardError(
                f"{where}: empty file, not a tar; remove it from the list or re-create it"
            )
        said = TAR_COMPRESSION[named] if named else None
        compression = true_compression(data, said)
        if compression != said:
            self.notes.append(
                f"{where}: the name says {said or 'an uncompressed tar'}, but the bytes are "
                f"{compression or 'an uncompressed tar'}; read as what the bytes are (rename it "
                f"to end in .{TAR_FORMAT[compression]})"
            )
        plain = decompress(data, compression, where)
        found = tar_format.read_samples(plain, where)
        # each member's checksum of the bytes whose sha256 the manifest records (of a compressed shard too)
        self.indexes.append(
            build_index(plain, where, found, checked=True, compressed=plain is not data)
        )
        self.sizes.append(_image_sizes(plain, found))
        for entry in found.fields:
            self.counts.update(entry.keys())
        self.unkeyed += found.unkeyed
        self.notes += found.notes(where)
        self._split_keys(where, found.keys)
        for what, names in (("'__' keys", found.reserved), ("links", found.links)):
            if names:
                self._leave_out(what, names)
        if found.odd:
            self._leave_out("odd extensions", found.odd)
        self.samples.append(len(found.keys))
        self.nbytes.append(len(data))
        self.compressions.append(compression)

    def _split_keys(self, where: str, keys: list[str]) -> None:
        """Warn of keys in this shard and the one before: a sample's members split across two shards."""
        mine = set(keys)
        if self._previous is not None:
            both = [k for k in keys if k in self._previous[1]]
            if both:
                self.notes.append(
                    f"{where}: {len(both)} key(s) also in {self._previous[0]} (e.g. "
                    f"{ascii(both[0])}): a sample split across two shards is two samples"
                )
        self._previous = where, mine

    def _leave_out(self, what: str, names: list[str]) -> None:
        count, examples = self.left_out.get(what, (0, []))
        self.left_out[what] = count + len(names), (examples + names)[:3]

    def left_out_text(self) -> str:
        """The members in no sample, by reason, for the manifest's ``created`` (which holds text)."""
        return "; ".join(
            f"{n} with {what} (e.g. {', '.join(map(ascii, examples))})"
            for what, (n, examples) in self.left_out.items()
        )


def _image_sizes(plain: Any, found: Any) -> ShardSizes:
    """Each image's width and height in the tar ``plain``, read from its header in place (none of a
    shard whose sparse members are not in one piece)."""
    sizes = ShardSizes()
    view = memoryview(plain)
    for fields in found.fields:
        if not found.sparse:
            for name, (offset, size) in fields.items():
                sizes.record(name, view[offset : offset + size])
        sizes.end_sample()
    return sizes


def _write_indexes(root: Store, result: IndexResult) -> None:
    """Write each tar's sample index into ``.shardstream/`` beside it (``.shardstream/<shard>.idx``) and name their sha256 in the manifest;
    where the folder cannot be written (a read-only mount, a bucket of someone else's), none: readers
    then build each index once per host (see :mod:`shardstream.dataset.shards.tar_indexes`)."""
    if result.indexes is None:
        return
    m = result.manifest
    digests = []
    try:
        for name, data in zip(m.paths, result.indexes):
            # none: a tar no index holds (sparse members): read from its headers
            if data is not None:
                write_durably(root, index_name(name), data)
            digests.append(hashlib.sha256(data).hexdigest() if data is not None else "")
    except (OSError, StorageError) as exc:
        for name, data in zip(m.paths[: len(digests) + 1], result.indexes):
            if data is not None:
                with contextlib.suppress(OSError, StorageError):
                    root.remove(index_name(name))
        if not _not_writable(exc):
            raise  # a full disk, a lost connection: the index fails, and says why
        log.warning(
            "%s: the sample indexes of its tars could not be written (%s); readers build them once "
            "per host instead",
            root.url,
            " ".join(str(exc).split())[:200],
        )
        return
    m.index_sha256 = digests
    result.indexes_written = True


def publish_index(root: Store, manifest: Manifest) -> None:
    """Publish an index's manifest in ``root``: version 1 where there is no dataset, else (``--overwrite``)
    the next version after the latest, as a pack publishes one (so that readers never follow an older
    version past it); the earlier versions stay until 'shardstream gc' removes them."""
    try:
        publish_next(root, manifest)
    except WriteConflict:
        raise WriteConflict(
            f"cannot index into {root.url}: another writer published version {manifest.version} there "
            "meanwhile; index again"
        ) from None


def _unfinished_packs(urls: list[str], root: Store) -> list[Store]:
    """The folders among the shards' and ``root`` that hold the marker of an unfinished shardstream pack."""
    folders = {root.root if root.local else root.url: root}
    for url in urls:
        folder = posixpath.dirname(url) if is_url(url) else os.path.dirname(os.path.abspath(url))
        folders.setdefault(folder, Store(folder, root.storage_options))
    return [store for store in folders.values() if store.exists(IN_PROGRESS)]


def _not_writable(exc: BaseException) -> bool:
    """Whether ``exc`` says the folder may not be written (a read-only mount, another's bucket)."""
    cause = exc.__cause__ if isinstance(exc, StorageError) else exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__
    return isinstance(cause, PermissionError) or getattr(cause, "errno", None) in (
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
    )


def index(
    sources: Sequence[str],
    output: str | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    on_shard: Callable[[int], None] | None = None,
    force: bool = False,
) -> IndexResult:
    """Read every tar, count its samples and fields, and publish a manifest in ``output``.

    ``output`` defaults to the folder that holds all the shards. Shards of a shardstream pack
    that did not finish (their folder holds ``.shardstream-writing``) are refused unless
    ``force``: some of them may be missing; re-running the pack is the fix. With ``force`` the
    marker of the folder the manifest goes to is removed once the manifest is published.
    """
    if (
        output is not None
        and not overwrite
        and Store(output, storage_options).exists(MANIFEST_NAME)
    ):
        raise DatasetExistsError(
            f"{output} already has a {MANIFEST_NAME}; pass --overwrite to replace it"
        )
    urls = expand_sources(sources, storage_options)
    root = Store(output if output is not None else common_folder(urls), storage_options)
    unfinished = _unfinished_packs(urls, root)
    if unfinished and not force:
        raise ShardstreamError(
            f"{unfinished[0].url} holds an unfinished shardstream pack ({IN_PROGRESS}), whose shards may be "
            f"incomplete: re-run the pack, or pass --force (force=True) or remove {IN_PROGRESS} if you know "
            "the shards are complete"
        )
    result = _scan(urls, root, on_shard)
    if not overwrite and root.exists(MANIFEST_NAME):
        raise DatasetExistsError(
            f"{root.url} already has a {MANIFEST_NAME}; pass --overwrite to replace it"
        )
    sync_existing(root, result.manifest.paths)  # shards written just before may not be on disk yet
    _write_indexes(root, result)
    publish_index(root, result.manifest)
    if force and any(store is root for store in unfinished):
        root.remove(IN_PROGRESS)  # the user says this folder's writing has finished
    return result
