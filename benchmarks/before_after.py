"""Before/after: the read path of two copies of the package on the same data, in one run, alternating.

    .venv/bin/python benchmarks/before_after.py --baseline /path/to/old/checkout      # 5 rounds
    .venv/bin/python benchmarks/before_after.py --baseline OLD --count 4000 --rounds 3

For a change that must not cost speed (a refactoring): each round runs every case once in a fresh
process of each copy (``PYTHONPATH`` set to the copy), in alternating order, so that load on a shared
machine falls on both alike. Only public API is used (``ShardDataset``, ``.loader()``, ``ShardMap``),
which both copies have. The dataset is packed once, by this copy, from the synthetic ImageFolder of
``_data.py`` (``--count`` JPEGs of 256 px); both copies read the same files.

Cases, each with default settings:

- ``raw epoch``: ``ShardDataset(url, decode=None).loader(64)``, one epoch (samples/s).
- ``decoded epoch``: ``ShardDataset(url).loader(64)`` (JPEGs decoded to tensors), one epoch.
- ``first batch``: from ``ShardDataset(url)`` made to the first batch of its loader (ms).
- ``map reads``: ``ShardMap(url, decode=None)``, every ``m[i]`` in a seeded random order (samples/s).

Reported: each copy's median over the rounds and the ratio after/before (>1: after is faster;
for the first batch, before/after). Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

CASE = r"""
import json, sys, time
import numpy as np
url, case = sys.argv[1], sys.argv[2]
import shardstream as ss
t0 = time.perf_counter()
if case == "raw epoch" or case == "decoded epoch":
    ds = ss.ShardDataset(url, decode=None) if case == "raw epoch" else ss.ShardDataset(url)
    n = sum(len(b["__key__"]) for b in ds.loader(64))
    print(json.dumps({"value": n / (time.perf_counter() - t0)}))
elif case == "first batch":
    next(iter(ss.ShardDataset(url).loader(64)))
    print(json.dumps({"value": (time.perf_counter() - t0) * 1000}))
else:
    m = ss.ShardMap(url, decode=None)
    order = np.random.default_rng(0).permutation(len(m)).tolist()
    t0 = time.perf_counter()
    for i in order:
        m[i]
    print(json.dumps({"value": len(order) / (time.perf_counter() - t0)}))
"""
CASES = {  # name -> (unit, higher is better)
    "raw epoch": ("samples/s", True),
    "decoded epoch": ("samples/s", True),
    "first batch": ("ms", False),
    "map reads": ("samples/s", True),
}


def run_case(copy: Path, url: str, case: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", CASE, url, case],
        env=env,
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{copy}: {case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["value"]


def dataset(data: Path, count: int) -> str:
    from _data import ensure_image_folder, set_root

    images = ensure_image_folder(data, count)
    out = set_root(data, count) / "before-after-ds"
    if not (out / "_manifest.json").exists():
        import shardstream as ss

        ss.pack(str(images.train), str(out), overwrite=True)
    return str(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, type=Path, help="the copy to compare against")
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data")
    ap.add_argument("--count", type=int, default=20_000, help="JPEGs [default: 20,000]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    url = dataset(args.data, args.count)
    copies = {"before": args.baseline.resolve(), "after": ROOT}
    cases = args.cases.split(",")
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for case in cases:
            for name in order:
                times.setdefault((case, name), []).append(run_case(copies[name], url, case))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    print(f"{'case':<15} {'before':>12} {'after':>12} {'unit':>10} {'ratio':>7}")
    for case in cases:
        unit, higher = CASES[case]
        b = statistics.median(times[(case, "before")])
        a = statistics.median(times[(case, "after")])
        ratio = a / b if higher else b / a
        print(f"{case:<15} {b:>12,.1f} {a:>12,.1f} {unit:>10} {ratio:>7.2f}")


if __name__ == "__main__":
    main()
