"""CPU seconds of one folder shard's write loop, and of the parts of it no loop can remove.

Run it from the repository root after ``benchmarks/pack.py`` has generated its images::

    .venv/bin/python benchmarks/pack_loop.py --baseline /tmp/old    # old: git archive REV shardstream

Times ``packing.tar_files.write_files`` over the first ``--samples`` samples of the listing (unshuffled)
in this process, with and without the sample index and the image sizes, as CPU seconds
(``time.process_time``: other processes inflate it less than wall time), from this checkout and, with
``--baseline DIR``, from another copy of the package, alternating, each in its own subprocess; then
reading those files, one sha256 pass over their bytes and writing them, alone. Prints the best of the
rounds and the sha256 of each loop's shard (the same bytes from both copies). Timings are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _data import DEFAULT_DATA_DIR

REPO_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"default": (True, True), "no index": (False, True), "no sizes": (True, False)}
VARIANTS["neither"] = (False, False)

# argv: PACKAGE_DIR SOURCE SAMPLES OUT; prints {variant: [cpu seconds, shard sha256]} as JSON
LOOP_PROGRAM = """\
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from shardstream.formats.tar_index import IndexBuilder
from shardstream.manifest.image_sizes import ShardSizes
from shardstream.packing.folder import read_file
from shardstream.packing.tar_files import write_files
from shardstream.sources import open_source
samples = open_source(sys.argv[2]).samples[: int(sys.argv[3])]
out = {}
fd = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
write_files(fd, samples, read_file)  # untimed: the first pass pays for what later ones find ready
os.close(fd)
for name, (index, sizes) in json.loads(sys.argv[5]).items():
    fd = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    started = time.process_time()
    _, digest, _ = write_files(
        fd, samples, read_file, False, IndexBuilder() if index else None, ShardSizes() if sizes else None
    )
    out[name] = [time.process_time() - started, digest]
    os.close(fd)
print(json.dumps(out))
"""


def loop_times(package: Path, source: Path, samples: int, out: Path) -> dict[str, list]:
    """{variant: [CPU seconds, shard sha256]} of one run of the loop from ``package``."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            LOOP_PROGRAM,
            str(package),
            str(source),
            str(samples),
            str(out),
            json.dumps(VARIANTS),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout)


def floor_times(paths: list[str], out: Path) -> dict[str, float]:
    """CPU seconds of reading ``paths``, one sha256 pass over their bytes, and writing those bytes."""
    view = memoryview(bytearray(1 << 20))
    started, total = time.process_time(), 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        total += os.readv(fd, [view])
        os.close(fd)
    times = {"read the files": time.process_time() - started}
    started, digest = time.process_time(), hashlib.sha256()
    for _ in range(total >> 20):
        digest.update(view)
    times["one sha256 pass"] = time.process_time() - started
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    started = time.process_time()
    for _ in range(total >> 20):
        os.write(fd, view)
    times["write"] = time.process_time() - started
    os.close(fd)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="pack.py's --data")
    parser.add_argument("--samples", type=int, default=10_000, help="samples in the shard")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each copy [default: 3]")
    parser.add_argument("--baseline", type=Path, default=None, help="another copy of the package")
    args = parser.parse_args(argv)
    source = args.data / "train"
    if not source.is_dir():
        parser.error(f"no images in {source}: run benchmarks/pack.py first")
    copies = {"now": REPO_ROOT, **({"baseline": args.baseline} if args.baseline else {})}
    best: dict[str, dict[str, float]] = {name: {} for name in copies}
    digests: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "shard.tar"
        for _ in range(args.rounds):
            for name, package in copies.items():
                for variant, (seconds, digest) in loop_times(
                    package, source, args.samples, out
                ).items():
                    best[name][variant] = min(seconds, best[name].get(variant, seconds))
                    digests.setdefault(variant, set()).add(digest)
        sys.path.insert(0, str(REPO_ROOT))
        from shardstream.sources import open_source

        paths = [s.files[0][1] for s in open_source(str(source)).samples[: args.samples]]
        floors: dict[str, float] = {}
        for _ in range(args.rounds):
            for part, seconds in floor_times(paths, out).items():
                floors[part] = min(seconds, floors.get(part, seconds))
    print(f"write_files over {args.samples:,} samples, CPU s, best of {args.rounds}:")
    for variant in VARIANTS:
        row = "  ".join(f"{name} {best[name][variant]:.3f}" for name in copies)
        ratio = (
            f"  now/baseline {best['now'][variant] / best['baseline'][variant]:.2f}"
            if args.baseline
            else ""
        )
        same = "same shard" if len(digests[variant]) == 1 else "SHARDS DIFFER"
        print(f"  {variant:9s} {row}{ratio}  ({same})")
    print("alone over the same files, CPU s, best:")
    for part, seconds in floors.items():
        print(f"  {part:16s} {seconds:.3f}")
    return 0 if all(len(d) == 1 for d in digests.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
