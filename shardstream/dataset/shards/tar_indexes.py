"""Where a tar shard's sample index comes from: its stored one (``.shardstream/<shard>.idx``, or beside the shard in older datasets), or one built once per host.

A shard packed with its index (the default) is opened from that file, checked against the
manifest's sha256 of it. A tar without one (another tool's, packed with ``--no-index``, indexed in a
folder that could not be written, or compressed) would have its headers parsed by every worker of
every epoch; instead the first reader on a host parses them once (strictly, as always), builds the
index (:func:`~shardstream.formats.tar.build_index`) and keeps it in the host's private cache,
where every later worker, rank and run on the host finds it (``indexes/`` in the shard cache).

The cached index is named by what it describes: for a local file, its path and version (device,
inode, size, modification time) and the manifest's sha256 of it, so a replaced file gets a new
index; for a downloaded shard, its cache key (its checked sha256). A cached index that does not
parse is removed and built again. Where no cache can be written (a read-only or full disk), the
index is built in memory for this process, with one warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...errors import ShardstreamError
from ...formats.tar import build_index
from ...formats.tar_index import MAGIC, SampleIndex, parse_index
from ...manifest import Manifest
from ...manifest.side_names import index_name, old_index_name
from ...storage import DiskCache, ShardFetcher, Store

log = logging.getLogger("shardstream")


def read_stored_indexes(
    fetcher: ShardFetcher, paths: list[str], digests: list[str]
) -> list[bytes | None]:
    """The stored indexes (sample indexes, Parquet row-group indexes) of the shards at ``paths``, each
    checked against ``digests[i]``: where this format keeps them (``.shardstream/`` beside the shard,
    read at once), else where older formats did (beside the shard, for those not found); ``None`` where
    neither holds it."""
    out: list[bytes | None] = [None] * len(paths)
    todo = list(range(len(paths)))
    for where in (index_name, old_index_name):
        if not todo:
            break
        try:  # one concurrent read of them all, the usual case
            found = fetcher.read_checked_many(
                [where(paths[i]) for i in todo], [digests[i] for i in todo]
            )
            pairs = list(zip(todo, found))
        except Exception:  # some are not there: each on its own
            pairs = [(i, _one(fetcher, where(paths[i]), digests[i])) for i in todo]
        for i, data in pairs:
            out[i] = data
        todo = [i for i in todo if out[i] is None]
    return out


def _one(fetcher: ShardFetcher, name: str, digest: str) -> bytes | None:
    try:
        return fetcher.read_checked_many([name], [digest])[0]
    except Exception:  # missing, or not the one the manifest names
        return None


class _NoIndex(Exception):
    """The tar has members no sample index can hold (sparse ones)."""


def _taken(found: Any) -> bytes:
    """The bytes of a file the cache handed out, copied, and the cache's lock on it let go."""
    data = bytes(found)
    if hasattr(found, "close"):
        found.close()
    return data


class SampleIndexes:
    """The sample indexes of one dataset's tar shards, for :class:`~shardstream.dataset.shards.readers.OpenShards`.

    ``cache``: makes the host's cache for built indexes when one is first needed (a local dataset
    reads its shards in place and has none until then)."""

    def __init__(
        self,
        store: Store,
        manifest: Manifest,
        fetcher: ShardFetcher,
        cache: Callable[[], DiskCache] | None = None,
    ):
        self.store, self.manifest, self.fetcher = store, manifest, fetcher
        self._make_cache = cache or DiskCache
        self._cache: DiskCache | None = None
        self._no_cache = False  # the cache could not be made: indexes are built in memory
        self.built = 0  # indexes this process built from a tar's headers (the others were found)

    def get(self, shard: int, plain: Any, compressed: bool) -> SampleIndex | None:
        """The index of ``shard``, whose uncompressed bytes are ``plain``: its stored one, else one built from
        ``plain`` once per host. ``None`` when none can be had: the caller parses the headers, which say
        what is wrong."""
        found = self.stored([shard], {shard: len(plain)} if compressed else None).get(shard)
        return found if found is not None else self.from_cache(shard, plain, compressed)

    def stored(
        self, shards: list[int], tar_sizes: dict[int, int] | None = None
    ) -> dict[int, SampleIndex | None]:
        """The stored indexes of ``shards`` (fetched at once), each checked against the manifest's
        sha256; a remote one through the host's cache, so a host fetches it once. ``None`` for a shard
        without one, or one that does not check: its tar is read whole instead, and says what is wrong.
        ``tar_sizes``: the decompressed size of compressed shards (whose index has offsets in it); a shard
        not in it is read as an uncompressed tar of the manifest's size, and the index of a compressed
        shard is only given for one that is in it."""
        digests = getattr(self.manifest, "index_sha256", None)
        out: dict[int, SampleIndex | None] = dict.fromkeys(shards)
        todo = [s for s in dict.fromkeys(shards) if digests and digests[s]]
        if not todo:
            return out
        cache = None if self.store.local else self.cache()
        found = self._through(cache, todo) if cache is not None else self._read(todo)
        sizes = tar_sizes or {}
        for s, data in found.items():
            name = self.store.url_of(index_name(self.manifest.paths[s]))
            samples = int(self.manifest.stored_counts[s])
            try:
                index = parse_index(data, name, samples, sizes.get(s, int(self.manifest.nbytes[s])))
            except ShardstreamError:
                index = None
            # offsets in a decompressed tar are no offsets in the stored shard, nor the other way round
            out[s] = index if index is not None and index.compressed == (s in sizes) else None
        return out

    def _read(self, shards: list[int]) -> dict[int, bytes]:
        """The stored indexes of ``shards``, read now (concurrent GETs), checked; those that cannot be had
        are left out (their tars are read whole instead, and say what is wrong)."""
        digests = self.manifest.index_sha256
        paths = [self.manifest.paths[s] for s in shards]
        found = read_stored_indexes(self.fetcher, paths, [digests[s] for s in shards])
        return {s: data for s, data in zip(shards, found) if data is not None}

    def _through(self, cache: DiskCache, shards: list[int]) -> dict[int, bytes]:
        """The stored indexes of ``shards`` through the host's cache: each read once per host (a process
        that finds another fetching one waits for it), several at once."""
        digests = self.manifest.index_sha256

        def one(shard: int) -> tuple[int, bytes | None]:
            try:
                got = cache.get(digests[shard], lambda: self._read([shard])[shard], content=True)
                return shard, _taken(got)
            except Exception:  # the tar is read whole instead, and says what is wrong
                return shard, None

        with ThreadPoolExecutor(min(16, len(shards))) as pool:
            return {s: data for s, data in pool.map(one, shards) if data is not None}

    def from_cache(self, shard: int, plain: Any, compressed: bool) -> SampleIndex | None:
        """``shard``'s index from the host's cache, built there from ``plain`` by the first reader."""
        name = self.store.url_of(self.manifest.paths[shard])
        samples, size = int(self.manifest.stored_counts[shard]), len(plain)

        def build() -> bytes:
            self.built += 1
            data = build_index(plain, name)
            # sparse members: no index holds their bytes, which are read from the headers
            if data is None:
                raise _NoIndex
            return data

        cache = self.cache()
        try:
            if cache is None:
                return parse_index(build(), name, samples, size)
            return self._cached(cache, self.key(shard, compressed), build, name, samples, size)
        except _NoIndex:
            return None

    @staticmethod
    def _cached(
        cache: DiskCache, key: str, build: Callable[[], bytes], name: str, samples: int, size: int
    ) -> SampleIndex | None:
        for _ in range(2):
            data = _taken(cache.get(key, build))
            try:
                return parse_index(data, name, samples, size)
            except ShardstreamError:
                # damaged in the cache, or built from another version of the shard: once more
                cache.discard(key)
        return None

    def key(self, shard: int, compressed: bool) -> str:
        """The cache key of ``shard``'s built index (see the module)."""
        if self.store.is_local(self.manifest.paths[shard]):
            path = self.store.path(self.manifest.paths[shard])
            st = os.stat(path)
            version = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            what = "\0".join(map(str, (*version, self.fetcher.digest(shard))))
        else:
            what = self.fetcher.key(shard)
        kind = "compressed" if compressed else "plain"
        return hashlib.sha256(
            f"sample index\0{MAGIC.decode()}\0{kind}\0{what}".encode()
        ).hexdigest()

    def cache(self) -> DiskCache | None:
        """The cache built indexes go to (made on first use: ``indexes/`` in the host's shard cache, an
        eighth of its limit), or ``None`` if none can be made."""
        if self._cache is None and not self._no_cache:
            try:
                shards = (
                    self.fetcher.cache if self.fetcher.cache is not None else self._make_cache()
                )
                if shards.full:  # no room on its disk (it says so once): indexes in memory
                    self._no_cache = True
                    return None
                self._cache = DiskCache(
                    os.path.join(shards.root, "indexes"), max(shards.limit // 8, 1), quiet=True
                )
            except (ShardstreamError, ValueError, OSError) as exc:
                self._no_cache = True
                log.warning(
                    "%s: no cache for the sample indexes of its tars (%s); each process parses "
                    "their headers itself. Set cache_dir to a writable folder to keep them",
                    self.store.url,
                    exc,
                )
        return self._cache
