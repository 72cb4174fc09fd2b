"""Running the jobs: each run in a fresh child process (``read.py --child TOOL MODE``), its tree sampled.

Runs are interleaved, rotating which job goes first in each round. Before each run the harness waits
(``--quiet-wait``) until other processes leave the CPUs, and it flags runs during which they did not.
The child prints its result as one ``RESULT=<json>`` line; the parent adds the process tree's peak RSS
(sampled from /proc every 50 ms), the wall time, the other processes' load and, for remote runs, the CPU
seconds the servers (moto, the proxies) used, which are not counted as other processes' load. A run that
fails or reads the wrong number of samples (or, in raw mode, of JPEG bytes) is a problem of its result.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _data import ImageSet

from .config import LOCAL, RESULT_PREFIX, SCRIPT, child_env
from .jobs import Job, Result
from .procfs import TreeSampler, busy_seconds, own_seconds
from .tools import REMOTE_LIMITATIONS

if TYPE_CHECKING:
    from _remote import RemoteS3

SAMPLE_INTERVAL = 0.05  # seconds between RSS samples of a running child
QUIET_CORES = 0.2  # before each run, wait until other processes use less than this many cores
# seconds: how long one load probe lasts, and the pause between probes
QUIET_PROBE, QUIET_RETRY = (
    0.5,
    5.0,
)
NOISY_CORES = 0.1  # a run during which other processes used more than this is flagged


def wait_for_quiet(max_wait: float) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``QUIET_CORES``; the load last seen."""
    deadline = time.perf_counter() + max_wait
    announced = False
    while True:
        busy, own = busy_seconds(), own_seconds()
        time.sleep(QUIET_PROBE)
        load = max(busy_seconds() - busy - (own_seconds() - own), 0.0) / QUIET_PROBE
        if load < QUIET_CORES or time.perf_counter() >= deadline:
            return load
        if not announced:
            print(
                f"  (other processes use {load:.1f} cores; waiting up to {max_wait:.0f} s for a quiet machine)",
                flush=True,
            )
            announced = True
        time.sleep(QUIET_RETRY)


class ChildFailed(RuntimeError):
    """A run's subprocess failed; ``output`` is all it wrote to stderr (or stdout)."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


def run_job(
    job: Job, args: argparse.Namespace, images: ImageSet, remote: RemoteS3 | None = None
) -> dict[str, Any]:
    """Run one (tool, mode) in a fresh subprocess, sampling its process tree's memory; its result.

    A remote job gets its endpoint and an empty scratch folder (removed afterwards); the CPU
    time of the servers (moto, the proxies) during the run is measured apart from other load.
    """
    argv = [
        sys.executable,
        str(SCRIPT),
        "--child",
        job.tool,
        job.mode,
        "--data",
        str(args.data),
        "--count",
        str(images.count),
        "--limit-images",
        str(args.limit_images),
        "--arrow-rows",
        str(args.arrow_rows),
    ]
    scratch = None
    if job.place != LOCAL:
        assert remote is not None
        scratch = Path(tempfile.mkdtemp(prefix="read-bench-"))
        argv += [
            "--endpoint",
            remote.endpoints[job.place],
            "--bucket",
            remote.bucket,
            "--scratch",
            str(scratch),
        ]
    try:
        return _run_child(argv, args, remote)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run_child(
    argv: list[str], args: argparse.Namespace, remote: RemoteS3 | None
) -> dict[str, Any]:
    load_before = wait_for_quiet(args.quiet_wait)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        servers_before = remote.server_cpu() if remote is not None else {}
        busy, own = busy_seconds(), own_seconds()
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=child_env())
        try:
            sampler = TreeSampler(proc.pid)
            while proc.poll() is None:
                sampler.sample()
                if time.perf_counter() - started > args.timeout:
                    raise RuntimeError(f"timed out after {args.timeout:.0f} s")
                time.sleep(SAMPLE_INTERVAL)
        finally:
            if proc.poll() is None:  # interrupted or timed out: no child left behind
                proc.kill()
                proc.wait()
        wall = time.perf_counter() - started
        servers_after = remote.server_cpu() if remote is not None else {}
        server_cpu = {
            name: servers_after[name] - servers_before.get(name, 0.0) for name in servers_after
        }
        other = max(busy_seconds() - busy - (own_seconds() - own) - sum(server_cpu.values()), 0.0)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-4:])
        raise ChildFailed(f"exit status {proc.returncode}: {tail}", stderr or stdout)
    result = json.loads(lines[-1][len(RESULT_PREFIX) :])
    result.update(
        peak_rss=sampler.peak_rss,
        peak_anon=sampler.peak_anon,
        peak_processes=sampler.peak_processes,
        wall=wall,
        other_cores=other / wall,
        other_cores_before=load_before,
        server_cpu=server_cpu,
    )
    return result


def unsupported(job: Job, exc: Exception) -> str | None:
    """The known limitation behind a remote job's failure, if that is what it is."""
    limitation = REMOTE_LIMITATIONS.get(job.tool)
    if limitation is None or job.place == LOCAL:
        return None
    return limitation(getattr(exc, "output", str(exc)))


def run_all(
    jobs: list[Job], args: argparse.Namespace, images: ImageSet, remote: RemoteS3 | None = None
) -> list[Result]:
    results = {job.label: Result(job.tool, job.mode, job.place) for job in jobs}
    for attempt in range(1, args.repeat + 1):
        print(f"run {attempt}/{args.repeat}", flush=True)
        shift = (attempt - 1) % len(jobs)  # interleaved, each round starting one job later
        for job in jobs[shift:] + jobs[:shift]:
            result = results[job.label]
            if result.problems or result.unsupported:
                continue
            try:
                run = run_job(job, args, images, remote)
            except (RuntimeError, OSError, ValueError) as exc:
                limitation = unsupported(job, exc)
                if limitation:  # tried once: the same holds at the other places (the proxies)
                    for other in results.values():
                        if (other.tool, other.mode) == (job.tool, job.mode) and not other.runs:
                            other.unsupported = limitation
                    print(f"  {job.label:<32} {limitation}", flush=True)
                    continue
                result.problems.append(str(exc))
                print(f"  {job.label:<32} FAILED: {exc}", flush=True)
                continue
            result.runs.append(run)
            expected = (
                args.arrow_rows
                if job.mode == "arrow"
                else None
                if job.mode == "limit"
                else images.count
            )
            if expected is not None and run["samples"] != expected:
                result.problems.append(f"read {run['samples']:,} samples, expected {expected:,}")
            if job.mode == "raw" and run["payload_bytes"] != images.total_bytes:
                result.problems.append(
                    f"read {run['payload_bytes']:,} JPEG bytes, expected {images.total_bytes:,}"
                )
            ttfb = f"  TTFB {run['ttfb']:.3f} s" if run.get("ttfb") is not None else ""
            noisy = (
                f"  NOISY: others used {run['other_cores']:.2f} cores"
                if run["other_cores"] > NOISY_CORES
                else ""
            )
            warm = f"  warm 2nd epoch {run['warm_rate']:,.0f}/s" if run.get("warm_rate") else ""
            servers = (
                f"  servers {sum(run['server_cpu'].values()):.1f} CPU s"
                if job.place != LOCAL
                else ""
            )
            print(
                f"  {job.label:<32} {run['rate']:>10,.0f}/s  {run['samples']:,} in {run['seconds']:.2f} s{ttfb}"
                f"  peak RSS {run['peak_rss'] / 2**20:,.0f} MiB{warm}{servers}{noisy}",
                flush=True,
            )
    return list(results.values())
