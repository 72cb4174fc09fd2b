"""Getting one shard's bytes: a memory map of a local file, or a checked download.

Remote shards are downloaded whole (one GET per shard, never one per sample), checked
against the manifest (size, and sha256 when it has one) and kept in the local
:class:`~shardstream.storage.cache.DiskCache`, from which every process on the host maps
them. A download cut short or corrupted on the way is fetched again, with backoff;
one that never matches fails with an error naming the URL.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import CorruptShardError
from .cache import DiskCache
from .store import Store

log = logging.getLogger("shardstream")


class ShardEntries(Protocol):
    """What fetching needs to know of a dataset's shards (a ``Manifest`` has it): path, size, sha256.

    Storage knows no manifests; any object with these three columns will do.
    """

    paths: Sequence[str]
    nbytes: Sequence[int]
    sha256: Sequence[str]


class ShardFetcher:
    """The bytes of shard ``i`` of a dataset: mapped locally, or downloaded into ``cache``."""

    def __init__(self, store: Store, manifest: ShardEntries, cache: DiskCache | None = None, verify: bool = True):
        self.store = store
        self.manifest = manifest
        self.cache = cache if cache is not None or store.local else DiskCache()
        self.verify = verify

    def key(self, shard: int) -> str:
        """The shard's name in the cache: its sha256, or a hash of its URL and size without one."""
        digest = self.manifest.sha256[shard] if shard < len(self.manifest.sha256) else ""
        if digest and len(digest) == 64:
            return digest.lower()
        url = self.store.url_of(self.manifest.paths[shard])
        return hashlib.sha256(f"{url}\0{int(self.manifest.nbytes[shard])}".encode()).hexdigest()

    def fetch(self, shard: int) -> Any:
        """Shard ``shard``'s bytes: a memory map (local file or cache) or ``bytes``."""
        path = self.manifest.paths[shard]
        if self.store.local:
            return self.store.read_bytes(path)
        return self.cache.get(self.key(shard), lambda: self.download(shard))

    def download(self, shard: int) -> bytes:
        """Shard ``shard`` from storage, checked; fetched again while it comes back damaged."""
        path = self.manifest.paths[shard]
        url = self.store.url_of(path)
        expected = int(self.manifest.nbytes[shard])
        digest = self.manifest.sha256[shard] if self.verify and shard < len(self.manifest.sha256) else ""
        retry = self.store.retry
        for attempt in range(retry.retries + 1):
            data = self.store.read_bytes(path, nbytes=expected)  # transient errors are retried inside
            if len(data) != expected:
                problem = f"{len(data)} bytes arrived, the manifest says {expected}"
            elif digest and hashlib.sha256(data).hexdigest() != digest:
                problem = "its sha256 differs from the manifest's"
            else:
                return data
            if attempt < retry.retries:
                log.warning("%s: %s; downloading it again", url, problem)
                time.sleep(retry.wait(attempt))
        raise CorruptShardError(
            f"{url}: {problem} on each of {retry.retries + 1} downloads; the object differs from the manifest "
            "(replaced or damaged): run 'shardstream verify' on the dataset, and re-pack or re-index it"
        )
