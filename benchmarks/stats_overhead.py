"""What always-on loader stats cost: epochs with the stats as shipped against the same epochs with them off.

"Off" replaces every piece the stats add with what was there before: the shared counters'
``add`` and ``skipped`` become no-ops, the main process's recorder does nothing, shards open
without counting, and a sample is decoded and transformed without its two clock reads. The
rest of the pipeline is the same code, so the difference is the stats' cost.

Run from the repository root (``.venv`` is enough)::

    .venv/bin/python benchmarks/stats_overhead.py                      # 3 cases, 7 rounds each
    .venv/bin/python benchmarks/stats_overhead.py --samples 20000 --rounds 3 --workers 0

Cases, cheapest per sample first (so the relative cost is the largest there): ``mapped`` (raw
bytes of local tars as locations), ``bytes`` (raw bytes of zstd tars, copied and collated),
``decoded`` (the same samples decoded: text and an int per sample, a transform). Rounds
alternate on and off; it prints the median epoch time of each and the overhead
(on / off - 1). The target is at most 1% of a raw epoch.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shardstream import ShardDataset
from shardstream.dataset import counters, samples
from shardstream.errors import TransformError
from shardstream.loader import stats
from tests.sample_datasets import write_dataset


def _untimed_decode(
    self: samples.SampleReader, shards: Any, shard: int, offset: int, batched: bool
) -> Any:
    """SampleReader.decode as it was before the stats (no clock reads)."""
    if self.raw and batched:
        return shards.get(shard).views(offset)
    sample = self.decoder(shards.get(shard).sample(offset))
    if self.transform is None:
        return sample
    try:
        return self.transform(sample)
    except Exception as exc:  # pragma: no cover - the benchmark's transform does not fail
        raise TransformError(str(exc)) from exc


@contextlib.contextmanager
def stats_off():
    """Every part the stats add, replaced by nothing (or by the code before them)."""
    saved = [
        (counters.StageCounters, "add"),
        (counters.StageCounters, "skipped"),
        (stats.StatsRecorder, "begin"),
        (stats.StatsRecorder, "resumed"),
        (stats.StatsRecorder, "delivered"),
        (counters.CountedShards, "_load"),
        (counters.CountedShards, "timed"),
        (samples.SampleReader, "decode"),
        (samples.SampleReader, "_account"),
        (samples.SampleReader, "collate"),
    ]
    originals = [(owner, name, owner.__dict__[name]) for owner, name in saved]
    nothing = lambda *a, **k: None  # noqa: E731
    try:
        for owner, name in saved:
            setattr(owner, name, nothing)
        counters.CountedShards._load = counters.OpenShards._load
        counters.CountedShards.timed = lambda self, take: take
        samples.SampleReader.decode = _untimed_decode
        samples.SampleReader.collate = lambda self, fn, batch: fn(batch)
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def unit_costs(url: str, repeat: int = 20_000) -> tuple[float, float]:
    """Nanoseconds the stats add per batch (counter adds, the recorder) and per decoded sample (two clock
    reads and two adds), timed in a loop: a measure that the machine's noise moves far less than epochs."""
    ds = ShardDataset(url, decode=None)
    table, recorder = ds._samples.stats, stats.StatsRecorder(ds)
    recorder.begin()
    started = time.perf_counter_ns()
    for _ in range(repeat):
        table.add(samples=256, wait_ns=0, read_ns=1, decode_ns=1, transform_ns=0)
        table.add(collate_ns=1)
        recorder.delivered(256)
        recorder.resumed()
    per_batch = (time.perf_counter_ns() - started) / repeat
    clock, total = time.perf_counter_ns, 0
    started = clock()
    for _ in range(repeat):
        a = clock()
        b = clock()
        total += b - a
        total += clock() - b
    per_sample = (clock() - started) / repeat
    return per_batch, per_sample


def epoch(url: str, case: str, batch_size: int, workers: int) -> float:
    kwargs: dict[str, Any] = {"decode": None, "shuffle": True, "seed": 1}
    if case == "decoded":
        kwargs.update(decode="torch", transform=lambda s: s)
    loader = ShardDataset(url, **kwargs).loader(batch_size=batch_size, num_workers=workers)
    started = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--workers", type=int, default=0, help="DataLoader workers (0: all in this process)"
    )
    parser.add_argument("--cases", default="mapped,bytes,decoded")
    args = parser.parse_args(argv)
    shards = 20
    counts = [args.samples // shards] * shards
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "mapped": write_dataset(Path(tmp), counts, name="plain"),
            "bytes": write_dataset(Path(tmp), counts, compression="zstd", name="zstd"),
        }
        urls["decoded"] = urls["mapped"]
        print(
            f"{args.samples:,} samples in {shards} shards, batch {args.batch_size}, {args.workers} workers, "
            f"{args.rounds} rounds"
        )
        print(f"{'case':>8} {'stats on':>10} {'stats off':>10} {'overhead':>9}")
        b_mapped = float("nan")
        for case in args.cases.split(","):
            on, off = [], []
            # warm the page cache and imports
            epoch(urls[case], case, args.batch_size, args.workers)
            for r in range(args.rounds):
                for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    if mode == "on":
                        on.append(epoch(urls[case], case, args.batch_size, args.workers))
                    else:
                        with stats_off():
                            off.append(epoch(urls[case], case, args.batch_size, args.workers))
            a, b = statistics.median(on), statistics.median(off)
            b_mapped = b if case == "mapped" else b_mapped
            print(f"{case:>8} {a:>9.3f}s {b:>9.3f}s {100 * (a / b - 1):>+8.1f}%")
        per_batch, per_sample = unit_costs(urls["mapped"])
        batches = -(-args.samples // args.batch_size)
        print(
            f"unit costs: {per_batch / 1000:.1f} us per batch, {per_sample:.0f} ns per decoded sample; per epoch "
            f"{batches * per_batch / 1e6:.2f} ms raw ({100 * batches * per_batch / 1e9 / b_mapped:.2f}% of the "
            f"stats-off mapped epoch), {(batches * per_batch + args.samples * per_sample) / 1e6:.1f} ms decoded"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
