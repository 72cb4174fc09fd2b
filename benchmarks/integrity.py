"""What the per-sample checksums cost: the same code with them and without, in one run.

Every pack writes a checksum (xxh3_64) of each value beside it (a tar's sample index, an Arrow batch's
metadata) and every read checks the values it hands out (:mod:`shardstream.formats.checksums`). This
measures, on the JPEG set of ``benchmarks/_data.py`` (20,000 JPEGs of about 25 KB, 10 classes) packed
with default settings but the 64 MB shards of the read benchmark:

- ``hashes``: xxh3_64, CRC32C (``google-crc32c``, if installed), ``zlib.crc32`` and sha256 on a 23 KB
  value and on a 2-byte label, in this process (best and median of 7 loops);
- ``raw``: one epoch of undecoded bytes with default settings (``ShardDataset(url, decode=None)``,
  ``.loader(batch_size=64)``: its default workers), the main process taking every ``jpg`` value as a
  bytes-like object; and the time to the first batch (from creating the iterator);
- ``decoded``: the same epoch decoded (``ShardDataset(url)``: ``decode="torch"``, simplejpeg where
  installed), and its first batch;
- ``pack``: ``ss.pack(folder, dest, shard_size="64MB")`` into an empty folder (the output removed after);
- ``arrow-pack`` and ``arrow-read``: the read benchmark's numeric table (2,000,000 rows x 8 float32 and
  an int64 label, one Parquet file) packed into Arrow shards (defaults: zstd buffers), and read in
  process, ``ShardDataset(decode=None, shuffle=False)``, ``loader(batch_size=4096, num_workers=0)``: where
  the checksums cost most, relatively (every value a few bytes; a checksum per row at pack time).

"on" is shardstream as it is; "off" flips the module switches ``CHECK_ON_READ`` and ``WRITE_ON_PACK``
(not settings: they exist for this measurement) in the measured process, so reads check nothing and
packs write 0.5.0's indexes. Each run is a fresh process; after one untimed run of each, runs alternate
on and off (which goes first rotates), ``--repeat`` of each; the table gives the medians, the best runs and the ratios on / off.
Timings are noise on a busy machine: the load average before each run is printed, compare ratios of
one run. Usage::

    PYTHONPATH=. .venv/bin/python benchmarks/integrity.py --repeat 5
    PYTHONPATH=. .venv/bin/python benchmarks/integrity.py --modes hashes
    PYTHONPATH=. .venv/bin/python benchmarks/integrity.py --count 2000 --repeat 3 --modes raw,pack
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from _data import DEFAULT_DATA_DIR, ensure_image_folder, warm_page_cache  # noqa: E402

SHARD_SIZE = "64MB"
MODES = ("hashes", "raw", "decoded", "pack", "arrow-pack", "arrow-read")

CHILD = """
import json, os, shutil, sys, time
import shardstream as ss
from shardstream.formats import checksums
mode, switch, url, src, scratch, SHARD_SIZE = sys.argv[1:7]
checksums.CHECK_ON_READ = checksums.WRITE_ON_PACK = switch == "on"
if mode in ("pack", "arrow-pack"):
    dest = os.path.join(scratch, "packed")
    started = time.perf_counter()
    ss.pack(src, dest, shard_size=SHARD_SIZE, progress=False)
    seconds = time.perf_counter() - started
    shutil.rmtree(dest)
    print(json.dumps({"seconds": seconds}))
    sys.exit(0)
if mode == "arrow-read":
    ds = ss.ShardDataset(url, decode=None, shuffle=False)
    loader = ds.loader(batch_size=4096, num_workers=0)
else:
    ds = ss.ShardDataset(url, decode=None) if mode == "raw" else ss.ShardDataset(url)
    loader = ds.loader(batch_size=64)
started = time.perf_counter()
it = iter(loader)
batch = next(it)
ttfb = time.perf_counter() - started
samples, payload = 0, 0
while batch is not None:
    samples += len(batch["label" if mode == "arrow-read" else "__key__"])
    if mode == "raw":
        payload += sum(memoryview(v).nbytes for v in batch["jpg"])
    batch = next(it, None)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "ttfb": ttfb, "samples": samples, "payload": payload}))
"""


def hashes() -> list[tuple[str, str, float, float]]:
    """(value, hash, best ns, median ns) per call on a 23 KB value and a 2-byte label."""
    import xxhash

    fns = {
        "xxh3_64": xxhash.xxh3_64_intdigest,
        "zlib.crc32": zlib.crc32,
        "sha256": lambda b: hashlib.sha256(b).digest(),
    }
    try:
        import google_crc32c

        fns["CRC32C"] = google_crc32c.value
    except ImportError:
        pass
    out = []
    for value, label, loops in ((os.urandom(23 * 1024), "23 KB", 20_000), (b"7\n", "2 B", 200_000)):
        for name, fn in fns.items():
            runs = []
            for _ in range(7):
                started = time.perf_counter()
                for _ in range(loops):
                    fn(value)
                runs.append((time.perf_counter() - started) / loops * 1e9)
            out.append((label, name, min(runs), statistics.median(runs)))
    return out


def run_child(mode: str, switch: str, url: Path, src: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="integrity-") as scratch:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", CHILD, mode, switch, str(url), str(src), scratch, SHARD_SIZE],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            cwd=scratch,
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--count", type=int, default=20_000, help="JPEGs [default: 20000]")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each [default: 5]")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--json", type=Path, help="write every run here")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    results: dict = {"runs": []}
    if "hashes" in modes:
        print("checksum of one value, this process (ns a call; GB/s of the 23 KB value):")
        for label, name, best, median in hashes():
            rate = f"  {23 * 1024 / best:6.2f} GB/s" if label == "23 KB" else ""
            print(f"  {label:6} {name:11} best {best:8.0f}  median {median:8.0f}{rate}")
            results.setdefault("hashes", []).append([label, name, best, median])
    timed = [m for m in modes if m != "hashes"]
    if not timed:
        return 0
    import shardstream as ss

    images = ensure_image_folder(args.data, args.count)
    url = images.root / "integrity" / "shardstream"
    if not (url / "_manifest.json").exists():  # packed once, untimed, with checksums
        ss.pack(images.train, url, shard_size=SHARD_SIZE, progress=False, overwrite=True)
    table = images.root / "integrity" / "table"
    arrow = images.root / "integrity" / "arrow"
    if any(m.startswith("arrow") for m in timed) and not (arrow / "_manifest.json").exists():
        from readbench.arrow import ARROW_ROWS, write_table

        if not (table / "table.parquet").exists():
            write_table(table, ARROW_ROWS)
        ss.pack(table, arrow, format="arrow", shard_size=SHARD_SIZE, progress=False)
    warm_page_cache(images.files())
    warm_page_cache(sorted(p for p in url.iterdir() if p.is_file()))
    if arrow.exists():
        warm_page_cache(sorted(p for p in arrow.iterdir() if p.is_file()))
    where = {"arrow-pack": (arrow, table), "arrow-read": (arrow, table)}
    # one untimed run of each: the host's once-per-file checks (sample indexes against their tars)
    for mode in timed:
        for switch in ("on", "off"):
            run_child(mode, switch, *where.get(mode, (url, images.train)))
    times: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.repeat):
        for mode in timed:
            order = ("on", "off") if (r + timed.index(mode)) % 2 == 0 else ("off", "on")
            for switch in order:
                load = os.getloadavg()[0]
                data, src = where.get(mode, (url, images.train))
                got = run_child(mode, switch, data, src)
                got.update(mode=mode, switch=switch, run=r, load=load)
                if mode in ("raw", "decoded"):
                    assert got["samples"] == images.count, got
                if mode == "raw":
                    assert got["payload"] == images.total_bytes, got
                times.setdefault((mode, switch), []).append(got)
                results["runs"].append(got)
                extra = f", first batch {got['ttfb'] * 1e3:.0f} ms" if "ttfb" in got else ""
                print(
                    f"  run {r + 1} {mode:8} {switch:3} {got['seconds']:7.3f} s{extra} "
                    f"(load {load:.2f})",
                    flush=True,
                )
    print(f"\n{args.count:,} JPEGs, {args.repeat} runs each (median / best; on / off):")
    for mode in timed:
        for what in ("seconds", "ttfb") if "pack" not in mode else ("seconds",):
            on = [t[what] for t in times[(mode, "on")]]
            off = [t[what] for t in times[(mode, "off")]]
            name = {"seconds": "pack" if "pack" in mode else "epoch", "ttfb": "first batch"}[what]
            ratio = statistics.median(on) / statistics.median(off)
            best = min(on) / min(off)
            print(
                f"  {mode:8} {name:12} on {statistics.median(on):7.3f} / {min(on):7.3f} s   "
                f"off {statistics.median(off):7.3f} / {min(off):7.3f} s   "
                f"ratio {ratio:5.3f} (best {best:5.3f})"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
