"""What the processes reading a dataset did and how long each stage took, in a small shared table.

Always on, so it has to be cheap: plain integer adds into one row of shared int64 memory per
process (the main process, or DataLoader worker ``i``), nanoseconds from ``perf_counter_ns``,
added once per batch or shard, never per sample. The main process sums the rows
(:meth:`StageCounters.totals`); :mod:`shardstream.loader.stats` turns them into numbers a
person reads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

from .batches.shared_memory import shared_zeros
from .shards.readers import ArrowShard, OpenShards, TarShard

FIELDS = (
    "samples",  # samples made into batches (or yielded) by the readers
    "opened",  # shards opened from remote storage (through the disk cache)
    "opened_bytes",  # their bytes
    "local_bytes",  # bytes of local shards opened (mapped)
    "downloads",  # shards downloaded (cache misses)
    "downloaded_bytes",
    "download_ns",  # the downloads' own time, in whichever thread they ran
    "wait_ns",  # a reader blocked on a shard being downloaded (and opened) by the prefetcher
    "read_ns",  # opening local shards, indexing, reading samples out of them
    "decode_ns",
    "transform_ns",
    "collate_ns",
    "skip_shard",  # the last sample skipped under on_error="skip": its shard + 1, its sample, when (ms)
    "skip_sample",
    "skip_ms",
)
INDEX = {name: i for i, name in enumerate(FIELDS)}
_SLOTS = 1 + 256  # the main process, then DataLoader workers (more share slots)


class StageCounters:
    """Counts and stage times of every process reading one dataset; each adds to its own row."""

    def __init__(self) -> None:
        self.table = shared_zeros(_SLOTS * len(FIELDS))
        self._local: tuple[int, np.ndarray, threading.Lock] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table, "_local": None}

    def _row(self) -> tuple[np.ndarray, threading.Lock]:
        """This process's row and a lock for its threads (made again after a fork)."""
        local = self._local
        if local is None or local[0] != os.getpid():
            array = self.table.numpy().reshape(_SLOTS, len(FIELDS))
            local = self._local = (os.getpid(), array, threading.Lock())
        info = get_worker_info()
        return local[1][0 if info is None else 1 + info.id % (_SLOTS - 1)], local[2]

    def add(self, **counts: int) -> None:
        """Add ``counts`` (field name -> amount) to this process's row."""
        row, lock = self._row()
        with lock:  # prefetch threads add too
            for name, n in counts.items():
                row[INDEX[name]] += n

    def skipped(self, shard: int, sample: int) -> None:
        """Note the sample skipped last (the newest over all processes is reported)."""
        row, lock = self._row()
        with lock:
            row[INDEX["skip_shard"] : INDEX["skip_ms"] + 1] = (
                shard + 1,
                sample,
                time.time() * 1000,
            )

    def totals(self) -> dict[str, int]:
        """Every field summed over the processes; ``skip_shard`` (-1 for none) and ``skip_sample`` are
        the newest skip's."""
        array = self.table.numpy().reshape(_SLOTS, len(FIELDS))
        sums = array.sum(axis=0)
        out = {name: int(sums[i]) for i, name in enumerate(FIELDS)}
        newest = array[int(array[:, INDEX["skip_ms"]].argmax())]
        out["skip_shard"] = int(newest[INDEX["skip_shard"]]) - 1
        out["skip_sample"] = int(newest[INDEX["skip_sample"]]) if out["skip_shard"] >= 0 else -1
        del out["skip_ms"]
        return out


class CountedShards(OpenShards):
    """:class:`OpenShards` that count the shards they open, and the time a reader waits on the prefetcher."""

    def __init__(self, *args: Any, counters: StageCounters, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.counters = counters
        self.waited_ns = 0  # since the last batch was accounted (SampleReader takes and clears it)
        self.fetcher.on_download = self._downloaded

    def _downloaded(self, nbytes: int, nanoseconds: int) -> None:
        self.counters.add(downloads=1, downloaded_bytes=nbytes, download_ns=nanoseconds)

    def timed(
        self, take: Callable[[int], TarShard | ArrowShard]
    ) -> Callable[[int], TarShard | ArrowShard]:
        """``take`` (called only for a shard not open yet), adding the time it blocks to :attr:`waited_ns`."""

        def waiting(shard: int) -> TarShard | ArrowShard:
            started = time.perf_counter_ns()
            try:
                return take(shard)
            finally:
                self.waited_ns += time.perf_counter_ns() - started

        return waiting

    def _load(self, shard: int) -> TarShard | ArrowShard:
        opened = super()._load(shard)
        nbytes = int(self.manifest.nbytes[shard])
        if self.store.is_local(self.manifest.paths[shard]):
            self.counters.add(local_bytes=nbytes)
        else:
            self.counters.add(opened=1, opened_bytes=nbytes)
        return opened
