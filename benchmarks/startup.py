"""Start-up at cluster scale, counted: the requests one epoch's start makes to object storage, per worker,
rank, host and job, for 1,024 ranks x 8 workers (8 ranks a host) on a dataset of 10^6 shards.

A simulation with the plan's own functions (pure, no storage): which shards each worker's first batches
read by ranged reads (``RANGED_SAMPLES`` samples per worker and pass, through the shards' sample indexes)
is what ``ShardDataset`` computes at the start of an epoch. The rules the counts follow are checked
against a real moto server, with real rank and worker processes, by
``tests/remote/test_startup_requests.py``: the manifest's head once per rank (and one GET that finds no
newer version), the shard table and every sample index and whole shard once per host through the private
cache, no listing, no HEAD. "Before" is the same start without the host cache (each rank reads the table,
each worker the indexes it needs, every epoch)::

    .venv/bin/python benchmarks/startup.py                        # 1,024 ranks x 8 workers, 10^6 shards
    .venv/bin/python benchmarks/startup.py --ranks 64 --shards 100000
"""

from __future__ import annotations

import argparse

import numpy as np

from shardstream import plan
from shardstream.dataset.shards.ranged import RANGED_SAMPLES
from shardstream.dataset.state import resolve_window


def first_shards(
    order: plan.EpochOrder,
    segment: list[tuple[int, int]],
    span: tuple[int, int],
    sizes: tuple[int, int, int],
) -> list[set[int]]:
    """Per worker of a rank with ``span`` of ``segment``: the shards its first samples lie in (``sizes``:
    workers, batch size, samples read by ranged reads)."""
    workers, batch, budget = sizes
    out = []
    for worker in range(workers):
        ids: list[np.ndarray] = []
        taken = 0
        for lo, hi in plan.worker_chunks(span, batch, workers, worker):
            if taken >= budget:
                break
            positions = plan.segment_positions(segment, np.arange(lo, hi))
            shards, _ = order.samples(positions)
            ids.append(shards)
            taken += hi - lo
        out.append(set(np.concatenate(ids).tolist()) if ids else set())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--ranks-per-host", type=int, default=8)
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--samples-per-shard", type=int, default=1_000)
    parser.add_argument("--shard-bytes", type=int, default=64_000_000)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    counts = np.full(args.shards, args.samples_per_shard, dtype=np.int64)
    nbytes = np.full(args.shards, args.shard_bytes, dtype=np.int64)
    total = int(counts.sum())
    window = resolve_window(None, counts, nbytes, remote=True)
    global_order = plan.EpochOrder.create(counts, 0, 0, True, window)
    segment = [(0, total)]
    hosts = -(-args.ranks // args.ranks_per_host)
    per_worker: list[int] = []
    per_rank: list[int] = []
    per_host: list[int] = []
    for host in range(hosts):
        host_shards: set[int] = set()
        for rank in range(
            host * args.ranks_per_host, min((host + 1) * args.ranks_per_host, args.ranks)
        ):
            span = plan.rank_range(segment, args.ranks, rank, False)
            order = global_order.restrict(*plan.span_bounds(segment, span))
            sizes = (args.workers, args.batch, RANGED_SAMPLES)
            workers = first_shards(order, segment, span, sizes)
            per_worker += [len(w) for w in workers]
            rank_shards = set().union(*workers)
            per_rank.append(len(rank_shards))
            host_shards |= rank_shards
        per_host.append(len(host_shards))
    idx_worker, idx_host = float(np.mean(per_worker)), float(np.mean(per_host))
    per_host_ranks = args.ranks_per_host
    before_host = idx_worker * args.workers * per_host_ranks
    rows = [  # (what, per host now, per host before)
        ("manifest head (`_manifest.json`)", per_host_ranks, per_host_ranks),
        ("newer-version probe (`_versions/N+1`, a 404)", per_host_ranks, 0),
        ("shard table (`_shards-<hash>.arrow`)", 1, per_host_ranks),
        ("sample indexes of the first batches' shards", idx_host, before_host),
        ("listings, HEADs", 0, 0),
    ]
    print(
        f"{args.ranks:,} ranks x {args.workers} workers, {per_host_ranks} ranks a host ({hosts:,} hosts); "
        f"{args.shards:,} shards of {args.samples_per_shard:,} samples, {args.shard_bytes / 1e6:,.0f} MB; "
        f"window {window:,} samples; ranged reads: the first {RANGED_SAMPLES} samples per worker, in "
        f"{idx_worker:,.1f} shards per worker, {float(np.mean(per_rank)):,.1f} per rank"
    )
    print()
    print(
        "| GETs at an epoch's start | per host | per host before | per worker | whole job | before |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    workers_host = args.workers * per_host_ranks
    for name, now, before in rows:
        print(
            f"| {name} | {now:,.1f} | {before:,.1f} | {now / workers_host:,.2f} | "
            f"{now * hosts:,.0f} | {before * hosts:,.0f} |"
        )


if __name__ == "__main__":
    main()
