"""Plan benchmark: the DESIGN.md requirement for ``shardstream/plan.py`` at LAION scale.

Run it from the repository root with the project's virtual environment::

    .venv/bin/python benchmarks/plan.py              # 10^6 shards, ~10^9 samples, 1,024 ranks, 8 workers
    .venv/bin/python benchmarks/plan.py --repeat 20  # more timing runs (the best and the median are shown)

The requirement: "a dataset of 10^9 samples in 10^6 shards on 1,024 ranks must plan in well
under a second and a few MB per worker, never a 10^9-element array". The dataset is only its
shard sample counts (900..1,100 per shard, fixed seed, so about 10^9 samples); no I/O happens.
What a DataLoader worker does before its first batch is timed step by step:

(a) ``EpochOrder.create``: shard permutation and cumulative counts (done by every worker, every epoch);
(b) ``rank_range`` + the first ``worker_chunks`` chunk + ``segment_positions`` + ``samples`` for
    rank 513, worker 5 of 8, batch 256: the (shard, sample) pairs of its first batch;
(c) expanding one full shuffle window (the default window) to (shard, sample) pairs;
(d) ``remaining`` for a resume after 12,345 samples per rank (1,024 intervals);
(e) the per-sample plan cost with ``batch_size=None`` (chunks of 1), over 1,000 samples.

Memory is measured with ``tracemalloc`` (numpy reports its buffers to it): the peak of each step,
plus the ``nbytes`` of the arrays the plan keeps. The shard counts themselves (the manifest's
column, 8 MB) are loaded once per rank and shared with forked workers, so they are listed apart.

This is a benchmark, not a test: timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from shardstream import plan

SHARDS = 10**6
WORLD, RANK = 1024, 513
WORKERS, WORKER = 8, 5
BATCH = 256
CONSUMED = 12_345
MB = 1e6


def measure(fn: Callable[[], object], repeat: int) -> tuple[float, float, int, object]:
    """(best s, median s, tracemalloc peak bytes of one extra run, the result)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    tracemalloc.reset_peak()
    result = fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return min(times), statistics.median(times), peak, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="timing runs per step (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shard counts (default 0)")
    args = parser.parse_args()

    counts = np.random.default_rng(args.seed).integers(900, 1101, size=SHARDS, dtype=np.int64)
    total = int(counts.sum())
    seed, epoch = 1234, 3
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}")
    print(
        f"{SHARDS:,} shards, {total:,} samples, {WORLD:,} ranks x {WORKERS} workers, batch {BATCH}, "
        f"rank {RANK}, worker {WORKER}; best/median of {args.repeat} runs\n"
    )

    rows = []

    # (a) the epoch's order, kept only for the shards this rank can reach (what a worker does)
    segment = [(0, total)]
    span = plan.rank_range(segment, WORLD, RANK, False)

    def worker_plan():
        full = plan.EpochOrder.create(counts, seed, epoch)
        return full.restrict(*plan.span_bounds(segment, span))

    best, med, peak, order = measure(worker_plan, args.repeat)
    rows.append(
        (
            "(a) EpochOrder.create + restrict",
            best,
            med,
            peak,
            f"{len(order.shard_order):,} shards kept",
        )
    )
    held = order.shard_order.nbytes + order.ends.nbytes

    # (b) the first batch of rank 513, worker 5

    def first_batch():
        span = plan.rank_range(segment, WORLD, RANK, False)
        lo, hi = next(plan.worker_chunks(span, BATCH, WORKERS, WORKER))
        positions = plan.segment_positions(segment, np.arange(lo, hi))
        return positions, order.samples(positions)

    best, med, peak, (positions, (shards, offsets)) = measure(first_batch, args.repeat)
    assert len(shards) == BATCH and (offsets < counts[shards]).all()
    rows.append(("(b) rank 513 / worker 5: first batch", best, med, peak, f"{len(shards)} samples"))

    # (c) one full window, the one the first batch falls in
    w = int(positions[0]) // order.window
    window = np.arange(w * order.window, min((w + 1) * order.window, order.total))
    best, med, peak, _ = measure(lambda: order.samples(window), args.repeat)
    rows.append(("(c) expand one full window", best, med, peak, f"{len(window):,} samples"))

    # (d) a resume: the segment left after every rank read CONSUMED samples
    best, med, peak, rest = measure(
        lambda: plan.remaining(segment, WORLD, CONSUMED, False), args.repeat
    )
    rows.append(("(d) remaining() for a resume", best, med, peak, f"{len(rest):,} intervals"))

    # (e) batch_size=None: one chunk per sample
    span = plan.rank_range(segment, WORLD, RANK, False)
    chunks = plan.worker_chunks(span, 1, WORKERS, WORKER)
    singles = [next(chunks) for _ in range(1000)]

    def one_by_one():
        for lo, hi in singles:
            order.samples(plan.segment_positions(segment, np.arange(lo, hi)))

    best, med, peak, _ = measure(one_by_one, max(1, args.repeat // 3))
    rows.append(
        ("(e) 1,000 samples one by one", best, med, peak, f"{best / 1000 * 1e6:.0f} us/sample")
    )

    print(f"{'step':40s} {'best':>10s} {'median':>10s} {'peak mem':>10s}  note")
    for name, b, m, p, note in rows:
        print(f"{name:40s} {b * 1e3:8.2f}ms {m * 1e3:8.2f}ms {p / MB:8.2f}MB  {note}")

    plan_time = rows[0][2] + rows[1][2]
    peak_mb = max(r[3] for r in rows[:3]) / MB
    print(
        f"\narrays a worker's plan holds: shard_order {order.shard_order.nbytes / MB:.3f} MB + ends "
        f"{order.ends.nbytes / MB:.3f} MB = {held / MB:.3f} MB "
        f"(+ the manifest's counts, {order.per_shard.nbytes / MB:.1f} MB, loaded once per rank and shared "
        f"copy-on-write with its workers)"
    )
    print(
        f"largest array built: {max(len(window), len(positions)):,} elements (never one of {total:,})"
    )
    fast = plan_time < 0.25
    small = held / MB <= 8
    print(
        f"\nplan time to the first batch (a)+(b), median: {plan_time * 1e3:.1f} ms -> "
        f"'well under a second': {'holds' if fast else 'does NOT hold'}"
    )
    print(
        f"memory per worker: {held / MB:.3f} MB held for the epoch -> 'a few MB per worker' "
        f"(taken as <= 8 MB held): {'holds' if small else 'does NOT hold'}; the shard permutation "
        f"needs a transient {peak_mb:.1f} MB peak once per epoch while it is made"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
