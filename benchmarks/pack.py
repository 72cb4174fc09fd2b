"""Pack benchmark: shardstream vs. a plain webdataset.ShardWriter script vs. ``tar cf``.

Run it from the repository root with the project's virtual environment::

    .venv/bin/python benchmarks/pack.py                 # 20,000 JPEGs (~0.5 GB), 3 runs each
    .venv/bin/python benchmarks/pack.py --count 2000    # a quick try on a smaller set
    .venv/bin/python benchmarks/pack.py --repeat 5 --json pack-results.json

The first run generates ``bench-data/train/<class>/<name>.jpg`` (deterministic, a minute or
two on 2 cores); later runs reuse it. Smaller ``--count`` sets go to ``bench-data/count-N/``.

Every contestant runs as its own subprocess (so each pays its own start-up) against a page
cache warmed by one untimed read of every source file, writing into ``<set>/pack-out/``,
which is removed (and ``sync``-ed) before each run. One untimed round writes Python's bytecode caches
(under ``<set>/pycache``, with ``PYTHONDONTWRITEBYTECODE`` lifted: an installed package has its caches).
Runs are interleaved, rotating which tool goes first; each round waits (up to ``--quiet-wait`` s) until
other processes use under 0.2 cores, and the cores they used during each run are reported.
After each run the output is checked (sample count, size) outside the timed region.
``--baseline NAME=DIR`` adds ``shardstream pack`` run from another copy of the package (before/after).

1. shardstream: ``shardstream pack SRC DEST --workers 2 --overwrite -q`` (256 MB tar shards).
2. webdataset: the script a user would write: walk the tree in sorted order and write
   ``{"__key__", "jpg", "cls"}`` samples with ``webdataset.ShardWriter(maxsize=256e6)``.
3. tar: ``tar cf OUT.tar -C SRC .``, the I/O bound: one archive, no checksums, no samples.
4. pack-fsync and pack-nofsync: ``shardstream.pack(..., fsync=True/False)`` from one small script,
   the same in both but for ``fsync``: the cost of making the dataset durable (every shard synced
   before its rename, the folder before and after the manifest), as the ratio of their best times.

``--engine ray`` runs instead (each also reports its time after start-up, Ray's included):

5. pack-ray: ``shardstream.pack(..., engine="ray")`` on a local Ray of ``--workers`` CPUs, against
6. pack-fsync: the local process pool, the same pack, and
7. raydata: Ray Data's own ``read_binary_files -> map -> write_webdataset`` (JPEG bytes kept, not
   decoded: ``read_images`` would decode and re-encode every image), the baseline a Ray user would write.

This is a benchmark, not a test: timings are reported, never asserted. The exit status is
non-zero only when a contestant fails or writes output that does not look right.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from _data import DEFAULT_DATA_DIR, FULL_COUNT, ImageSet, ensure_image_folder, warm_page_cache
from readbench.procfs import busy_seconds, own_seconds

TOOLS = ("shardstream", "webdataset", "tar", "pack-fsync", "pack-nofsync")
# --engine ray: the Ray engine against the local pool and Ray Data
RAY_TOOLS = (
    "pack-ray",
    "raydata",
    "pack-fsync",
)
SPEEDUP_TARGETS = {
    "webdataset": 3.0,
    "tar": 0.8,
}  # shardstream speed / other speed (issue 17: >= 0.8x tar cf)
IMAGE_DESC = "256x256 RGB, 10 classes"
QUIET_CORES = 0.2  # before each round, wait (up to --quiet-wait) until other processes use fewer cores than this
NOISY_CORES = 0.1  # a timed run during which other processes used more is counted as noisy
# headers and padding: a sane tar of N files is at most this much bigger
MAX_TAR_OVERHEAD_PER_SAMPLE = 4096

# What a webdataset user would write to pack an ImageFolder tree. argv: SRC PATTERN
WEBDATASET_PROGRAM = """\
import os
import sys
import time

import webdataset as wds

loop_started = time.perf_counter()  # webdataset imports torch (~2 s here); also report the loop alone

src, pattern = sys.argv[1], sys.argv[2]
classes = sorted(e.name for e in os.scandir(src) if e.is_dir())
with wds.ShardWriter(pattern, maxsize=256e6, verbose=0) as sink:
    for index, name in enumerate(classes):
        folder = os.path.join(src, name)
        for fname in sorted(os.listdir(folder)):
            with open(os.path.join(folder, fname), "rb") as f:
                data = f.read()
            sink.write({"__key__": f"{name}/{os.path.splitext(fname)[0]}", "jpg": data, "cls": index})
print(f"LOOP_SECONDS={time.perf_counter() - loop_started:.6f}")
"""


# The pack API with and without fsync, for the durability cost. argv: SRC DEST WORKERS on|off SHARD_SIZE
PACK_PROGRAM = """\
import sys
import time

import shardstream as ss

loop_started = time.perf_counter()
ss.pack(sys.argv[1], sys.argv[2], workers=int(sys.argv[3]), overwrite=True, progress=False,
        fsync=sys.argv[4] == "on", shard_size=sys.argv[5])
print(f"LOOP_SECONDS={time.perf_counter() - loop_started:.6f}")
"""

# The same pack as Ray tasks on a local Ray of WORKERS CPUs (started first; the loop time excludes it).
# argv: SRC DEST WORKERS SHARD_SIZE
RAY_PROGRAM = """\
import sys
import time

import ray

import shardstream as ss

ray.init(num_cpus=int(sys.argv[3]), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
started = time.perf_counter()
ray.get([ray.remote(lambda: __import__("shardstream.packing.folder")).remote() for _ in range(int(sys.argv[3]))])
print(f"WARMUP_SECONDS={time.perf_counter() - started:.6f}")  # worker processes started, shardstream imported
loop_started = time.perf_counter()
ss.pack(sys.argv[1], sys.argv[2], overwrite=True, progress=False, shard_size=sys.argv[4], engine="ray")
print(f"LOOP_SECONDS={time.perf_counter() - loop_started:.6f}")
"""

# What a Ray Data user would write: the files as bytes (not decoded) to WebDataset tars. argv: SRC DEST WORKERS
RAYDATA_PROGRAM = """\
import os
import sys
import time

import ray

ray.init(num_cpus=int(sys.argv[3]), include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
ray.data.DataContext.get_current().enable_progress_bars = False
loop_started = time.perf_counter()
src = sys.argv[1]
classes = sorted(e.name for e in os.scandir(src) if e.is_dir())

def sample(row):
    rel = os.path.relpath(row["path"], src)
    name = os.path.dirname(rel)
    return {"__key__": os.path.splitext(rel)[0], "jpg": row["bytes"], "cls": str(classes.index(name)).encode()}

# an identity encoder: the values are bytes already (the default one, even with encoder=False, asserts that
# a "jpg" value is a PIL image to encode)
ray.data.read_binary_files(src, include_paths=True).map(sample).write_webdataset(sys.argv[2], encoder=lambda s: s)
print(f"LOOP_SECONDS={time.perf_counter() - loop_started:.6f}")
"""


@dataclass
class Output:
    """What one run wrote: samples found and bytes on disk."""

    samples: int
    nbytes: int


@dataclass
class Contestant:
    name: str
    command: Callable[[Path, Path], list[str]]  # (source folder, output folder) -> argv
    inspect: Callable[[Path], Output]  # output folder -> what it holds
    description: str


@dataclass
class Result:
    tool: str
    description: str
    times: list[float] = field(default_factory=list)
    # after the tool's imports, where it reports them
    loop_times: list[float] = field(default_factory=list)
    # cores other processes used during each timed run
    other_load: list[float] = field(default_factory=list)
    # what else a tool reports (Ray's warm-up)
    extra: dict[str, float] = field(default_factory=dict)
    output: Output | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.times) and not self.problems

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)


# -- contestants ---------------------------------------------------------------------------


def shardstream_command() -> list[str]:
    """The ``shardstream`` console script of this interpreter's environment (``-m`` if it has none)."""
    script = Path(sys.executable).parent / "shardstream"
    return [str(script)] if script.exists() else [sys.executable, "-m", "shardstream"]


def count_tar_samples(tars: list[Path]) -> int:
    """Members ending in ``.jpg`` over ``tars``, as ``tar -tf`` lists them."""
    total = 0
    for tar in tars:
        listing = subprocess.run(
            ["tar", "-tf", str(tar)], check=True, capture_output=True, text=True
        ).stdout
        total += sum(1 for line in listing.splitlines() if line.endswith(".jpg"))
    return total


def inspect_shardstream(out: Path) -> Output:
    manifest = json.loads((out / "_manifest.json").read_text())
    shards = sorted(out.glob("shard-*.tar"))
    on_disk = sum(p.stat().st_size for p in shards)
    if on_disk != manifest["total_bytes"] or len(shards) != manifest["num_shards"]:
        raise RuntimeError(
            f"manifest says {manifest['num_shards']} shards, {manifest['total_bytes']:,} bytes; "
            f"found {len(shards)} shards, {on_disk:,} bytes"
        )
    return Output(int(manifest["num_samples"]), on_disk)


def inspect_tars(out: Path) -> Output:
    tars = sorted(out.glob("*.tar"))
    return Output(count_tar_samples(tars), sum(p.stat().st_size for p in tars))


# ``shardstream`` from another copy of the package (``--baseline``): before/after in one run. argv: PATH, then the CLI's
BASELINE_PROGRAM = (
    "import sys; sys.path.insert(0, sys.argv.pop(1)); from shardstream.cli import main; main()"
)


def baseline_contestant(name: str, package: Path, pack_args: list[str]) -> Contestant:
    return Contestant(
        name,
        lambda src, out: [
            sys.executable,
            "-c",
            BASELINE_PROGRAM,
            str(package),
            "pack",
            str(src),
            str(out),
            *pack_args,
        ],
        inspect_shardstream,
        f"the same command from the package copy at {package} (before/after in one run)",
    )


def contestants(
    workers: int, shard_size: str = "256MB", baselines: dict[str, Path] | None = None
) -> dict[str, Contestant]:
    ss = shardstream_command()
    pack_args = ["--workers", str(workers), "--shard-size", shard_size, "--overwrite", "-q"]
    return {
        "shardstream": Contestant(
            "shardstream",
            lambda src, out: [*ss, "pack", str(src), str(out), *pack_args],
            inspect_shardstream,
            f"shardstream pack --workers {workers} ({shard_size} tar shards)",
        ),
        **{
            name: baseline_contestant(name, path, pack_args)
            for name, path in (baselines or {}).items()
        },
        "webdataset": Contestant(
            "webdataset",
            lambda src, out: [
                sys.executable,
                "-c",
                WEBDATASET_PROGRAM,
                str(src),
                str(out / "shard-%06d.tar"),
            ],
            inspect_tars,
            "webdataset.ShardWriter(maxsize=256e6), one process",
        ),
        "tar": Contestant(
            "tar",
            lambda src, out: ["tar", "cf", str(out / "all.tar"), "-C", str(src), "."],
            inspect_tars,
            "tar cf (one archive, I/O bound)",
        ),
        "pack-ray": Contestant(
            "pack-ray",
            lambda src, out: [
                sys.executable,
                "-c",
                RAY_PROGRAM,
                str(src),
                str(out),
                str(workers),
                shard_size,
            ],
            inspect_shardstream,
            f"shardstream.pack(engine='ray', shard_size={shard_size!r}) on a local Ray of {workers} CPUs",
        ),
        "raydata": Contestant(
            "raydata",
            lambda src, out: [
                sys.executable,
                "-c",
                RAYDATA_PROGRAM,
                str(src),
                str(out),
                str(workers),
            ],
            inspect_tars,
            f"Ray Data read_binary_files -> map -> write_webdataset, {workers} CPUs",
        ),
        **{
            f"pack-{mode}": Contestant(
                f"pack-{mode}",
                lambda src, out, on=on: [
                    sys.executable,
                    "-c",
                    PACK_PROGRAM,
                    str(src),
                    str(out),
                    str(workers),
                    on,
                    shard_size,
                ],
                inspect_shardstream,
                f"shardstream.pack(workers={workers}, shard_size={shard_size!r}, fsync={on == 'on'})",
            )
            for mode, on in (("fsync", "on"), ("nofsync", "off"))
        },
    }


# -- running -------------------------------------------------------------------------------


def fresh_dir(path: Path) -> None:
    """An empty ``path``, with the previous run's writes flushed so they do not slow the next run."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    os.sync()


def check_output(result: Result, output: Output, images: ImageSet) -> None:
    low, high = images.total_bytes, images.total_bytes + images.count * MAX_TAR_OVERHEAD_PER_SAMPLE
    if output.samples != images.count:
        result.problems.append(f"wrote {output.samples:,} samples, expected {images.count:,}")
    if not low <= output.nbytes <= high:
        result.problems.append(f"wrote {output.nbytes:,} bytes, expected {low:,}..{high:,}")
    result.output = output


def contestant_env(cache: Path) -> dict[str, str]:
    """The contestants' environment: Python's bytecode cache on (under ``cache``), as in an installed package.
    With ``PYTHONDONTWRITEBYTECODE`` (set on some machines) every run would compile shardstream's modules anew
    (about 0.1 s here), which no installed copy does; torch and webdataset, installed, have their caches."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def run_once(
    contestant: Contestant, result: Result, images: ImageSet, out: Path, timed: bool = True
) -> None:
    fresh_dir(out)
    argv = contestant.command(images.train, out)
    busy, own = busy_seconds(), own_seconds()
    started = time.perf_counter()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=contestant_env(out.parent.parent / "pycache")
    )
    seconds = time.perf_counter() - started
    # the contestant's tree excluded
    other = max(busy_seconds() - busy - (own_seconds() - own), 0.0) / seconds
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        result.problems.append(f"exit status {proc.returncode}: " + " | ".join(tail))
        return
    if not timed:
        return
    try:
        output = contestant.inspect(out)
    except (OSError, ValueError, KeyError, RuntimeError, subprocess.CalledProcessError) as exc:
        result.problems.append(f"cannot check its output: {exc}")
        return
    result.times.append(seconds)
    result.other_load.append(other)
    for line in proc.stdout.splitlines():
        if line.startswith("LOOP_SECONDS="):
            result.loop_times.append(float(line.split("=", 1)[1]))
        if line.startswith("WARMUP_SECONDS="):
            result.extra["warmup"] = min(
                result.extra.get("warmup", 1e9), float(line.split("=", 1)[1])
            )
    check_output(result, output, images)
    print(
        f"  {contestant.name:<12} {seconds:8.2f} s  {output.samples:,} samples, {output.nbytes / 1e6:,.1f} MB"
        f"  (other processes: {other:.2f} cores)",
        flush=True,
    )


def wait_for_quiet(max_wait: float) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``QUIET_CORES``; the load last seen."""
    deadline = time.perf_counter() + max_wait
    while True:
        busy, own = busy_seconds(), own_seconds()
        time.sleep(0.5)
        load = max(busy_seconds() - busy - (own_seconds() - own), 0.0) / 0.5
        if load < QUIET_CORES or time.perf_counter() >= deadline:
            return load
        time.sleep(2.0)


def run_all(
    chosen: list[Contestant], images: ImageSet, out_root: Path, repeat: int, quiet_wait: float = 0.0
) -> list[Result]:
    results = {c.name: Result(c.name, c.description) for c in chosen}
    try:
        print("warm-up run (untimed: bytecode caches written)", flush=True)
        for contestant in chosen:
            run_once(
                contestant,
                results[contestant.name],
                images,
                out_root / contestant.name,
                timed=False,
            )
        for attempt in range(1, repeat + 1):
            load = wait_for_quiet(quiet_wait) if quiet_wait > 0 else 0.0
            print(
                f"run {attempt}/{repeat}"
                + (
                    f" (other processes still use {load:.1f} cores after waiting "
                    f"{quiet_wait:.0f} s)"
                    if load >= QUIET_CORES
                    else ""
                ),
                flush=True,
            )
            # Interleaved, and each round starts with the next tool, so drift and "who goes first" hit all alike.
            shift = (attempt - 1) % len(chosen)
            for contestant in chosen[shift:] + chosen[:shift]:
                result = results[contestant.name]
                if result.problems:
                    continue
                run_once(contestant, result, images, out_root / contestant.name)
                if result.problems:
                    print(
                        f"  {contestant.name:<12} FAILED: {'; '.join(result.problems)}", flush=True
                    )
    finally:
        shutil.rmtree(out_root, ignore_errors=True)
    return list(results.values())


# -- reporting -----------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count() or 1
    tar = subprocess.run(["tar", "--version"], capture_output=True, text=True).stdout.splitlines()
    versions: dict[str, str | None] = {}
    for package in ("shardstream", "webdataset"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "nproc": nproc,
        "cpu": cpu,
        "memory_gib": memory,
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "tar": tar[0] if tar else None,
        **versions,
    }


def speed(images: ImageSet, result: Result) -> float:
    return images.total_bytes / result.best


def ratios(results: list[Result]) -> dict[str, float | None]:
    """shardstream speed / other tool's speed, from best times."""
    by = {r.tool: r for r in results}
    ss = by.get("shardstream")
    out: dict[str, float | None] = {}
    for other in SPEEDUP_TARGETS:
        if ss is not None and other in by:
            out[other] = by[other].best / ss.best if ss.ok and by[other].ok else None
    return out


def rows(images: ImageSet, results: list[Result]) -> list[list[str]]:
    table = []
    for r in results:
        if not r.ok:
            table.append([r.tool, "failed", "-", "-", "-", "-"])
            continue
        table.append(
            [
                r.tool,
                f"{r.best:.2f}",
                f"{r.median:.2f}",
                f"{speed(images, r) / 1e6:.0f}",
                f"{images.count / r.best:,.0f}",
                f"{r.output.nbytes / 1e6:,.0f}" if r.output else "-",
            ]
        )
    return table


HEADER = ["tool", "best s", "median s", "MB/s", "samples/s", "output MB"]


def print_table(images: ImageSet, results: list[Result]) -> None:
    table = [HEADER, *rows(images, results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    for n, row in enumerate(table):
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


def fsync_cost(results: list[Result]) -> float | None:
    """Best time with fsync / best time without (same program, same run)."""
    by = {r.tool: r for r in results}
    on, off = by.get("pack-fsync"), by.get("pack-nofsync")
    return on.best / off.best if on is not None and off is not None and on.ok and off.ok else None


def ratio_lines(results: list[Result]) -> list[str]:
    lines = []
    loads = [x for r in results for x in r.other_load]
    if loads:
        noisy = sum(x > NOISY_CORES for x in loads)
        lines.append(
            f"other processes during the timed runs: median {statistics.median(loads):.2f} cores, "
            f"max {max(loads):.2f}; {noisy} of {len(loads)} runs above {NOISY_CORES} cores (a loaded "
            "machine slows shardstream's two worker processes more than tar's one)"
        )
        quiet = {
            r.tool: [t for t, x in zip(r.times, r.other_load) if x <= NOISY_CORES]
            for r in results
            if r.ok
        }
        for other in ("tar", "before"):
            if quiet.get("shardstream") and quiet.get(other):
                lines.append(
                    f"quiet runs only (other processes under {NOISY_CORES} cores): shardstream best "
                    f"{min(quiet['shardstream']):.2f} s of {len(quiet['shardstream'])}, {other} best "
                    f"{min(quiet[other]):.2f} s of {len(quiet[other])}: shardstream speed / {other} speed "
                    f"{min(quiet[other]) / min(quiet['shardstream']):.2f}x"
                )
    by_name = {r.tool: r for r in results}
    cost = fsync_cost(results)
    if cost is not None:
        lines.append(
            f"fsync cost: pack with fsync / without = {cost:.3f}x (best times, same program and run)"
        )
    for other, value in ratios(results).items():
        target = SPEEDUP_TARGETS[other]
        if value is None:
            lines.append(f"shardstream speed / {other} speed: n/a (a run failed)")
        else:
            verdict = "meets" if value >= target else "misses"
            median = by_name[other].median / by_name["shardstream"].median
            lines.append(
                f"shardstream speed / {other} speed: {value:.2f}x best, {median:.2f}x median "
                f"({verdict} the target >= {target:g}x)"
            )
    for base in results:
        if base.description.startswith("the same command from the package copy") and base.ok:
            for other in ("tar", "shardstream"):
                if other in by_name and by_name[other].ok:
                    lines.append(
                        f"{base.tool} (--baseline) speed / {other} speed: "
                        f"{by_name[other].best / base.best:.2f}x best, "
                        f"{by_name[other].median / base.median:.2f}x median"
                    )
    by_tool = {r.tool: r for r in results}
    ray_pack, pool, raydata = (
        by_tool.get("pack-ray"),
        by_tool.get("pack-fsync"),
        by_tool.get("raydata"),
    )
    for r in (pool, ray_pack, raydata):
        if r is not None and r.ok and r.loop_times and ray_pack is not None:
            lines.append(
                f"{r.tool} after start-up: best {min(r.loop_times):.2f} s, "
                f"median {statistics.median(r.loop_times):.2f} s"
            )
    if ray_pack is not None and ray_pack.ok and ray_pack.loop_times:
        if pool is not None and pool.ok and pool.loop_times:
            ratio = min(ray_pack.loop_times) / min(pool.loop_times)
            verdict = "meets" if ratio <= 1.5 else "misses"
            lines.append(
                f"Ray engine time / local pool time, after start-up (best): {ratio:.2f}x ({verdict} the "
                f"target <= 1.5x; Ray's start-up, not counted, took {ray_pack.extra.get('warmup', 0):.2f} s "
                "for its worker processes)"
            )
        if raydata is not None and raydata.ok and raydata.loop_times:
            lines.append(
                f"Ray Data's pack time / the Ray engine's, after start-up (best): "
                f"{min(raydata.loop_times) / min(ray_pack.loop_times):.2f}x"
            )
    ours = by_tool.get("shardstream")
    for r in results:
        if r.loop_times and ours is not None and ours.ok:
            lines.append(
                f"{r.tool} without its import time (its loop alone, best {min(r.loop_times):.2f} s): "
                f"shardstream speed / that speed = {min(r.loop_times) / ours.best:.2f}x "
                f"(shardstream's time still includes its own start-up)"
            )
    return lines


def markdown(images: ImageSet, results: list[Result], repeat: int, info: dict[str, Any]) -> str:
    lines = [
        f"Packing {images.count:,} JPEGs ({IMAGE_DESC}, {images.total_bytes / 1e6:,.0f} MB, "
        f"mean {images.mean_bytes / 1e3:.1f} KB) from a warm page cache; best and median of {repeat} runs.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join(["---", *["---:"] * (len(HEADER) - 1)]) + "|",
    ]
    for row in rows(images, results):
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", *(f"- {line}" for line in ratio_lines(results))]
    lines += [
        "",
        f"Machine: {info['nproc']} cores ({info['cpu']}), {info['memory_gib']} GiB RAM, {info['system']}, "
        f"Python {info['python']}, shardstream {info['shardstream']}, webdataset {info['webdataset']}, {info['tar']}.",
    ]
    return "\n".join(lines)


def to_json(
    images: ImageSet,
    results: list[Result],
    warmup: tuple[int, float],
    repeat: int,
    info: dict[str, Any],
) -> dict[str, Any]:
    return {
        "benchmark": "pack",
        "machine": info,
        "dataset": {
            "path": str(images.train),
            "count": images.count,
            "classes": len(images.classes),
            "total_bytes": images.total_bytes,
            "mean_bytes": round(images.mean_bytes, 1),
            "generation_seconds": round(images.generation_seconds, 2),
            "reused": images.reused,
        },
        "warmup": {"bytes": warmup[0], "seconds": round(warmup[1], 3)},
        "repeat": repeat,
        "results": [
            {
                "tool": r.tool,
                "description": r.description,
                "ok": r.ok,
                "problems": r.problems,
                "times": [round(t, 4) for t in r.times],
                "loop_times": [round(t, 4) for t in r.loop_times],
                "other_process_cores": [round(x, 3) for x in r.other_load],
                "best_seconds": round(r.best, 4) if r.times else None,
                "median_seconds": round(r.median, 4) if r.times else None,
                "mb_per_s": round(speed(images, r) / 1e6, 1) if r.ok else None,
                "samples_per_s": round(images.count / r.best, 1) if r.ok else None,
                "output_bytes": r.output.nbytes if r.output else None,
                "output_samples": r.output.samples if r.output else None,
            }
            for r in results
        ],
        "speed_ratios": {
            f"shardstream/{k}": None if v is None else round(v, 3)
            for k, v in ratios(results).items()
        },
        "targets": {f"shardstream/{k}": v for k, v in SPEEDUP_TARGETS.items()},
        "fsync_cost_ratio": None if fsync_cost(results) is None else round(fsync_cost(results), 4),
    }


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"folder for generated data and outputs [default: {DEFAULT_DATA_DIR}]",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=FULL_COUNT,
        help=f"number of images [default: {FULL_COUNT:,}]; other counts go to DATA/count-N/",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tool [default: 3]")
    parser.add_argument("--workers", type=int, default=2, help="shardstream --workers [default: 2]")
    parser.add_argument(
        "--shard-size", default="256MB", help="shardstream --shard-size [default: 256MB]"
    )
    parser.add_argument(
        "--tools", default=None, help=f"comma-separated subset of {','.join(TOOLS + RAY_TOOLS[:2])}"
    )
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="ray: the Ray engine, Ray Data and the local pool (tools " + ",".join(RAY_TOOLS) + ")",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the results as JSON to this file"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help=f"before each round wait up to this many seconds for other processes to use under "
        f"{QUIET_CORES} cores [default: 60; 0: do not wait]",
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="also time `shardstream pack` from this copy of the package (a folder holding "
        "shardstream/, e.g. from `git archive REV shardstream | tar x -C DIR`), as NAME "
        "[baseline]: before/after in one run; repeatable",
    )
    parser.add_argument(
        "--living",
        action="store_true",
        help="instead: append 10%% more images to the packed set against a full re-pack (living.py)",
    )
    args = parser.parse_args(argv)
    args.baselines = {}
    for value in args.baseline:
        name, _, path = value.rpartition("=")
        args.baselines[name or "baseline"] = Path(path)
        if not (Path(path) / "shardstream" / "cli").is_dir():
            parser.error(f"--baseline {value}: no shardstream/cli package in {path}")
    unknown = set(args.tools.split(",") if args.tools else ()) - set(TOOLS + RAY_TOOLS)
    if unknown:
        parser.error(
            f"unknown tools {sorted(unknown)}; choose from {', '.join(TOOLS + RAY_TOOLS[:2])}"
        )
    if args.repeat < 1 or args.count < 1 or args.workers < 1:
        parser.error("--repeat, --count and --workers must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tools = (
        args.tools.split(",") if args.tools else list(RAY_TOOLS if args.engine == "ray" else TOOLS)
    )
    tools += [name for name in args.baselines if name not in tools]
    chosen = [
        c
        for name, c in contestants(args.workers, args.shard_size, args.baselines).items()
        if name in tools
    ]
    info = machine()
    print(f"machine: {info['nproc']} cores ({info['cpu']}), Python {info['python']}", flush=True)

    images = ensure_image_folder(args.data.resolve(), args.count)
    if args.living:
        import living

        living.run(images.train, images.root / "living", args.repeat, args.workers, args.shard_size)
        return 0
    how = "reused" if images.reused else "generated"
    print(
        f"data: {images.count:,} JPEGs in {images.train} ({how}; generation took {images.generation_seconds:.1f} s), "
        f"{images.total_bytes / 1e6:,.1f} MB, mean {images.mean_bytes / 1e3:.1f} KB",
        flush=True,
    )

    warmup = warm_page_cache(images.files())
    print(
        f"warm-up: read all {warmup[0] / 1e6:,.1f} MB once, untimed ({warmup[1]:.1f} s); the page cache is not "
        "dropped (that needs root), so every contestant runs against a warm page cache",
        flush=True,
    )

    results = run_all(chosen, images, images.root / "pack-out", args.repeat, args.quiet_wait)

    print()
    print_table(images, results)
    for line in ratio_lines(results):
        print(line)
    print()
    print(markdown(images, results, args.repeat, info))
    problems = [f"{r.tool}: {p}" for r in results for p in r.problems]
    if args.json is not None:
        args.json.write_text(
            json.dumps(to_json(images, results, warmup, args.repeat, info), indent=2) + "\n"
        )
        print(f"\nresults written to {args.json}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
