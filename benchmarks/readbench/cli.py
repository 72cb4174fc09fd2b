"""The command line and the main flow: data, conversions, jobs (local or ``--remote s3``), report; and the children.

The same script (``read.py``) is the parent and every child: ``--child TOOL MODE`` runs one measured run
and prints ``RESULT=<json>``; ``--convert NAME`` writes one conversion with the tool's own library.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from _data import (
    DEFAULT_DATA_DIR,
    FULL_COUNT,
    ImageSet,
    ensure_image_folder,
    set_root,
    warm_page_cache,
)

from .arrow import ARROW_ROWS, run_arrow
from .config import LOADER_MODES, MODES, RESULT_PREFIX
from .convert import Conversion, child_convert, conversion_lines, convert
from .epoch import run_loader
from .harness import run_all
from .jobs import Job, Result, conversions_for, jobs_for
from .limit import LIMIT_IMAGES, run_limit
from .machine import machine
from .report import (
    context_lines,
    latency_header,
    latency_rows,
    markdown,
    print_grid,
    print_table,
    remote_lines,
    to_json,
)
from .targets import remote_targets, target_lines, targets
from .tools import DATA_OF, TOOLS, RemoteSource

ADDED_LATENCY = 0.05  # seconds the proxy adds to every request


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help=f"folder for generated data and conversions [default: {DEFAULT_DATA_DIR}]",
    )
    parser.add_argument(
        "--count",
        type=int,
        default=FULL_COUNT,
        help=f"number of images [default: {FULL_COUNT:,}]; other counts go to DATA/count-N/",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed runs per tool and mode [default: 3]"
    )
    parser.add_argument(
        "--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}"
    )
    parser.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated subset of {','.join(MODES)} [default: all; "
        f"with --remote: raw; --remote takes {','.join(LOADER_MODES)}]",
    )
    parser.add_argument(
        "--remote",
        choices=["s3", "moto", "seaweedfs"],
        default=None,
        help="read from a local S3 server, moto (s3, moto) or SeaweedFS (seaweedfs), directly, "
        "through a proxy, and through a proxy adding --latency to every request, instead of "
        "local files",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=ADDED_LATENCY,
        help=f"seconds the proxy adds to every request with --remote [default: {ADDED_LATENCY:g}]",
    )
    parser.add_argument(
        "--limit-images",
        type=int,
        default=LIMIT_IMAGES,
        help=f"images decoded for the decode limit [default: {LIMIT_IMAGES:,}]",
    )
    parser.add_argument(
        "--arrow-rows",
        type=int,
        default=ARROW_ROWS,
        help=f"rows of the table [default: {ARROW_ROWS:,}]",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds one run may take [default: 900]"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=300.0,
        help="seconds to wait before a run for other processes to leave the CPUs [default: 300]",
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="also write the results as JSON to this file"
    )
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--convert", metavar="NAME", help=argparse.SUPPRESS)
    # a remote child: its S3 endpoint, bucket, scratch
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--bucket", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.modes is None:
        args.modes = "raw" if args.remote else ",".join(MODES)
    if args.remote and set(args.modes.split(",")) - set(LOADER_MODES):
        parser.error(f"--remote runs the modes {', '.join(LOADER_MODES)} only")
    if args.latency <= 0:
        parser.error("--latency must be positive seconds")
    for option, allowed in (("tools", TOOLS), ("modes", MODES)):
        unknown = set(getattr(args, option).split(",")) - set(allowed)
        if unknown:
            parser.error(f"unknown {option} {sorted(unknown)}; choose from {', '.join(allowed)}")
    if min(args.repeat, args.count, args.limit_images, args.arrow_rows) < 1:
        parser.error("--repeat, --count, --limit-images and --arrow-rows must be at least 1")
    args.data = args.data.resolve()
    return args


def child_run(
    tool: str, mode: str, images: ImageSet, read_root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """In the ``--child TOOL MODE`` process: one measured run."""
    if mode == "pillow":
        sys.modules["simplejpeg"] = None  # type: ignore[assignment]  # `import simplejpeg` fails: Pillow path
    if args.endpoint is not None:
        return run_loader(
            tool, mode, read_root, RemoteSource(args.endpoint, args.bucket, args.scratch)
        )
    if mode == "limit":
        return run_limit(tool, images, args.limit_images)
    if mode == "arrow":
        return run_arrow(tool, read_root)
    return run_loader(tool, mode, read_root)


def main(argv: list[str] | None = None, description: str | None = None) -> int:
    args = parse_args(argv, description)
    if args.child or args.convert:  # inside a subprocess started below
        images = ensure_image_folder(args.data, args.count)
        read_root = images.root / "read"
        if args.convert:
            child_convert(args.convert, images, read_root, args.arrow_rows)
            return 0
        result = child_run(args.child[0], args.child[1], images, read_root, args)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    info = machine()
    print(
        f"machine: {info['nproc']} cores ({info['cpu']}), Python {info['python']}, commit {info['commit']}, "
        f"shardstream from {info['shardstream_path']} ({info['shardstream_digest']})",
        flush=True,
    )
    images = ensure_image_folder(args.data, args.count)
    print(
        f"data: {images.count:,} JPEGs in {images.train} ({'reused' if images.reused else 'generated'}), "
        f"{images.total_bytes / 1e6:,.1f} MB, mean {images.mean_bytes / 1e3:.1f} KB",
        flush=True,
    )
    read_root = set_root(args.data, args.count) / "read"

    places = None
    if args.remote:
        from _remote import REMOTES

        remote_class = REMOTES[args.remote]
        places = [
            remote_class.place(None),
            remote_class.place(0.0),
            remote_class.place(args.latency),
        ]
    jobs = jobs_for(args.tools.split(","), args.modes.split(","), places)
    conversions = [convert(name, images, read_root, args) for name in conversions_for(jobs)]
    for line in conversion_lines(conversions):
        print(f"data for {line}", flush=True)
    failed = {c.name for c in conversions if c.problem}
    if "table" in failed:
        failed.add("arrow")
    skipped = [
        j
        for j in jobs
        if (j.mode == "arrow" and "arrow" in failed)
        or (j.mode not in ("arrow", "limit") and DATA_OF[j.tool] in failed)
    ]
    jobs = [j for j in jobs if j not in skipped]

    remote = None
    if args.remote:
        remote = run_remote(jobs, conversions, args, images)
        results = remote["results"]
        found = remote_targets(results, remote["places"])
    else:
        files = [
            p
            for c in conversions
            if not c.problem
            for p in sorted(c.path.rglob("*"))
            if p.is_file()
        ]
        warm = warm_page_cache(
            files + (images.files() if any(j.mode == "limit" for j in jobs) else [])
        )
        print(f"warm-up: read {warm[0] / 1e6:,.1f} MB once, untimed ({warm[1]:.1f} s)", flush=True)
        results = run_all(jobs, args, images) if jobs else []
    for job in skipped:
        results.append(
            Result(
                job.tool,
                job.mode,
                job.place,
                problems=[f"no data: {DATA_OF.get(job.tool, job.tool)} conversion failed"],
            )
        )
    if not args.remote:
        found = targets(results)

    print()
    print_table(results)
    if remote is not None:
        print()
        print_grid([latency_header(remote["places"]), *latency_rows(results, remote["places"])])
    print()
    for line in target_lines(found):
        print(line)
    for line in context_lines(results):
        print(line)
    if remote is not None:
        for line in remote_lines(results, remote["places"], remote["uploads"]):
            print(line)
    print()
    print(markdown(images, results, found, conversions, args, info, remote))
    if args.json is not None:
        doc = to_json(images, results, found, conversions, args, info, remote)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    problems = [f"{r.tool}/{r.label}: {p}" for r in results for p in r.problems]
    problems += [f"{c.name}: {c.problem}" for c in conversions if c.problem]
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def run_remote(
    jobs: list[Job], conversions: list[Conversion], args: argparse.Namespace, images: ImageSet
) -> dict[str, Any]:
    """Start the S3 server and the proxies, upload each tool's data once (untimed), run the jobs; then stop them."""
    from _remote import REMOTES

    with REMOTES[args.remote](latencies=(0.0, args.latency)) as remote:
        endpoints = remote.endpoints
        print(
            f"remote: {remote.description} (pid {remote.server.process.pid}) at {endpoints[remote.place(None)]}, "
            f"bucket {remote.bucket}; proxies: "
            + ", ".join(
                f"@{place} {url}" for place, url in endpoints.items() if place != remote.place(None)
            )
            + f" (started in {remote.start_seconds:.1f} s)",
            flush=True,
        )
        for c in conversions:
            if not c.problem:
                u = remote.upload(c.path, c.name)
                print(
                    f"uploaded {c.name}: {u.files} objects, {u.nbytes / 1e6:,.1f} MB to s3://{remote.bucket}/"
                    f"{u.prefix}/ in {u.seconds:.1f} s (untimed)",
                    flush=True,
                )
        results = run_all(jobs, args, images, remote) if jobs else []
        return {
            "results": results,
            "places": remote.places,
            "endpoints": endpoints,
            "uploads": remote.uploads,
            "server": remote.description,
        }
