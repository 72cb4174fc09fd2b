"""An epoch's first samples by ranged reads, while their whole shards are still on the way.

A shuffled epoch's first batch draws from a window of several shards; downloading them whole
before it would make the first batch wait for hundreds of megabytes. When a dataset on object
storage has sample indexes (``.shardstream/<shard>.idx``, written at pack time, their sha256 in the
manifest), a batch whose shards have not arrived fetches just its samples, concurrently, each
checked against its sha256 in the verified index, and parsed as strictly as a whole shard.
The whole shards keep downloading behind (the prefetcher). Ranged reads stop once a whole shard
has arrived, or after :data:`RANGED_SAMPLES` samples per pass and process: they bridge the start
only (a request per sample costs more than whole shards later on). Some servers (moto among them) read
the whole object for every ranged GET, one request after the other: when a few ranged GETs at once take
several times one (see :data:`PROBE_WAVE`), ranged reads stop for the pass; a slow link alone slows one
and several alike, and keeps them. The order of samples is the plan's either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ...formats import tar as tar_format
from ...formats.tar_index import SampleIndex
from ...manifest import Manifest
from ...storage import Prefetcher, ShardFetcher
from .tar_indexes import SampleIndexes

RANGED_SAMPLES = 256  # per pass and process: the first few batches of an epoch
# The first ranged GET of a pass, then PROBE_WAVE at once: if those take over PROBE_SECONDS and over
# PARALLEL_SLOWDOWN x the single one, the server serves ranged GETs one by one at the cost of whole objects
# (moto: 60 ms each, 3.3 s for 64; SeaweedFS: 6 ms, 0.1-0.2 s for 64; a +50 ms link: about 55 ms for one or
# eight), and whole shards come sooner: no more ranged reads this pass.
PROBE_WAVE = 8
PROBE_SECONDS = 0.05
PARALLEL_SLOWDOWN = 3.0


def sample_of_span(data: bytes, where: str) -> dict[str, Any] | None:
    """The one sample in ``data``, a sample's span of a tar read by a ranged read and checked against its
    sha256, parsed as strictly as a whole shard; None if it does not parse as one sample."""
    try:
        keys, fields = tar_format.index_samples(data + tar_format.END_OF_ARCHIVE, where)
    except Exception:  # the caller reads the whole shard, which says what is wrong
        return None
    if len(keys) != 1:  # the index's span holds one sample, as packed
        return None
    view = memoryview(data)
    return {
        "__key__": keys[0],
        **{ext: bytes(view[a : a + n]) for ext, (a, n) in fields[0].items()},
    }


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

    def __init__(
        self,
        manifest: Manifest,
        fetcher: ShardFetcher,
        prefetcher: Prefetcher[Any],
        budget: int = RANGED_SAMPLES,
        indexes: SampleIndexes | None = None,
    ):
        digests = getattr(manifest, "index_sha256", None)
        self.manifest, self.fetcher, self.prefetcher, self.coming = (
            manifest,
            fetcher,
            prefetcher,
            prefetcher.coming,
        )
        self.digests = digests if manifest.shard_format == "tar" and digests is not None else None
        # the first batch's requests go before the whole shards' (see fetch)
        if self.digests is not None:
            prefetcher.pause()
        self.budget = budget
        self.spent = 0  # samples fetched so
        self.bridged = False  # a whole shard arrived (or ranged GETs are slow): ranged reads are done for this pass
        self.probed = False
        self._indexes: dict[int, SampleIndex | None] = {}
        self.indexes = indexes or SampleIndexes(fetcher.store, manifest, fetcher)

    @property
    def active(self) -> bool:
        return self.digests is not None and self.spent < self.budget and not self.bridged

    def load_indexes(self, shards: list[int]) -> None:
        """The verified sample indexes of ``shards`` (fetched at once; one that fails or has none: None, and
        the whole shard is read instead, and says what is wrong)."""
        todo = [s for s in dict.fromkeys(shards) if s not in self._indexes]
        if todo:
            self._indexes.update(self.indexes.stored(todo))

    def fetch(
        self,
        ids: np.ndarray,
        offsets: np.ndarray,
        is_open: Callable[[int], bool],
        whole: Callable[[int], Any],
    ) -> dict[int, PartialShard]:
        """Partial shards holding the batch's samples whose whole shards are on their way (downloading, or
        queued for the prefetcher), neither open nor cached. The prefetcher waits for the first call to end:
        whole shards downloading beside them would make the first batch's small requests wait."""
        try:
            return self._fetch(ids, offsets, is_open, whole)
        finally:
            self.prefetcher.resume()

    def _fetch(
        self,
        ids: np.ndarray,
        offsets: np.ndarray,
        is_open: Callable[[int], bool],
        whole: Callable[[int], Any],
    ) -> dict[int, PartialShard]:
        if not self.active:
            return {}
        spans = self._spans(ids, offsets, is_open)
        if not spans:
            return {}
        starts = [int(index.offsets[o]) for _, o, index in spans]
        ends = [int(index.offsets[o + 1]) for _, o, index in spans]
        digests = [index.digests[32 * o : 32 * o + 32] for _, o, index in spans]
        try:
            parts = self._read([s for s, _, _ in spans], starts, ends, digests)
        except Exception:  # the whole shards are read instead, and say what is wrong
            return {}
        self.spent += len(parts)
        return self._partials(spans, parts, whole)

    def _spans(
        self, ids: np.ndarray, offsets: np.ndarray, is_open: Callable[[int], bool]
    ) -> list[Any]:
        """(shard, offset, index) of the batch's samples whose shards are on their way (not open, not loaded,
        not in the local cache) and whose index reads; none once a shard of a batch has arrived."""
        bridge: dict[int, bool] = {}
        for s in set(ids.tolist()):
            bridge[s] = not is_open(s) and self.coming(s) and not self.fetcher.cached(s)
            if is_open(s):
                self.bridged = True
        if self.bridged:
            return []
        wanted = list(
            dict.fromkeys((s, o) for s, o in zip(ids.tolist(), offsets.tolist()) if bridge[s])
        )
        self.load_indexes([s for s, _ in wanted])
        spans = [(s, o, self._indexes.get(s)) for s, o in wanted]
        # a version 2 index (samples without spans) leaves its samples to the whole shard
        return [(s, o, index) for s, o, index in spans if index is not None and not index.grouped]

    def _read(
        self, shards: list[int], starts: list[int], ends: list[int], digests: list[bytes]
    ) -> list[bytes]:
        """The spans' bytes, checked; the first time a few requests first: a server slow at ranged GETs
        (it works through concurrent ones one by one, each as dear as a whole object: moto) is left alone
        for the rest of the pass, while a slow link alone slows one GET and several alike."""
        parts: list[bytes] = []
        if not self.probed:
            self.probed = True
            waves = []
            for stop in (1, 1 + PROBE_WAVE):
                started, done = time.perf_counter(), len(parts)
                parts += self.fetcher.read_spans(
                    shards[done:stop], starts[done:stop], ends[done:stop], digests[done:stop]
                )
                waves.append(time.perf_counter() - started)
            if len(shards) > 1 and waves[1] > max(PROBE_SECONDS, PARALLEL_SLOWDOWN * waves[0]):
                self.bridged = True
        if not self.bridged:
            done = len(parts)
            parts += self.fetcher.read_spans(
                shards[done:], starts[done:], ends[done:], digests[done:]
            )
        return parts

    def _partials(
        self, spans: list[Any], parts: list[bytes], whole: Callable[[int], Any]
    ) -> dict[int, PartialShard]:
        """The samples read, by shard, each parsed as strictly as a whole shard (its sha256 said the bytes
        are as packed); one that does not parse is left to the whole shard, which says what is wrong."""
        partial: dict[int, PartialShard] = {}
        for (shard, offset, _), data in zip(spans, parts):
            name = self.fetcher.store.url_of(self.manifest.paths[shard])
            sample = sample_of_span(data, f"{name} (sample {offset})")
            if sample is None:  # the whole shard is read instead, and says what is wrong
                continue
            if shard not in partial:
                partial[shard] = PartialShard(name, {}, lambda s=shard: whole(s))
            partial[shard].samples[offset] = sample
        return partial
