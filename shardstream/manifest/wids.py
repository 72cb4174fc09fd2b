"""The shard list ``wids`` reads (``wids.ShardListDataset``, webdataset's indexed tars) for a dataset of tar
shards: ``{"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": ..., "shardlist": [{"url",
"nsamples", "filesize"}, ...]}``, the shards in manifest order, so that ``wids[i]`` is ``ShardMap[i]``.

wids resolves a relative ``url`` against the folder of the JSON file it loads (the ``base`` it is given
overrides that; a ``"base"`` key at the top of the file does not), so each URL is made relative to the
folder the list is meant for (by default the dataset's own) where both are on one file system or one
bucket, and is the shard's full URL elsewhere.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any
from urllib.parse import urlsplit

from ..errors import ShardstreamError
from ..storage import is_url
from .sample_set import samples_of
from .schema import Manifest

KIND = "wids-shard-index-v1"


def wids_problem(manifest: Manifest) -> str | None:
    """Why wids cannot read ``manifest``'s samples as shardstream does (as a phrase), or None."""
    if manifest.shard_format != "tar":
        return f"wids reads uncompressed tar shards, and these are {manifest.shard_format}"
    if manifest.num_shards == 0:
        return "it has no shards"
    if samples_of(manifest).selected:
        return "it is a split part, which reads some samples of each shard, and wids reads them all"
    if manifest.relabel is not None:
        return (
            "it is a merge whose labels shardstream maps to one class list, and wids reads each "
            "shard's labels as stored"
        )
    return None


def relative_url(url: str, folder: str) -> str:
    """``url`` relative to ``folder`` where both are local or on one bucket; else ``url`` itself."""
    if not is_url(url) and not is_url(folder):
        return os.path.relpath(os.path.abspath(url), os.path.abspath(folder)).replace(os.sep, "/")
    if not (is_url(url) and is_url(folder)):
        return url
    there, here = urlsplit(url), urlsplit(folder)
    if (there.scheme, there.netloc) != (here.scheme, here.netloc):
        return url
    return posixpath.relpath(there.path or "/", here.path or "/")


def shard_list(
    manifest: Manifest,
    shard_urls: list[str],
    name: str,
    folder: str,
) -> dict[str, Any]:
    """The wids shard list of ``manifest``'s shards (at ``shard_urls``) for a file in ``folder``;
    ``name``: the dataset's name in it. A :class:`ShardstreamError` says why wids cannot read it."""
    problem = wids_problem(manifest)
    if problem is not None:
        raise ShardstreamError(f"no wids shard list for {name}: {problem}")
    return {
        "__kind__": KIND,
        "wids_version": 1,
        "name": name,
        "shardlist": [
            {"url": relative_url(url, folder), "nsamples": int(n), "filesize": int(size)}
            for url, n, size in zip(
                shard_urls, manifest.stored_counts.tolist(), manifest.nbytes.tolist()
            )
        ],
    }


__all__ = ["KIND", "relative_url", "shard_list", "wids_problem"]
