"""Mix benchmark: a 3-source weighted mix, shardstream vs. one ShardDataset, LitData and Mosaic, same data.

Run it in the benchmark environment (``.venv-bench``, see ``benchmarks/read.py``), where LitData and
mosaicml-streaming are installed; tools that cannot be imported are reported and left out::

    .venv-bench/bin/python benchmarks/mix.py                   # 20,000 JPEGs, 3 runs each
    .venv-bench/bin/python benchmarks/mix.py --count 5000 --repeat 2

Data. The JPEG set of ``benchmarks/_data.py`` (10 classes of ``count / 10`` images) is split by class
into three sources of 5, 3 and 2 classes (50%, 30% and 20% of the images); each tool converts them
once, untimed, with the fields ``jpg`` (bytes), ``cls`` and ``src`` (the source's index):
shardstream ``pack --shard-size 64MB`` of each source and of all of it together, LitData
``optimize``, Mosaic ``MDSWriter``. Every run is one epoch of ``count`` samples, raw bytes (the main
process takes every ``jpg`` value as a bytes-like object), 2 DataLoader workers, batches of 64, each
run in a fresh process, runs interleaved:

- ``one``: shardstream, the whole set as one ``ShardDataset`` (the overhead baseline);
- ``mix``: shardstream ``MixedDataset`` of the three sources, weights 0.5 / 0.3 / 0.2;
- ``litdata``: ``CombinedStreamingDataset`` of the three, the same weights;
- ``mosaic``: ``StreamingDataset(streams=[Stream(local=..., proportion=w)], epoch_size=count)``.

Reported: samples/s (best and median), and the proportions' worst deviation per batch: over every
batch and source, ``|count in batch - w * batch size|`` in samples (a batch size of 64 and weights of
0.3 and 0.2 make 19.2 and 12.8: a deviation below 1 is the best any order can do there), its mean, and
each source's share of the epoch. Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import DEFAULT_DATA_DIR, ensure_image_folder

WEIGHTS = [0.5, 0.3, 0.2]
GROUPS = [range(0, 5), range(5, 8), range(8, 10)]  # classes of each source
BATCH, WORKERS = 64, 2
TOOLS = ["one", "mix", "litdata", "mosaic"]


def source_files(train: Path, classes: list[str], group: range) -> list[tuple[str, int]]:
    return [
        (str(train / classes[c] / name), c)
        for c in group
        for name in sorted(os.listdir(train / classes[c]))
    ]


def convert(tool: str, train: Path, classes: list[str], out: Path) -> None:
    """Write the sources for ``tool`` under ``out`` (once: a marker file says it is done)."""
    marker = out / f"{tool}.done"
    if marker.exists():
        return
    sources = [source_files(train, classes, g) for g in GROUPS]
    if tool in ("one", "mix"):
        import shardstream as ss

        for i, files in enumerate(sources + [sum(sources, [])]):
            name = "all" if i == 3 else f"s{i}"
            with ss.ShardWriter(str(out / "ss" / name), shard_size="64MB", overwrite=True) as w:
                for path, label in files:
                    w.write(
                        {
                            "__key__": Path(path).stem + f"_{label}",
                            "jpg": Path(path).read_bytes(),
                            "cls": label,
                            "src": next(k for k, g in enumerate(GROUPS) if label in g),
                        }
                    )
        (out / "one.done").touch()
    elif tool == "litdata":
        from litdata import optimize

        for i, files in enumerate(sources):
            optimize(
                fn=_litdata_sample,
                inputs=[(p, c, i) for p, c in files],
                output_dir=str(out / "litdata" / f"s{i}"),
                chunk_bytes="64MB",
                num_workers=WORKERS,
                reorder_files=False,
                verbose=False,
            )
    elif tool == "mosaic":
        from streaming import MDSWriter

        for i, files in enumerate(sources):
            with MDSWriter(
                out=str(out / "mosaic" / f"s{i}"),
                columns={"jpg": "bytes", "cls": "int", "src": "int"},
                size_limit=64 << 20,
            ) as w:
                for path, label in files:
                    w.write({"jpg": Path(path).read_bytes(), "cls": label, "src": i})
    marker.touch()


def _litdata_sample(item: tuple[str, int, int]) -> dict[str, Any]:
    path, label, src = item
    return {"jpg": Path(path).read_bytes(), "cls": label, "src": src}


def make_loader(tool: str, out: Path, count: int) -> Any:
    if tool == "one":
        import shardstream as ss

        return ss.ShardDataset(str(out / "ss" / "all"), decode=None, seed=0).loader(BATCH, WORKERS)
    if tool == "mix":
        import shardstream as ss

        sources = [
            ss.ShardDataset(str(out / "ss" / f"s{i}"), decode=None, seed=i) for i in range(3)
        ]
        return ss.MixedDataset(sources, WEIGHTS, samples_per_epoch=count).loader(BATCH, WORKERS)
    if tool == "litdata":
        from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset

        parts = [
            StreamingDataset(str(out / "litdata" / f"s{i}"), shuffle=True, seed=0) for i in range(3)
        ]
        combined = CombinedStreamingDataset(parts, seed=0, weights=WEIGHTS, iterate_over_all=False)
        return StreamingDataLoader(combined, batch_size=BATCH, num_workers=WORKERS)
    from streaming import Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    streams = [
        Stream(local=str(out / "mosaic" / f"s{i}"), proportion=w) for i, w in enumerate(WEIGHTS)
    ]
    dataset = StreamingDataset(
        streams=streams, batch_size=BATCH, shuffle=True, shuffle_seed=0, epoch_size=count
    )
    return DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)


def child(tool: str, out: Path, count: int) -> dict[str, Any]:
    """One epoch (at most ``count`` samples): seconds, samples, and per-batch source counts."""
    loader = make_loader(tool, out, count)
    started = time.perf_counter()
    samples = payload = 0
    per_batch: list[list[int]] = []
    for batch in loader:
        values = batch["jpg"]
        payload += sum(memoryview(v).nbytes for v in values)
        src = (
            batch["__source__"]
            if tool in ("one", "mix") and "__source__" in batch
            else batch["src"]
        )
        src = [
            int(bytes(s)) if isinstance(s, (bytes, bytearray, memoryview)) else int(s) for s in src
        ]
        per_batch.append([src.count(i) for i in range(3)])
        samples += len(values)
        if samples >= count:
            break
    seconds = time.perf_counter() - started
    return {
        "tool": tool,
        "seconds": seconds,
        "samples": samples,
        "payload": payload,
        "per_batch": per_batch,
    }


def deviation(per_batch: list[list[int]]) -> tuple[float, float]:
    """(worst, mean) over full batches and sources of |count - w * batch size|."""
    devs = [
        abs(n - w * sum(row))
        for row in per_batch
        if sum(row) == BATCH
        for n, w in zip(row, WEIGHTS)
    ]
    return (max(devs), statistics.fmean(devs)) if devs else (float("nan"), float("nan"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "OUT"))
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), args.count)))
        return 0
    images = ensure_image_folder(args.data, args.count)
    out = images.root / "mix"
    tools = []
    for tool in args.tools.split(","):
        try:
            convert(tool, images.train, images.classes, out)
            tools.append(tool)
        except ImportError as exc:
            print(f"{tool}: left out ({exc})")
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for r in range(args.repeat):
        for tool in tools[r % len(tools) :] + tools[: r % len(tools)]:  # rotate which goes first
            done = subprocess.run(
                [sys.executable, __file__, "--count", str(args.count), "--child", tool, str(out)],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            if done.returncode != 0:
                print(f"{tool}: run failed\n{done.stderr[-3000:]}")
                continue
            results[tool].append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = max((r["samples"] / r["seconds"] for r in results.get("one", [])), default=None)
    print(
        f"\n{args.count:,} JPEGs in 3 sources (weights {WEIGHTS}), raw bytes, {WORKERS} workers, batch {BATCH}, "
        f"{args.repeat} runs\n"
    )
    print(
        f"{'tool':10} {'best/s':>9} {'median/s':>9} {'vs one':>7} {'worst dev':>10} {'mean dev':>9}  shares"
    )
    for tool, runs in results.items():
        if not runs:
            continue
        rates = [r["samples"] / r["seconds"] for r in runs]
        worst, mean = deviation(runs[0]["per_batch"])
        totals = [sum(row[i] for row in runs[0]["per_batch"]) for i in range(3)]
        shares = "/".join(f"{t / max(sum(totals), 1):.3f}" for t in totals)
        ratio = f"{max(rates) / base:.2f}x" if base else "-"
        print(
            f"{tool:10} {max(rates):9,.0f} {statistics.median(rates):9,.0f} {ratio:>7} {worst:10.2f} {mean:9.2f}  "
            f"{shares}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
