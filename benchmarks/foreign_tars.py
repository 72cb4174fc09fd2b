"""Tars another tool wrote, read with default settings: 8 tars x 1,000 samples of 25 KB written by
webdataset's ``ShardWriter``, then ``shardstream index`` (no flags), read by ``ShardDataset(folder,
decode=None).loader(batch_size=64)`` against webdataset's own loader on the same tars (2 workers,
``shardshuffle`` and ``.shuffle(1000)``, as in ``read.py``), raw bytes, whole epochs with their first
batch, each run a fresh process, the tools taking turns; median and best of ``--repeat`` runs::

    .venv-bench/bin/python benchmarks/foreign_tars.py [--repeat 3] [--keep /tmp/foreign]

Also run: shardstream reading the same tars with no index files at all (the first run on a host builds
each tar's index into the private cache, later runs find it), which is what a read-only folder gets.
Timings are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHARDS, PER_SHARD, SIZE, BATCH = 8, 1_000, 25_000, 64


def make(folder: Path) -> None:
    import webdataset as wds

    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "s-%06d.tar"), maxcount=PER_SHARD, verbose=0) as writer:
        for i in range(SHARDS * PER_SHARD):
            writer.write({"__key__": f"k{i:06d}", "jpg": os.urandom(SIZE), "cls": b"%d" % (i % 10)})


def shardstream_epoch(folder: str, cache: str) -> dict[str, float]:
    from shardstream import ShardDataset

    loader = ShardDataset(folder, decode=None, cache_dir=cache).loader(batch_size=BATCH)
    return _epoch(loader, lambda b: b["jpg"])


def webdataset_epoch(folder: str, cache: str) -> dict[str, float]:
    import webdataset as wds

    urls = sorted(str(p) for p in Path(folder).glob("*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)
    ds = ds.shuffle(1000).to_tuple("jpg", "cls").batched(BATCH)
    return _epoch(wds.WebLoader(ds, batch_size=None, num_workers=2), lambda b: b[0])


def _epoch(loader, values) -> dict[str, float]:
    start = time.perf_counter()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - start
    n, nbytes = 0, 0
    for batch in (first, *it):
        for v in values(batch):
            n += 1
            nbytes += len(v)
    seconds = time.perf_counter() - start
    assert n == SHARDS * PER_SHARD and nbytes == n * SIZE, (n, nbytes)
    return {"rate": n / seconds, "ttfb": ttfb}


RUNS = {"shardstream": shardstream_epoch, "webdataset": webdataset_epoch}


def child(tool: str, folder: str, cache: str) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", tool, folder, cache],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", help="a folder for the tars (made once, kept)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(RUNS[args.child[0]](args.child[1], args.child[2])))
        return
    root = Path(args.keep or tempfile.mkdtemp(prefix="foreign-tars-"))
    indexed, bare = root / "indexed", root / "bare"
    if not (indexed / "_manifest.json").exists():
        make(indexed)
        subprocess.run(
            [sys.executable, "-m", "shardstream.cli", "index", str(indexed), "-q"], check=True
        )
        shutil.rmtree(bare, ignore_errors=True)
        shutil.copytree(indexed, bare, ignore=shutil.ignore_patterns("*.idx"))
        doc = json.loads((bare / "_manifest.json").read_text())
        doc["shards"].pop("index_sha256", None)  # as an index that could not write them left it
        (bare / "_manifest.json").write_text(json.dumps(doc))
    cache = tempfile.mkdtemp(prefix="foreign-cache-")
    rows = {"shardstream": [], "webdataset": [], "shardstream, no index files": []}
    for i in range(args.repeat):
        order = list(rows) if i % 2 == 0 else list(reversed(rows))
        for name in order:
            if name == "webdataset":
                rows[name].append(child("webdataset", str(indexed), cache))
            elif name == "shardstream":
                rows[name].append(child("shardstream", str(indexed), cache))
            else:
                rows[name].append(child("shardstream", str(bare), cache))
    wds = statistics.median(r["rate"] for r in rows["webdataset"])
    print(
        f"{SHARDS} tars x {PER_SHARD:,} samples of {SIZE / 1000:.0f} KB (webdataset ShardWriter), raw"
    )
    print("| reader | epoch samples/s, median (best) | x webdataset | first batch, median |")
    print("|---|---:|---:|---:|")
    for name, runs in rows.items():
        rates = [r["rate"] for r in runs]
        median = statistics.median(rates)
        ttfb = statistics.median(r["ttfb"] for r in runs)
        print(
            f"| {name} | {median:,.0f} ({max(rates):,.0f}) | {median / wds:.2f}x | {ttfb * 1000:.0f} ms |"
        )
    shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
