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
from dataclasses import dataclass, field
from typing import Any

from braceexpand import braceexpand

from ..errors import CorruptShardError, DatasetExistsError, ShardstreamError, StorageError
from ..formats import TAR_COMPRESSION, shard_format_of
from ..formats import tar as tar_format
from ..formats.compression import decompress
from ..formats.tar import build_index
from ..formats.tar_index import index_name
from ..storage import Store, is_url
from .files import IN_PROGRESS, sync_existing, write_durably, write_manifest
from .schema import MANIFEST_NAME, Manifest, creation_info

log = logging.getLogger("shardstream")


@dataclass
class IndexResult:
    manifest: Manifest
    url: str
    unkeyed: list[str] = field(default_factory=list)  # members WebDataset would skip too
    # each uncompressed tar's sample index (None for compressed shards)
    indexes: list[bytes] | None = None
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
                        f"folder {item} holds no .tar, .tar.gz or .tar.zst files"
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
    formats = {shard_format_of(u) for u in urls}
    if len(formats) != 1 or not formats <= TAR_COMPRESSION.keys():
        raise ShardstreamError(
            f"shards must all be .tar, all .tar.gz or all .tar.zst (found {', '.join(sorted(map(str, formats)))})"
        )
    shard_format = formats.pop()
    names = [relative_name(u, root) for u in urls]
    if len(set(names)) != len(names):
        raise ShardstreamError("the same shard is named twice; give each shard once")
    samples, nbytes, digests = [], [], []
    counts: Counter[str] = Counter()
    unkeyed: list[str] = []
    indexes: list[bytes] | None = [] if shard_format == "tar" else None
    for name in names:
        data = root.read_bytes(name)
        where = root.url_of(name)
        if len(data) == 0:
            raise CorruptShardError(
                f"{where}: empty file, not a tar; remove it from the list or re-create it"
            )
        plain = decompress(data, TAR_COMPRESSION[shard_format], where)
        found = list(tar_format.iter_samples(plain, where, unkeyed=unkeyed))
        for _, fields in found:
            counts.update(fields.keys())
        if indexes is not None:
            indexes.append(build_index(plain, where, found))
        samples.append(len(found))
        nbytes.append(len(data))
        digests.append(hashlib.sha256(data).hexdigest())
        if on_shard:
            on_shard(len(data))
    manifest = Manifest(
        shard_format=shard_format,
        paths=names,
        samples=samples,
        nbytes=nbytes,
        sha256=digests,
        fields=[{"name": k, "type": "bytes", "samples": c} for k, c in sorted(counts.items())],
        created=creation_info(source="index", indexed=len(names)),
    )
    return IndexResult(manifest, root.url, unkeyed, indexes)


def _write_indexes(root: Store, result: IndexResult) -> None:
    """Write each tar's sample index next to it (``<shard>.idx``) and name their sha256 in the manifest;
    where the folder cannot be written (a read-only mount, a bucket of someone else's), none: readers
    then build each index once per host (see :mod:`shardstream.dataset.tar_indexes`)."""
    if result.indexes is None:
        return
    m = result.manifest
    digests = []
    try:
        for name, data in zip(m.paths, result.indexes):
            write_durably(root, index_name(name), data)
            digests.append(hashlib.sha256(data).hexdigest())
    except (OSError, StorageError) as exc:
        for name in m.paths[: len(digests) + 1]:
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
    write_manifest(root, result.manifest)
    if force and any(store is root for store in unfinished):
        root.remove(IN_PROGRESS)  # the user says this folder's writing has finished
    return result
