"""Getting one shard's bytes: a memory map of a local file, or a checked download.

Remote shards are downloaded whole (one GET per shard, never one per sample), checked
against the manifest (size, and sha256 when it has one) and kept in the local
:class:`~shardstream.storage.cache.DiskCache`, from which every process on the host maps
them. A download cut short or corrupted on the way is fetched again, with backoff, within
the store's retry budget (transport errors and damaged bytes share it); one that never
matches fails with an error naming the URL. Local shards are mapped as they are, or, with
``verify_local``, checked against their sha256 once per host (and again when they change).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..errors import CorruptShardError, ManifestError
from .cache import DiskCache
from .checked import once_per_host
from .store import Store

_SHA256 = re.compile(r"[0-9a-f]{64}")
_ADVICE = (
    "the object differs from the manifest (replaced or damaged): run 'shardstream verify' on the dataset, "
    "and re-pack or re-index it"
)


class ShardEntries(Protocol):
    """What fetching needs to know of a dataset's shards (a ``Manifest`` has it): path, size, sha256.

    Storage knows no manifests; any object with these three columns will do.
    """

    paths: Sequence[str]
    nbytes: Sequence[int]
    sha256: Sequence[str]


class ShardFetcher:
    """The bytes of shard ``i`` of a dataset: mapped locally, or downloaded into ``cache``.

    ``verify``: check downloads against the manifest's sha256 (their size is always checked).
    ``verify_local``: check local shards against it too, once per host for each version of a
    file (the result is kept in the private cache folder, so other workers, processes and runs
    skip an unchanged file).
    """

    def __init__(
        self,
        store: Store,
        manifest: ShardEntries,
        cache: DiskCache | None = None,
        verify: bool = True,
        verify_local: bool = False,
    ):
        self.store = store
        self.manifest = manifest
        self.cache = cache if cache is not None or store.local else DiskCache()
        self.verify = verify
        self.verify_local = verify_local
        # (bytes, nanoseconds) of each download
        self.on_download: Callable[[int, int], None] | None = None

    def digest(self, shard: int) -> str:
        """The manifest's sha256 of ``shard`` (lower case), or ``""`` when it has none."""
        digest = (self.manifest.sha256[shard] if shard < len(self.manifest.sha256) else "") or ""
        digest = digest.lower() if isinstance(digest, str) else digest
        if digest != "" and not (isinstance(digest, str) and _SHA256.fullmatch(digest)):
            raise ManifestError(
                f"{self.store.url_of(self.manifest.paths[shard])}: the manifest's sha256 for it, "
                f"{str(digest)[:80]!r}, is not 64 hex digits; the manifest is damaged or hostile, "
                "re-pack or re-index the dataset"
            )
        return digest

    def key(self, shard: int) -> str:
        """The shard's name in the cache: its sha256 when downloads are checked against it, else a hash
        of its URL and size (so unchecked bytes never sit under a content name)."""
        digest = self.digest(shard)
        if digest and self.verify:
            return digest
        url = self.store.url_of(self.manifest.paths[shard])
        return hashlib.sha256(f"{url}\0{int(self.manifest.nbytes[shard])}".encode()).hexdigest()

    def fetch(self, shard: int) -> Any:
        """Shard ``shard``'s bytes: a memory map (local file or cache) or ``bytes``."""
        path = self.manifest.paths[shard]
        if self.store.is_local(path):
            if not self.verify_local:
                return self.store.read_bytes(path)
            return self.checked_local(shard)
        key = self.key(shard)
        return self.cache.get(
            key,
            lambda: self.download(shard),
            size=int(self.manifest.nbytes[shard]),
            content=key == self.digest(shard),
        )

    def download(self, shard: int) -> bytes:
        """Shard ``shard`` from storage, checked; fetched again while it comes back damaged, within the
        store's retry policy (transport errors and damaged bytes count against the same attempts)."""
        expected = int(self.manifest.nbytes[shard])
        digest = self.digest(shard) if self.verify else ""

        def check(data: bytes) -> str | None:
            if len(data) != expected:
                return f"{len(data)} bytes arrived, the manifest says {expected}"
            if digest and hashlib.sha256(data).hexdigest() != digest:
                return "its sha256 differs from the manifest's"
            return None

        started = time.perf_counter_ns()
        data = self.store.read_bytes(
            self.manifest.paths[shard], nbytes=expected, check=check, advice=_ADVICE
        )
        if self.on_download is not None:
            self.on_download(len(data), time.perf_counter_ns() - started)
        return data

    def cached(self, shard: int) -> bool:
        """Whether a remote shard is in the local cache already (reading it whole costs no download)."""
        return (
            self.cache is not None
            and not self.store.is_local(self.manifest.paths[shard])
            and os.path.exists(self.cache.path(self.key(shard)))
        )

    def read_checked_many(self, names: list[str], digests: list[str]) -> list[bytes]:
        """Small objects next to the shards (their sample indexes), read whole at once (concurrent GETs),
        each checked against its hex sha256 ``digests[i]`` (from the manifest)."""

        def check(i: int, data: bytes) -> str | None:
            return (
                None
                if hashlib.sha256(data).hexdigest() == digests[i]
                else "its sha256 differs from the manifest's"
            )

        return self.store.read_many(names, check, _ADVICE)

    def read_spans(
        self,
        shards: list[int],
        starts: list[int],
        ends: list[int],
        digests: list[bytes],
        name: Callable[[int], str] | None = None,
    ) -> list[bytes]:
        """Byte ranges ``starts[i]:ends[i]`` of shard ``shards[i]``, all at once (concurrent ranged GETs),
        each checked against its sha256 ``digests[i]`` (raw bytes, from the shard's verified index);
        ``name(i)`` names span ``i``'s sample in a message (its key and position)."""

        def check(i: int, data: bytes) -> str | None:
            what = name(i) if name is not None else "a sample"
            if len(data) != ends[i] - starts[i]:
                return f"{len(data)} of the {ends[i] - starts[i]} bytes of {what} arrived"
            return (
                None
                if hashlib.sha256(data).digest() == digests[i]
                else f"{what} differs from its sha256"
            )

        names = [self.manifest.paths[shard] for shard in shards]
        return self.store.read_ranges(names, starts, ends, check, _ADVICE)

    def checked_local(self, shard: int) -> Any:
        """A local shard, mapped, whose sha256 matched the manifest's on this host since it last changed
        (whatever ``verify_local`` says: a reader with nothing else to check a file against asks it)."""
        name = self.manifest.paths[shard]
        data, st = self.store.map_local(name)
        digest = self.digest(shard)
        if not digest:
            return data
        if self.cache is None:
            self.cache = DiskCache()
        where = self.store.url_of(name)

        def check() -> None:
            if hashlib.sha256(data).hexdigest() != digest:
                raise CorruptShardError(
                    f"{where}: its sha256 differs from the manifest's; the shard is damaged or "
                    "was replaced: run 'shardstream verify' on the dataset, and re-pack it"
                )

        identity = "\0".join(
            map(
                str,
                (
                    os.path.realpath(self.store.path(name)),
                    st.st_dev,
                    st.st_ino,
                    st.st_size,
                    st.st_mtime_ns,
                    st.st_ctime_ns,
                    digest,
                ),
            )
        )
        once_per_host(self.cache.root, identity, check)
        return data
