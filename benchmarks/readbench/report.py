"""Reporting: the rate table (and, remote, the latency table), the lines that explain the targets, Markdown, JSON.

The table gives samples/s over the epoch (best and median of the runs), the steady rate after the first
batch (best run), the median TTFB, and the process tree's peak RSS (max over runs). Remote runs add each
rate over webdataset's at the same place; the latency table gives each tool's best rate at the three
places, the rate with the added latency over the rate through the plain proxy and over the direct one,
and the median TTFBs.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from _data import IMAGE_SIZE, ImageSet

from .arrow import ARROW_BATCH
from .config import BATCH_SIZE, LOCAL, SHARD_SIZE, WORKERS
from .convert import Conversion, conversion_lines
from .harness import NOISY_CORES
from .jobs import Result, find
from .procfs import cores
from .targets import Target, remote_modes
from .tools import SHUFFLES, TOOLS

REMOTE_CAVEATS = (
    "moto is one Python process on the same cores as the readers, so serving competes with reading for CPU, and "
    "it copies a whole object for every ranged GET; the proxy is another Python process and buffers each response "
    "whole; a real S3 has other latency, bandwidth and parallelism, so absolute rates here say little about S3."
)
SEAWEED_CAVEATS = (
    "weed mini (master, volume server, filer and S3 gateway in one Go process) runs on the same cores as the readers; "
    "the proxy is a Python process and buffers each response whole; a real S3 has other latency, bandwidth and "
    "parallelism, so absolute rates here say little about S3."
)
HEADER = [
    "mode",
    "tool",
    "best /s",
    "median /s",
    "steady /s",
    "TTFB s",
    "peak RSS MiB",
    "anon MiB",
    "items",
    "setup s",
]
VERSUS = "x webdataset"  # remote runs: the best rate over webdataset's best, same mode and place
LATENCY_HEADER = [
    "mode",
    "tool",
    "{0} /s",
    "{1} /s",
    "{2} /s",
    "{2} / {1}",
    "{2} / {0}",
    "TTFB s: {0} / {1} / {2}",
]


def latency_header(places: list[str]) -> list[str]:
    return [cell.format(*places) for cell in LATENCY_HEADER]


def latency_rows(results: list[Result], places: list[str]) -> list[list[str]]:
    """Per tool and mode: best rates direct, through the proxy, and with the added latency; ratios; median TTFBs."""
    table = []
    for mode in remote_modes(results):
        for tool in TOOLS:
            found = [find(results, tool, mode, place) for place in places]
            if not any(
                r is not None and r.place != LOCAL
                for r in results
                if r.tool == tool and r.mode == mode
            ):
                continue
            if all(r is None for r in found):
                continue  # failed or unsupported: the main table says which

            def ratio(top: Result | None, bottom: Result | None) -> str:
                return "-" if top is None or bottom is None else f"{top.best / bottom.best:.0%}"

            rates = ["-" if r is None else f"{r.best:,.0f}" for r in found]
            ttfbs = " / ".join(
                "-" if r is None or r.ttfb is None else f"{r.ttfb:.2f}" for r in found
            )
            table.append(
                [mode, tool, *rates, ratio(found[2], found[1]), ratio(found[2], found[0]), ttfbs]
            )
    return table


def remote_lines(results: list[Result], places: list[str], uploads: list[Any]) -> list[str]:
    """What the remote tables leave out: the warm second epoch, the servers' CPU time, limitations, uploads."""
    lines = []
    for r in results:
        if r.place == LOCAL or not r.ok:
            continue
        warm = r.values("warm_rate")
        if warm:
            lines.append(
                f"{r.tool}/{r.label}: second epoch from the warm local cache {max(warm):,.0f} samples/s "
                f"(best; the cold first epoch {r.best:,.0f}/s)"
            )
    for r in results:
        if r.place == LOCAL or not r.ok:
            continue
        names = sorted({name for run in r.runs for name in run.get("server_cpu", {})})
        used = {
            name: statistics.median(run["server_cpu"].get(name, 0.0) for run in r.runs)
            for name in names
        }
        busy = ", ".join(
            f"{name} {seconds:.1f}" for name, seconds in used.items() if seconds >= 0.05
        )
        epoch = statistics.median(r.values("seconds"))
        lines.append(
            f"{r.tool}/{r.label}: server CPU s per run (median, whole run incl. setup): {busy or 'none'}; "
            f"epoch {epoch:.2f} s"
        )
    for tool, mode, limitation in dict.fromkeys(
        (r.tool, r.mode, r.unsupported) for r in results if r.unsupported
    ):
        lines.append(f"{tool}/{mode}: {limitation}")
    for u in uploads:
        lines.append(
            f"uploaded {u.prefix}: {u.files} objects, {u.nbytes / 1e6:,.1f} MB in {u.seconds:.1f} s (untimed)"
        )
    return lines


def context_lines(results: list[Result]) -> list[str]:
    """Ratios without a target that explain the targets."""
    lines = []
    loop, fast_loop = find(results, "pillow", "limit"), find(results, "simplejpeg", "limit")
    for ref in (loop, fast_loop):
        if ref is not None:
            together = max(ref.values("parallel_rate"))
            lines.append(
                f"{ref.tool} decode loop: {ref.best:,.0f}/s in 1 process; {cores()} processes at once "
                f"{together:,.0f}/s together ({together / ref.best:.2f}x one, measured, best run)"
            )
    for mode, ref in (("pillow", loop), ("fast", fast_loop)):
        if ref is None:
            continue
        limit, ideal = max(ref.values("parallel_rate")), ref.best * cores()
        for tool in TOOLS:
            r = find(results, tool, mode)
            if r is not None:
                lines.append(
                    f"{tool} {mode}: {r.best / limit:.0%} of its decode limit ({cores()} loops at once: "
                    f"{limit:,.0f}/s; {r.best / ideal:.0%} of {cores()} x one loop's {ref.best:,.0f}/s)"
                )
    wds_fast, ss_fast = find(results, "webdataset", "fast"), find(results, "shardstream", "fast")
    if wds_fast and ss_fast:
        lines.append(
            f"shardstream fast / webdataset fast (both simplejpeg): {ss_fast.best / wds_fast.best:.2f}x"
        )
    memory = find(results, "shardstream", "memory")
    if memory is not None:
        for n, run in enumerate(memory.runs, 1):
            rss = ", ".join(f"{e['rss'] / 2**20:,.0f}" for e in run["epochs"])
            anon = ", ".join(f"{e['anon'] / 2**20:,.0f}" for e in run["epochs"])
            lines.append(f"memory run {n}: RSS after each epoch {rss} MiB (anonymous {anon} MiB)")
    noisy = [
        f"{r.tool}/{r.label} run {n} ({run['other_cores']:.2f})"
        for r in results
        for n, run in enumerate(r.runs, 1)
        if run.get("other_cores", 0.0) > NOISY_CORES
    ]
    if noisy:
        lines.append(
            f"runs during which other processes used > {NOISY_CORES:g} cores: " + ", ".join(noisy)
        )
    for r in results:
        if r.ok and r.runs[0].get("first_batch"):
            lines.append(f"{r.tool}/{r.label} first batch: {r.runs[0]['first_batch']}")
    return lines


def header(results: list[Result]) -> list[str]:
    remote = any(r.place != LOCAL for r in results)
    return [*HEADER[:3], VERSUS, *HEADER[3:]] if remote else HEADER


def rows(results: list[Result]) -> list[list[str]]:
    width = len(header(results))
    versus = width > len(HEADER)
    table = []
    for r in results:
        if not r.ok:
            table.append(
                [
                    r.label,
                    r.tool,
                    "unsupported" if r.unsupported else "failed",
                    *["-"] * (width - 3),
                ]
            )
            continue
        ttfb, steady = r.ttfb, r.steady
        setup = r.values("setup")
        row = [
            r.label,
            r.tool,
            f"{r.best:,.0f}",
            f"{r.median:,.0f}",
            "-" if steady is None else f"{steady:,.0f}",
            "-" if ttfb is None else f"{ttfb:.3f}",
            f"{r.peak_rss / 2**20:,.0f}",
            f"{r.peak_anon / 2**20:,.0f}",
            f"{r.runs[0]['samples']:,}",
            f"{statistics.median(setup):.2f}" if setup else "-",
        ]
        if versus:
            wds = find(results, "webdataset", r.mode, r.place)
            row.insert(3, f"{r.best / wds.best:.2f}x" if wds else "-")
        table.append(row)
    return table


def print_table(results: list[Result]) -> None:
    print_grid([header(results), *rows(results)])


def print_grid(table: list[list[str]]) -> None:
    """Rows under a header: the first two columns left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for n, row in enumerate(table):
        print(
            "  ".join(
                cell.ljust(w) if i < 2 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths))
            )
        )
        if n == 0:
            print("  ".join("-" * w for w in widths))


def markdown_table(table: list[list[str]]) -> list[str]:
    head, *body = table
    return [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---", "---", *["---:"] * (len(head) - 2)]) + "|",
        *("| " + " | ".join(row) + " |" for row in body),
    ]


def markdown(
    images: ImageSet,
    results: list[Result],
    found: list[Target],
    conversions: list[Conversion],
    args: argparse.Namespace,
    info: dict[str, Any],
    remote: dict[str, Any] | None = None,
) -> str:
    if remote is None:
        where = "warm page cache"
    else:
        where = (
            f"read from {remote.get('server', 'a moto S3 server')} on 127.0.0.1 (on the same {info['nproc']} "
            "cores) "
            f"directly (@{remote['places'][0]}), through a proxy process (@{remote['places'][1]}) and through "
            f"a proxy adding {args.latency * 1000:g} ms to every request (@{remote['places'][2]}); every run "
            "starts with empty local caches (cold: TTFB includes the first downloads)"
        )
    lines = [
        f"Reading {images.count:,} JPEGs ({IMAGE_SIZE}x{IMAGE_SIZE}, {images.total_bytes / 1e6:,.0f} MB) for one "
        f"epoch, {WORKERS} DataLoader workers, batches of {BATCH_SIZE}, shuffle on, {where}; best and median "
        f"of {args.repeat} runs, each in a fresh process. Peak RSS: the process tree's, summed (max over runs).",
        "",
        *markdown_table([header(results), *rows(results)]),
    ]
    if remote is not None:
        lines += [
            "",
            *markdown_table(
                [latency_header(remote["places"]), *latency_rows(results, remote["places"])]
            ),
        ]
    lines += ["", "| target | measured | goal | verdict |", "|---|---:|---|---|"]
    lines += [f"| {t.name} | {t.value} | {t.goal} | {t.verdict} |" for t in found]
    lines += ["", *(f"- {line}" for line in context_lines(results))]
    if remote is not None:
        lines += [
            f"- {line}" for line in remote_lines(results, remote["places"], remote["uploads"])
        ]
    lines += ["", "Shuffle: " + "; ".join(f"{k}: {v}" for k, v in SHUFFLES.items()) + "."]
    lines += ["", "Data: " + "; ".join(conversion_lines(conversions)) + "."]
    if remote is not None:
        lines += [
            "",
            "Caveats: " + (SEAWEED_CAVEATS if args.remote == "seaweedfs" else REMOTE_CAVEATS),
        ]
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    lines += [
        "",
        f"Machine: {info['nproc']} cores ({info['cpu']}), {info['memory_gib']} GiB RAM, {info['system']}, "
        f"Python {info['python']}; {versions}; repository commit {info['commit']}; shardstream imported from "
        f"{info['shardstream_path']} (source digest {info['shardstream_digest']}).",
    ]
    return "\n".join(lines)


def to_json(
    images: ImageSet,
    results: list[Result],
    found: list[Target],
    conversions: list[Conversion],
    args: argparse.Namespace,
    info: dict[str, Any],
    remote: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "benchmark": "read",
        "machine": info,
        "dataset": {
            "path": str(images.train),
            "count": images.count,
            "total_bytes": images.total_bytes,
        },
        "settings": {
            "batch_size": BATCH_SIZE,
            "workers": WORKERS,
            "shard_size": SHARD_SIZE,
            "repeat": args.repeat,
            "limit_images": args.limit_images,
            "arrow_rows": args.arrow_rows,
            "arrow_batch": ARROW_BATCH,
            "shuffle": SHUFFLES,
        },
        "conversions": [
            {
                "name": c.name,
                "path": str(c.path),
                "seconds": round(c.seconds, 2),
                "bytes": c.nbytes,
                "files": c.files,
                "reused": c.reused,
                "problem": c.problem,
            }
            for c in conversions
        ],
        "results": [
            {
                "tool": r.tool,
                "mode": r.mode,
                "place": r.place,
                "ok": r.ok,
                "problems": r.problems,
                "unsupported": r.unsupported,
                "best_per_s": round(r.best, 1) if r.runs else None,
                "median_per_s": round(r.median, 1) if r.runs else None,
                "ttfb_median_s": None if r.ttfb is None else round(r.ttfb, 4),
                "steady_best_per_s": None if r.steady is None else round(r.steady, 1),
                "peak_rss_bytes": r.peak_rss if r.runs else None,
                "peak_anon_bytes": r.peak_anon if r.runs else None,
                "runs": r.runs,
            }
            for r in results
        ],
        "targets": [
            {"name": t.name, "goal": t.goal, "measured": t.value, "met": t.met} for t in found
        ],
        "remote": None
        if remote is None
        else {
            "kind": args.remote,
            "added_latency_s": args.latency,
            "places": remote["places"],
            "endpoints": remote["endpoints"],
            "uploads": [
                {
                    "prefix": u.prefix,
                    "files": u.files,
                    "bytes": u.nbytes,
                    "seconds": round(u.seconds, 2),
                }
                for u in remote["uploads"]
            ],
        },
    }
