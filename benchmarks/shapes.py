"""Batch-shape benchmark: the cost of each batch shape against plain batches of the same data, raw reads.

    .venv/bin/python benchmarks/shapes.py                     # the 20,000-JPEG set, 3 runs each
    .venv/bin/python benchmarks/shapes.py --repeat 1 --count 5000

Data: the shardstream pack of ``benchmarks/_data.py``'s JPEG set (``--data``, default
``<data dir>/read/shardstream``). Every run is one epoch, raw bytes (``decode=None``; the main process
takes every ``jpg`` value as bytes-like and counts its length), batches of 64, one DataLoader worker;
runs interleaved, each variant's best and median samples/s, and its ratio to its peer measured in
the same run:

- ``plain``: ``ShardDataset(decode=None).loader(64)``, the baseline;
- ``parallel``: the same with ``parallel=Parallel(dp_rank=0, dp_size=1)`` (peer: ``plain``);
- ``mix``: ``MixedDataset`` of the set twice (weights 0.5 / 0.5, an epoch of ``count``), sample mixing;
- ``per_source``: the same mix with ``batching="per_source", batch_size=64`` (peer: ``mix``);
- ``windows``: ``plain``'s samples handed over a window of 1,024 at a time (the window batcher's
  general path, which ``SequencePacking`` and a ``Bucketed`` with its own ``collate_fn`` take: the
  window's raw values copied once into shared memory, see ``shardstream.dataset.batches.pooled.pool_of``),
  in batches of 64 in order (peer: ``plain``);
- ``bucketed``: ``Bucketed(..., aspect_ratio("jpg"), [0.8, 1.25], 64)`` over a pack without recorded
  image sizes: each image's size read from its JPEG header in place, batches of one aspect bucket as
  locations (peer: ``plain``);
- ``planned``: the same ``Bucketed`` over ``--sized``, a copy of the pack whose manifest records the
  image sizes (``shardstream index`` of it): the whole epoch planned from them, each batch read by
  index (``ShardMap``), raw bytes collated as plain batches are (peer: ``plain``). Left out without
  ``--sized``. Make the copy with hard links, e.g.
  ``cp -al DATA COPY && rm COPY/_manifest.json COPY/*.idx && shardstream index COPY``.

Timings are reported, never asserted. The machine the results were measured on may be shared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _data import DEFAULT_DATA_DIR

from shardstream import Bucketed, MixedDataset, Parallel, ShardDataset
from shardstream.dataset.batches.bucketed import aspect_ratio
from shardstream.dataset.batches.pooled import PooledBatches

BATCH, WORKERS, POOL = 64, 1, 1024


class Windows(PooledBatches):
    """The window batcher with the plainest rule: a window's samples as batches of 64 in order."""

    def plan(self, samples: list[Any]) -> list[np.ndarray]:
        return [np.arange(i, min(i + BATCH, len(samples))) for i in range(0, len(samples), BATCH)]

    def fit(self, groups: list[np.ndarray], count: int) -> list[np.ndarray]:
        return groups

    def make(self, samples: list[Any], group: np.ndarray) -> dict[str, Any]:
        return {"jpg": [samples[i]["jpg"] for i in group.tolist()]}


def consume(batches: Any) -> int:
    n = 0
    for batch in batches:
        for value in batch["jpg"]:
            n += len(value) > 0
    return n


def variant(name: str, url: str, count: int, sized: str | None = None) -> Any:
    def one(**kw: Any) -> ShardDataset:
        return ShardDataset(url, decode=None, seed=1, **kw)

    if name == "plain":
        return one().loader(BATCH, WORKERS)
    if name == "parallel":
        return one(parallel=Parallel(dp_rank=0, dp_size=1)).loader(BATCH, WORKERS)
    if name in ("mix", "per_source"):
        extra = {"batching": "per_source", "batch_size": BATCH} if name == "per_source" else {}
        mix = MixedDataset([one(), one()], [0.5, 0.5], samples_per_epoch=count, seed=1, **extra)
        return mix.loader(BATCH, WORKERS)
    if name == "windows":
        return Windows(one(), POOL, WORKERS, {})
    if name == "planned":
        shape = Bucketed(
            ShardDataset(sized, decode=None, seed=1),
            aspect_ratio("jpg"),
            [0.8, 1.25],
            BATCH,
            num_workers=WORKERS,
        )
        assert shape.planned_up_front, f"{sized} records no image sizes: index it (see --sized)"
        return shape
    return Bucketed(
        one(), aspect_ratio("jpg"), [0.8, 1.25], BATCH, window=POOL, num_workers=WORKERS
    )


PEERS = {
    "parallel": "plain",
    "per_source": "mix",
    "windows": "plain",
    "bucketed": "plain",
    "planned": "plain",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(Path(DEFAULT_DATA_DIR) / "read" / "shardstream"))
    parser.add_argument(
        "--count", type=int, default=None, help="mix epoch (default: the set's size)"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sized", default=None, help="a copy of --data indexed with its image sizes (planned)"
    )
    parser.add_argument(
        "--only", default="plain,parallel,mix,per_source,windows,bucketed,planned", help="variants"
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n != "planned" or args.sized]
    count = args.count or ShardDataset(args.data, decode=None).num_samples
    rates: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(args.repeat):
        for name in names:
            batches = variant(name, args.data, count, args.sized)
            started = time.perf_counter()
            n = consume(batches)
            rates[name].append(n / (time.perf_counter() - started))
    for name in names:
        best, median = max(rates[name]), statistics.median(rates[name])
        line = f"{name:11s} best {best:9,.0f} samples/s  median {median:9,.0f}"
        peer = PEERS.get(name)
        if peer in rates:
            line += f"  {best / max(rates[peer]):.2f}x {peer} (medians {median / statistics.median(rates[peer]):.2f}x)"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
