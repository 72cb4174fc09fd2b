"""Batch shapes for audio: buckets by duration against plain batches, both padded to the longest.

    .venv/bin/python benchmarks/media_shapes.py                    # 240 recordings, 3 rounds
    .venv/bin/python benchmarks/media_shapes.py --count 100 --repeat 5

Data: ``--count`` 16 kHz mono WAV recordings written to ``--work`` (made here, every run the same:
durations log-normal with a median of 3 s and sigma 0.6, clipped to 0.5-12 s), packed with
``ShardWriter`` (which records their durations). Every run is one epoch, decoded with
``AudioClip(start="start")`` (whole recordings), batches of 16, one DataLoader worker:

- ``plain``: ``ShardDataset(..., collate_fn=AudioCollate("wav")).loader(16)``, the baseline: shuffled
  batches padded to their longest recording;
- ``by duration``: ``Bucketed(ds, duration("wav"), boundaries, 16, collate_fn=AudioCollate("wav"))``,
  ``boundaries`` the quartiles of the durations, planned from the recorded facts (peer: ``plain``);
- ``by duration, crop`` (not the default): the same with ``AudioCollate("wav", mode="crop")``, each
  batch cut to its shortest recording (peer: ``plain``).

Rounds alternate the variants; each variant's median samples/s and its ratio to ``plain``'s median in
the same run are printed, with the padding (padded samples over all the batch's samples) or the
samples cropped away (over all samples decoded). Timings are reported, never asserted; the machine
they were measured on may be shared.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardstream import AudioClip, AudioCollate, Bucketed, ShardDataset, ShardWriter, duration

RATE, BATCH, WORKERS = 16000, 16, 1


def recording(seconds: float, seed: int) -> bytes:
    samples = np.random.default_rng(seed).uniform(-0.5, 0.5, round(seconds * RATE)) * 32767
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def make(path: Path, count: int) -> np.ndarray:
    seconds = np.clip(np.random.default_rng(0).lognormal(np.log(3.0), 0.6, count), 0.5, 12.0)
    seconds = np.round(seconds, 2)
    if not (path / "_manifest.json").exists():
        with ShardWriter(str(path), samples_per_shard=64) as writer:
            for i, s in enumerate(seconds):
                writer.write({"__key__": f"r{i:05d}", "wav": recording(float(s), i)})
    return seconds


def batches_of(name: str, url: str, boundaries: list[float]) -> Any:
    mode = "crop" if name.endswith("crop") else "pad"
    ds = ShardDataset(
        url, decode={"wav": AudioClip(start="start")}, collate_fn=AudioCollate("wav", mode=mode)
    )
    if name == "plain":
        return ds.loader(BATCH, WORKERS)
    ds = ShardDataset(url, decode={"wav": AudioClip(start="start")})
    return Bucketed(
        ds,
        duration("wav"),
        boundaries,
        BATCH,
        collate_fn=AudioCollate("wav", mode=mode),
        num_workers=WORKERS,
    )


def one_epoch(name: str, url: str, boundaries: list[float], total: int) -> tuple[float, int, int]:
    """(samples/s, the batches' samples, the recordings' samples in them) of one epoch."""
    start = time.perf_counter()
    samples, slots, real = 0, 0, 0
    for batch in batches_of(name, url, boundaries):
        audio, lengths = batch["wav"], batch["wav_lengths"]
        samples += len(lengths)
        slots += audio.shape[0] * audio.shape[2]
        real += int(lengths.sum())
    elapsed = time.perf_counter() - start
    if samples != total:
        raise SystemExit(f"{name} read {samples} samples, not {total}")
    return samples / elapsed, slots, real


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/shardstream-media-shapes")
    parser.add_argument("--count", type=int, default=240)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    path = Path(args.work) / f"speech-{args.count}"
    seconds = make(path, args.count)
    boundaries = [float(q) for q in np.quantile(seconds, [0.25, 0.5, 0.75])]
    names = ["plain", "by duration", "by duration, crop"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    shares: dict[str, str] = {}
    decoded = int(np.round(seconds * RATE).sum())  # every recording's samples
    for round_ in range(args.repeat):
        for name in names if round_ % 2 == 0 else names[::-1]:
            rate, slots, real = one_epoch(name, str(path), boundaries, args.count)
            rates[name].append(rate)
            shares[name] = (
                f"{100 * (1 - real / decoded):.1f} % cropped away"
                if name.endswith("crop")
                else f"{100 * (1 - real / slots):.1f} % padding"
            )
    base = statistics.median(rates["plain"])
    print(f"{args.count} recordings, {seconds.sum() / 60:.1f} min; medians of {args.repeat}")
    print("| batches | samples/s (median) | against plain | padding or cropping |")
    print("|---|---|---|---|")
    for name in names:
        median = statistics.median(rates[name])
        print(f"| {name} | {median:,.0f} | {median / base:.2f}x | {shares[name]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
