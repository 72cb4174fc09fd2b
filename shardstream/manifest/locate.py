"""Finding a dataset: its store and manifest from a URL, or a manifest made on the fly for bare tars."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from ..formats import TAR_COMPRESSION, shard_format_of
from ..storage import RetryPolicy, Store
from .files import dataset_store, load_manifest
from .index_tars import scan
from .schema import Manifest

log = logging.getLogger("shardstream")

def open_dataset(url_or_urls: str | os.PathLike[str] | Sequence[str], storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None) -> tuple[Store, Manifest]:
    """The store and manifest of a dataset; WebDataset tars without a manifest are scanned."""
    urls = [url_or_urls] if isinstance(url_or_urls, (str, os.PathLike)) else list(url_or_urls)
    urls = [os.fspath(u) for u in urls]
    if len(urls) == 1 and shard_format_of(urls[0]) not in TAR_COMPRESSION and "{" not in urls[0]:
        store = dataset_store(urls[0], storage_options, retry)
        return store, load_manifest(store)
    log.warning("scanning %d tar source(s) without a manifest; 'shardstream index' writes one so the next "
                "start is instant", len(urls))
    result = scan(urls, storage_options=storage_options)
    return Store(result.url, storage_options, retry), result.manifest
