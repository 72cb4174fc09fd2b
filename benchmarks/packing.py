"""Packing benchmark: the padding of SFT batches three ways, and the real tokens per second each delivers.

    .venv/bin/python benchmarks/packing.py                       # 20,000 samples, seq_len 2048
    .venv/bin/python benchmarks/packing.py --samples 5000 --repeat 1     # a quick check

Lengths: a log-normal (``--median`` tokens, ``--sigma``; by default a median of 270 tokens and sigma
0.9, the long-tailed shape typical of instruction/chat data; an assumed shape, not a fit made here),
clipped to ``[1, seq_len]``, seeded.

- ``padding`` (numpy only, no I/O): the fraction of a batch's token slots that are padding,
  ``1 - real tokens / slots``, for
  ``plain`` (batches of ``--batch`` samples in shuffled order, each padded to its longest),
  ``fixed`` (every sample padded to ``seq_len``, the static-shape baseline),
  ``bucketing`` (:class:`LengthBucketing`: windows of ``--window`` sorted by length, batches within
  ``batch * seq_len`` padded tokens), and ``packing`` (:class:`SequencePacking`: best-fit-decreasing
  rows of ``seq_len`` over windows of ``--window``); plus the time best fit takes per sample.
- ``read``: the samples packed as a dataset (``ids.npy`` and ``mask.npy``) in a temporary folder, read
  for one epoch by ``SequencePacking(..., batch_rows=1)`` and by ``LengthBucketing`` over the same
  ``ShardDataset`` (one DataLoader worker): real tokens/s (tokens of the samples, padding excluded)
  and slots/s. Multiply a model's tokens/s by ``1 - padding`` for the tokens it learns from. Their
  peer, ``plain``: the same decoded samples in plain batches of 64 (a ``collate_fn`` that keeps them
  as a list: no padding, no shape), the cost of reading alone.

Each rate is the best of ``--repeat`` runs. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardstream import ShardDataset, ShardWriter
from shardstream.dataset.batches.lengths import LengthBucketing, cut
from shardstream.dataset.batches.sequence_packing import SequencePacking
from shardstream.plan.bins import best_fit_decreasing


def lengths_of(n: int, median: float, sigma: float, seq_len: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), sigma, n).round(), 1, seq_len).astype(np.int64)


def padding(lengths: np.ndarray, seq_len: int, batch: int, window: int) -> dict[str, float]:
    real = float(lengths.sum())
    rng = np.random.default_rng(1)
    shuffled = lengths[rng.permutation(len(lengths))]
    plain = sum(len(b) * int(b.max()) for b in np.array_split(shuffled, -(-len(lengths) // batch)))
    buckets = rows = 0
    for lo in range(0, len(lengths), window):
        w = np.sort(shuffled[lo : lo + window], kind="stable")
        start = 0
        for end in cut(w, batch * seq_len):
            buckets += (end - start) * int(w[end - 1])
            start = end
        rows += len(best_fit_decreasing(shuffled[lo : lo + window], seq_len))
    return {
        "plain": 1 - real / plain,
        "fixed": 1 - real / (len(lengths) * seq_len),
        "bucketing": 1 - real / buckets,
        "packing": 1 - real / (rows * seq_len),
    }


def write(root: Path, lengths: np.ndarray) -> str:
    url = str(root / "sft")
    with ShardWriter(url, shard_size=64 << 20) as writer:
        for i, n in enumerate(lengths.tolist()):
            ids = np.arange(n, dtype=np.int32) % 32000
            mask = (np.arange(n) >= n // 3).astype(np.uint8)
            writer.write({"__key__": f"{i:07d}", "ids.npy": ids, "mask.npy": mask})
    return url


def as_list(samples: list) -> list:
    return samples


def read_rate(url: str, seq_len: int, batch: int, window: int, how: str) -> tuple[float, float]:
    fields = {"input_ids": "ids.npy", "loss_mask": "mask.npy"}
    ds = ShardDataset(url, fields=fields, seed=1)
    started = time.perf_counter()
    real = slots = 0
    if how == "plain":
        ds = ShardDataset(url, fields=fields, seed=1, collate_fn=as_list)
        for b in ds.loader(64, 1):
            n = sum(len(s["input_ids"]) for s in b)
            real, slots = real + n, slots + n
    elif how == "packing":
        for b in SequencePacking(ds, seq_len, window=window, batch_rows=1, num_workers=1):
            real += b["tokens"]
            slots += b["input_ids"].numel()
    else:
        for b in LengthBucketing(ds, batch * seq_len, window=window, num_workers=1):
            real += int(b["lengths"].sum())
            slots += b["input_ids"].numel()
    took = time.perf_counter() - started
    return real / took, slots / took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--median", type=float, default=270.0)
    parser.add_argument("--sigma", type=float, default=0.9)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    lengths = lengths_of(args.samples, args.median, args.sigma, args.seq_len)
    print(
        f"lengths: {len(lengths)} samples, mean {lengths.mean():.0f}, median "
        f"{np.median(lengths):.0f}, p99 {np.percentile(lengths, 99):.0f}, max {lengths.max()} tokens"
    )
    for name, value in padding(lengths, args.seq_len, args.batch, args.window).items():
        print(f"padding {name:10s} {value:6.1%}")
    started = time.perf_counter()
    for lo in range(0, len(lengths), args.window):
        best_fit_decreasing(lengths[lo : lo + args.window], args.seq_len)
    per = (time.perf_counter() - started) / len(lengths) * 1e6
    print(f"best fit decreasing: {per:.2f} us per sample (windows of {args.window})")
    with tempfile.TemporaryDirectory() as tmp:
        url = write(Path(tmp), lengths)
        rates = {}
        for how in ("plain", "packing", "bucketing"):
            best = max(
                (
                    read_rate(url, args.seq_len, args.batch, args.window, how)
                    for _ in range(args.repeat)
                ),
                key=lambda r: r[0],
            )
            rates[how] = best[0]
            peer = "" if how == "plain" else f"  {best[0] / rates['plain']:.2f}x plain"
            print(f"read {how:10s} {best[0]:12,.0f} real tokens/s {best[1]:12,.0f} slots/s{peer}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
