"""Samples read at random from remote shards: ranged reads while reads are sparse, whole shards once dense.

A map-style read (:class:`~shardstream.dataset.shard_map.ShardMap`) wants one sample, not the shard
around it. A remote tar with a sample index (``.shardstream/<shard>.idx``, its sha256 in the manifest) gives each
sample's span and sha256: one ranged GET fetches the sample and its sha256 checks it, as the
manifest's sha256 checks a whole shard, so a changed byte is a :class:`CorruptShardError`, never a
wrong sample. The samples of one call (a batch of a sampler's indexes) are fetched concurrently, and a
request among them that fails (a reset, a 503, a body cut short or damaged) is made again alone, with the
whole retry budget of the storage's :class:`~shardstream.storage.RetryPolicy` (see
:meth:`~shardstream.storage.Store.read_ranges`): one bad answer among 64 never costs the batch.

Once the bytes read by ranged GETs from one shard reach :data:`DENSE_FRACTION` of its size, the
whole shard is fetched into the host's cache (one GET, checked) and every later read of it is a
slice of a memory map: reads that dense would soon bring most of the shard anyway, a request
(and a round trip) per sample, so one whole GET costs less, at most 1.25x the shard's bytes in
all, and the other processes of the host share it. Shards of at most :data:`SMALL_SHARD` bytes are
fetched whole at once (at that size a GET costs its round trip, whatever it carries), as are tars
without a sample index, Arrow and token shards; Parquet files are read by row group (see
:func:`~shardstream.dataset.shards.readers.ranged_parquet`).
"""

from __future__ import annotations

import threading
from typing import Any

from ...formats.tar_index import SampleIndex
from .media_ranges import MediaRanges
from .ranged import sample_of_span
from .readers import OpenShards, load_sample_index

DENSE_FRACTION = 0.25
SMALL_SHARD = 1 << 20


class SparseReads:
    """Stored samples (undecoded) by (shard, offset), from ``shards`` or by checked ranged reads. Threads
    may share one (as they share a map): its counts change under a lock."""

    def __init__(self, shards: OpenShards, media: MediaRanges | None = None):
        self.shards, self.fetcher, self.manifest = shards, shards.fetcher, shards.manifest
        self.ranged_bytes: dict[int, int] = {}  # per shard: bytes fetched by ranged reads
        self._indexes: dict[int, SampleIndex | None] = {}
        self._lock = threading.Lock()
        self.media = media  # large clip fields read by the blocks a clip needs (None: whole)

    def count(self, shard: int, n: int) -> None:
        """``n`` more bytes fetched by ranged reads from ``shard``."""
        with self._lock:
            self.ranged_bytes[shard] = self.ranged_bytes.get(shard, 0) + n

    def index(self, shard: int) -> SampleIndex | None:
        """Shard ``shard``'s verified sample index (fetched once per process, but for threads that ask at
        once), or None."""
        if shard not in self._indexes:
            found = load_sample_index(self.fetcher, self.manifest, shard)
            with self._lock:
                self._indexes.setdefault(shard, found)
        return self._indexes[shard]

    def sparse(self, shard: int) -> bool:
        """Whether the next sample of ``shard`` comes by a ranged read (see the module)."""
        m, size = self.manifest, int(self.manifest.nbytes[shard])
        if (
            self.fetcher.store.is_local(m.paths[shard])
            or m.shard_format != "tar"
            or size <= SMALL_SHARD
            or self.shards.is_open(shard)
            or self.ranged_bytes.get(shard, 0) >= DENSE_FRACTION * size
            or self.fetcher.cached(shard)
        ):
            return False
        index = self.index(shard)
        # a version 2 index (samples without spans: a tar's members apart, hard links): whole shards
        return index is not None and not index.grouped

    def read(self, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """The stored samples at ``pairs`` of (shard, offset), in order."""
        if self.fetcher.store.local:  # maps of the files: no ranged reads
            return self.read_whole(pairs)
        out: list[dict[str, Any] | None] = [None] * len(pairs)
        wanted: list[tuple[int, int, int, SampleIndex]] = []
        for k, (s, o) in enumerate(pairs):
            if self.sparse(
                s
            ):  # counted as chosen: a batch asking for most of a shard fetches it whole
                index = self._indexes[s]
                assert index is not None
                if self.media is not None and self.media.wanted(index, o):
                    where = self.fetcher.store.url_of(self.manifest.paths[s])
                    out[k] = self.media.sample(s, o, index, where)
                    if out[k] is not None:
                        continue
                start, end = index.span(o)
                with self._lock:
                    self.ranged_bytes[s] = self.ranged_bytes.get(s, 0) + end - start
                wanted.append((k, s, o, index))
        if wanted:
            spans = [index.span(o) for _, _, o, index in wanted]
            parts = self.fetcher.read_spans(
                [s for _, s, _, _ in wanted],
                [a for a, _ in spans],
                [b for _, b in spans],
                [index.digests[32 * o : 32 * o + 32] for _, _, o, index in wanted],
                lambda i: wanted[i][3].sample_name(wanted[i][2]),
            )
            for (k, s, o, _), data in zip(wanted, parts):
                where = self.fetcher.store.url_of(self.manifest.paths[s])
                out[k] = sample_of_span(data, f"{where} (sample {o})")  # None: read whole below
        rest = [k for k, found in enumerate(out) if found is None]
        for k, found in zip(rest, self.read_whole([pairs[k] for k in rest])):
            out[k] = found
        return out  # type: ignore[return-value]

    def read_whole(self, pairs: list[tuple[int, int]]) -> list[dict[str, Any]]:
        """The stored samples at ``pairs`` from their shards opened whole, in order: each shard of the
        batch looked up once and asked for all its samples of the batch in one call."""
        wanted: dict[int, list[int]] = {}  # shard -> its places in pairs
        for k, (s, _) in enumerate(pairs):
            wanted.setdefault(s, []).append(k)
        if len(wanted) == 1:  # (at random, a batch of one, or of a shard read alone)
            (s,) = wanted
            return self._read_shard(s, [o for _, o in pairs])
        out: list[dict[str, Any]] = [None] * len(pairs)  # type: ignore[list-item]
        for s, places in wanted.items():
            for k, found in zip(places, self._read_shard(s, [pairs[k][1] for k in places])):
                out[k] = found
        return out

    def _read_shard(self, shard: int, offsets: list[int]) -> list[dict[str, Any]]:
        reader = self.shards.get_whole(shard)
        many = getattr(reader, "read_many", None)  # a tar's; Arrow and Parquet rows one by one
        return many(offsets) if many is not None else [reader.row(o) for o in offsets]


__all__ = ["DENSE_FRACTION", "SMALL_SHARD", "SparseReads"]
