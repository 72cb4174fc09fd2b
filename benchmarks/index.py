"""Indexing existing tars: the header scan (µs per header) and ``shardstream index`` (seconds), of two
source trees side by side, on the 20,000-JPEG set.

Two folders of tars are made once from the benchmark data (``benchmarks/_data.py``): ``packed``, the
set's shards as ``shardstream pack`` wrote them (linked, not copied), and ``gnutar``, one
``tar cf`` per class folder (GNU tar's own format: folder entries, directory order). For each tree
(``--before``, default the tree this file is in, and ``--after``), a child process with that tree on
``PYTHONPATH`` times the scan that ``index`` makes of each tar in memory (best of ``--repeat``), and
``python -m shardstream index`` of each folder (best and median of ``--runs``, the trees interleaved).
Ratios are after / before, from the same run. Run:
``python benchmarks/index.py --before /path/to/old/tree --after .``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

_SCAN = """
import json, sys, time
import shardstream
from shardstream.formats import tar
from shardstream.formats.compression import decompress
out = {}
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    best = float("inf")
    for _ in range(int(sys.argv[1])):
        start = time.perf_counter()
        if hasattr(tar, "read_samples"):
            tar.read_samples(decompress(data, None, path), path)
        else:  # what index did before read_samples
            list(tar.iter_samples(decompress(data, None, path), path))
        best = min(best, time.perf_counter() - start)
    out[path] = best
print(json.dumps({"from": shardstream.__file__, "seconds": out}))
"""


def _headers(path: Path) -> int:
    """Header blocks of a tar that describe a member (extended headers counted with their member)."""
    with tarfile.open(path) as tf:
        return sum(1 for _ in tf)


def prepare(data: Path, work: Path) -> dict[str, list[Path]]:
    """The two folders of tars (made once under ``work``)."""
    packed, gnu = work / "packed", work / "gnutar"
    if not packed.exists():
        packed.mkdir(parents=True)
        for shard in sorted((data / "read" / "shardstream").glob("shard-*.tar")):
            os.symlink(shard, packed / shard.name)
    if not gnu.exists():
        gnu.mkdir(parents=True)
        for folder in sorted((data / "train").iterdir()):
            if folder.is_dir():
                subprocess.run(
                    ["tar", "cf", str(gnu / f"{folder.name}.tar"), folder.name],
                    cwd=data / "train",
                    check=True,
                )
    return {
        name: sorted(folder.glob("*.tar")) for name, folder in (("packed", packed), ("gnutar", gnu))
    }


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}


def scan(tree: Path, tars: list[Path], repeat: int) -> float:
    """Seconds of the header scans of ``tars`` in a child process importing ``tree`` (best per tar)."""
    done = subprocess.run(
        [sys.executable, "-c", _SCAN, str(repeat), *map(str, tars)],
        env=_env(tree),
        cwd=tars[0].parent,  # not the current folder: it would come before PYTHONPATH
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    if not Path(found["from"]).resolve().is_relative_to(tree):
        raise SystemExit(f"the child imported {found['from']}, not {tree}")
    return sum(found["seconds"].values())


def index(tree: Path, folder: Path) -> float:
    """Seconds of ``shardstream index FOLDER --overwrite -q`` with ``tree`` imported."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "shardstream", "index", str(folder), "--overwrite", "-q"],
        env=_env(tree),
        cwd=folder,  # not the current folder: "-m" puts it before PYTHONPATH
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, default=REPO_ROOT)
    parser.add_argument("--after", type=Path, default=REPO_ROOT)
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "bench-data")
    parser.add_argument("--work", type=Path, default=Path("/tmp/shardstream-index-bench"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sets = prepare(args.data, args.work)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    print(f"before: {trees['before']}\nafter:  {trees['after']}")
    print(
        "| tars | headers | scan before (µs/header) | scan after | ratio "
        "| index before (s, best / median) | index after | ratio (best / median) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, tars in sets.items():
        headers = sum(_headers(t) for t in tars)
        scans = {k: scan(tree, tars, args.repeat) * 1e6 / headers for k, tree in trees.items()}
        times: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(args.runs):  # interleaved: the machine's load falls on both alike
            for k, tree in trees.items():
                times[k].append(index(tree, tars[0].parent))
        med = {k: statistics.median(v) for k, v in times.items()}
        best = {k: min(v) for k, v in times.items()}
        print(
            f"| {name} ({len(tars)}) | {headers:,} | {scans['before']:.2f} | {scans['after']:.2f} | "
            f"{scans['after'] / scans['before']:.2f} | {best['before']:.2f} / {med['before']:.2f} | "
            f"{best['after']:.2f} / {med['after']:.2f} | {best['after'] / best['before']:.2f} / "
            f"{med['after'] / med['before']:.2f} |"
        )
    for tars in sets.values():  # what index wrote: the manifest, sample indexes
        for written in [tars[0].parent / "_manifest.json", *tars[0].parent.glob("*.idx")]:
            written.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
