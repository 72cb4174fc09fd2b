"""Finding a dataset: its store and manifest from a URL, or a manifest made on the fly for bare tars."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ManifestError
from ..formats import TAR_COMPRESSION, shard_format_of
from ..storage import DiskCache, RetryPolicy, Store
from ..storage.routed import open_roots
from .files import IN_PROGRESS, MANIFEST_NAME, dataset_store
from .index_tars import scan
from .schema import Manifest
from .versions import load_manifest

log = logging.getLogger("shardstream")
_TARS = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz")


def open_dataset(
    url_or_urls: str | os.PathLike[str] | Sequence[str],
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    version: int | None = None,
    cache: Callable[[], DiskCache] | None = None,
    trusted_roots: dict[str, dict[str, Any]] | None = None,
) -> tuple[Store, Manifest]:
    """The store and manifest (its latest version, or ``version``) of a dataset; WebDataset tars without a
    manifest are scanned. ``cache``: the host's shard cache, for a remote manifest's shard table (see
    :func:`~shardstream.manifest.files.read_head`). A manifest that names shards by full URL (a merge
    across stores) is read through a :class:`~shardstream.storage.routed.RoutedStore`, only where
    ``trusted_roots`` (location -> fsspec options) holds every such root; else a one-line error."""
    urls = [url_or_urls] if isinstance(url_or_urls, (str, os.PathLike)) else list(url_or_urls)
    urls = [os.fspath(u) for u in urls]
    if len(urls) == 1 and shard_format_of(urls[0]) not in TAR_COMPRESSION and "{" not in urls[0]:
        return open_stored(urls[0], storage_options, retry, version, cache, trusted_roots)
    log.warning(
        "scanning %d tar source(s) without a manifest; 'shardstream index' writes one so the next "
        "start is instant",
        len(urls),
    )
    if version not in (None, 1):
        raise ManifestError(f"tars without a manifest have one version (1), not {version}")
    result = scan(urls, storage_options=storage_options)
    return Store(result.url, storage_options, retry), result.manifest


def open_stored(
    url: str,
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    version: int | None = None,
    cache: Callable[[], DiskCache] | None = None,
    trusted_roots: dict[str, dict[str, Any]] | None = None,
) -> tuple[Store, Manifest]:
    """The store and manifest of the dataset at ``url`` (it has a manifest: no tars scanned); a manifest
    that names shards by full URL gets a :class:`~shardstream.storage.routed.RoutedStore` over the
    ``trusted_roots`` (location -> fsspec options) that hold them, else a one-line error."""
    store = dataset_store(url, storage_options, retry)
    manifest = load_dataset(store, version, cache)
    routed = open_roots(
        store,
        manifest.roots or [],
        trusted_roots or {},
        lambda root, options: Store(root, options, retry),
    )
    return routed or store, manifest


def load_dataset(
    store: Store, version: int | None = None, cache: Callable[[], DiskCache] | None = None
) -> Manifest:
    """The manifest (latest, or ``version``) of the dataset in ``store``; a local path that is none says what
    it is instead."""
    if store.local:
        _refuse_local_non_dataset(store)
    return load_manifest(store, version, cache=cache)


def _refuse_local_non_dataset(store: Store) -> None:
    """A local path that is no dataset, said as what it is: missing, a file, or a folder of files to pack
    (or of tars to index). A folder with a manifest, or a pack's unfinished one, is left to the manifest."""
    root = store.root
    if not os.path.exists(root):
        raise ManifestError(
            f"{root} does not exist; give the folder that 'shardstream pack' wrote (the one "
            f"with {MANIFEST_NAME})"
        )
    if not os.path.isdir(root):
        raise ManifestError(
            f"{root} is a file, not a dataset; pack it first: shardstream pack {root} DEST, "
            "then read DEST"
        )
    names = os.listdir(root)
    if MANIFEST_NAME in names or IN_PROGRESS in names:
        return
    if any(name.endswith(_TARS) for name in names):
        raise ManifestError(
            f"{root} holds tars but no dataset ({MANIFEST_NAME} is missing); if they are "
            f"WebDataset tars, write a manifest for them: shardstream index {root}"
        )
    if names:
        raise ManifestError(
            f"{root} is a folder of files, not a dataset ({MANIFEST_NAME} is missing); pack it "
            f"first: shardstream pack {root} DEST, then read DEST"
        )
