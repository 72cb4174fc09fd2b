"""What the shard cache's self-check costs: a warm-cache epoch from S3 (moto), before and after.

The cache checks a file against its sha256 name once per version of the file (device, inode, size,
modification time). A file this process downloaded is recorded as checked from its checked bytes,
so the epoch after a download hashes nothing; a new process finds the records and hashes nothing
either; only a cached file without a record (a cache an older version filled, or a file that
changed) is hashed, once. Three readers, each with a cache of its own, warmed first:

- ``before``: a source tree without the check (``--before``, e.g. ``git worktree add /tmp/before REV``);
- ``after``: this tree, records in place (what every epoch after the first costs);
- ``after, unrecorded``: this tree with the check records removed before each run (each file hashed
  once: the first epoch after upgrading, the worst case).

Each timed run is a fresh process reading one raw epoch (``decode=None``, 2 workers, batch 64, the
default shuffle) from the warm cache; runs are interleaved, rotating which goes first. Usage::

    git worktree add /tmp/before <commit without the check>
    .venv/bin/python benchmarks/cache_check.py --before /tmp/before --count 20000 --repeat 5

It prints the median and best epoch seconds of each and the ratios to ``before``. Timings are noise
on a busy machine: compare the ratios of one run.
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
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
sys.path.insert(0, str(REPO_ROOT))

from _data import DEFAULT_DATA_DIR, ensure_image_folder  # noqa: E402
from _remote import use_dummy_credentials  # noqa: E402

from tests.remote.endpoints import MotoS3  # noqa: E402

READ = """
import json, sys, time
import shardstream as ss
url, endpoint, cache = sys.argv[1:4]
ds = ss.ShardDataset(url, decode=None, storage_options={"endpoint_url": endpoint}, cache_dir=cache)
start = time.perf_counter()
n = sum(len(b["__key__"]) for b in ds.loader(batch_size=64, num_workers=2))
print(json.dumps({"seconds": time.perf_counter() - start, "samples": n,
                  "healed": ds.disk_cache.healed if hasattr(ds.disk_cache, "healed") else None}))
"""


def read_epoch(tree: Path, url: str, endpoint: str, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", READ, url, endpoint, str(cache)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--before", type=Path, required=True, help="a source tree without the cache check"
    )
    parser.add_argument(
        "--count", type=int, default=20_000, help="JPEGs in the set [default: 20000]"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each [default: 5]")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args()
    use_dummy_credentials()
    images = ensure_image_folder(args.data, args.count)
    scratch = Path(tempfile.mkdtemp(prefix="cache-check-"))
    server = MotoS3()
    server.start()
    try:
        server.create_bucket("cache-check")
        url = "s3://cache-check/ds"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "shardstream",
                "pack",
                str(images.train),
                url,
                "--shard-size",
                "64MB",
                "-q",
                "-o",
                f"endpoint_url={server.endpoint_url}",
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
        readers = {
            "before": (args.before, scratch / "before"),
            "after": (REPO_ROOT, scratch / "after"),
            "after, unrecorded": (REPO_ROOT, scratch / "unrecorded"),
        }
        for tree, cache in readers.values():
            # warm: every shard downloaded into the cache
            read_epoch(tree, url, server.endpoint_url, cache)
        times: dict[str, list[float]] = {name: [] for name in readers}
        names = list(readers)
        for run in range(args.repeat):
            for name in names[run % len(names) :] + names[: run % len(names)]:
                tree, cache = readers[name]
                if name == "after, unrecorded":
                    shutil.rmtree(cache / "checked", ignore_errors=True)
                got = read_epoch(tree, url, server.endpoint_url, cache)
                assert got["samples"] == images.count and not got["healed"], got
                times[name].append(got["seconds"])
        base = statistics.median(times["before"])
        print(
            f"warm-cache epoch from S3 (moto), {images.count} JPEGs, raw, 2 workers, batch 64, {args.repeat} runs"
        )
        for name, seconds in times.items():
            median = statistics.median(seconds)
            print(
                f"  {name:<18} median {median:6.3f} s  best {min(seconds):6.3f} s  "
                f"{median / base:5.3f}x before (median)"
            )
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
