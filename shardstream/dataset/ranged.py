"""An epoch's first samples by ranged reads, while their whole shards are still on the way.

A shuffled epoch's first batch draws from a window of several shards; downloading them whole
before it would make the first batch wait for hundreds of megabytes. When a dataset on object
storage has sample indexes (``<shard>.idx``, written at pack time, their sha256 in the
manifest), a batch whose shards have not arrived fetches just its samples, concurrently, each
checked against its sha256 in the verified index, and parsed as strictly as a whole shard.
The whole shards keep downloading behind (the prefetcher), and once one has arrived its
samples come from it. Ranged reads stop after :data:`RANGED_BYTES` per pass and process, so
they only bridge the start. The order of samples is the plan's either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..formats import tar as tar_format
from ..formats.tar_index import SampleIndex, index_name, parse_index
from ..manifest import Manifest
from ..storage import ShardFetcher

RANGED_BYTES = 64 << 20  # per pass and process: about one shard, the start of an epoch


class PartialShard:
    """Some samples of one shard, fetched by ranged reads; any other sample comes from the whole shard."""

    owned = 0  # what it holds is a batch's worth, dropped with the batch

    def __init__(self, name: str, samples: dict[int, dict[str, Any]], whole: Callable[[], Any]):
        self.name, self.samples, self.whole = name, samples, whole

    def sample(self, i: int) -> dict[str, Any]:
        found = self.samples.get(i)
        return dict(found) if found is not None else self.whole().sample(i)

    views = sample


class RangedReads:
    """Fetches the samples of a batch whose shards are not there yet, by ranged reads (see the module)."""

    def __init__(self, manifest: Manifest, fetcher: ShardFetcher, coming: Callable[[int], bool],
                 budget: int = RANGED_BYTES):
        digests = getattr(manifest, "index_sha256", None)
        self.manifest, self.fetcher, self.coming = manifest, fetcher, coming
        self.digests = digests if manifest.shard_format == "tar" and digests is not None else None
        self.budget = budget
        self.spent = 0
        self._indexes: dict[int, SampleIndex | None] = {}

    @property
    def active(self) -> bool:
        return self.digests is not None and self.spent < self.budget

    def index(self, shard: int) -> SampleIndex | None:
        """The shard's verified sample index, or None (none written, or it fails: the whole shard then says why)."""
        if shard not in self._indexes:
            digest = self.digests[shard] if self.digests is not None else ""
            found = None
            if digest:
                m = self.manifest
                name = index_name(m.paths[shard])
                try:
                    data = self.fetcher.read_checked(name, digest)
                    found = parse_index(data, self.fetcher.store.url_of(name), int(m.samples[shard]),
                                        int(m.nbytes[shard]))
                except Exception:  # noqa: BLE001 - the whole shard is read instead, and checked
                    found = None
            self._indexes[shard] = found
        return self._indexes[shard]

    def fetch(self, ids: np.ndarray, offsets: np.ndarray, is_open: Callable[[int], bool],
              whole: Callable[[int], Any]) -> dict[int, PartialShard]:
        """Partial shards holding the batch's samples whose whole shards are on their way (downloading, or
        queued for the prefetcher), neither open nor cached."""
        if not self.active:
            return {}
        bridge: dict[int, bool] = {}  # shard -> on its way (not open, not loaded, not in the local cache)
        for s in set(ids.tolist()):
            bridge[s] = not is_open(s) and self.coming(s) and not self.fetcher.cached(s)
        wanted = [(s, o) for s, o in zip(ids.tolist(), offsets.tolist()) if bridge[s]]
        spans = [(s, o, self.index(s)) for s, o in dict.fromkeys(wanted)]
        spans = [(s, o, index) for s, o, index in spans if index is not None]
        if not spans:
            return {}
        starts = [int(index.offsets[o]) for _, o, index in spans]
        ends = [int(index.offsets[o + 1]) for _, o, index in spans]
        digests = [index.digests[32 * o : 32 * o + 32] for _, o, index in spans]
        try:
            parts = self.fetcher.read_spans([s for s, _, _ in spans], starts, ends, digests)
        except Exception:  # noqa: BLE001 - the whole shards are read instead, and say what is wrong
            return {}
        self.spent += sum(ends) - sum(starts)
        partial: dict[int, PartialShard] = {}
        for (shard, offset, _), data in zip(spans, parts):
            name = self.fetcher.store.url_of(self.manifest.paths[shard])
            where = f"{name} (sample {offset})"
            try:  # parsed as strictly as a whole shard; the sha256 said the bytes are as packed
                keys, fields = tar_format.index_samples(data + tar_format.END_OF_ARCHIVE, where)
            except Exception:  # noqa: BLE001 - the whole shard is read instead, and says what is wrong
                continue
            if len(keys) != 1:  # the index's span holds one sample, as packed
                continue
            view = memoryview(data)
            sample = {"__key__": keys[0], **{ext: bytes(view[a : a + n]) for ext, (a, n) in fields[0].items()}}
            if shard not in partial:
                partial[shard] = PartialShard(name, {}, lambda s=shard: whole(s))
            partial[shard].samples[offset] = sample
        return partial
