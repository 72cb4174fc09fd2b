"""``shardstream bench``: throughput per ``num_workers``, where the time goes, and which count to use."""

from __future__ import annotations

import dataclasses
import sys
import textwrap
from typing import Any

import click

from ..host import usable_cores
from ..sizes import parse_size
from . import bench_run
from .common import (
    cli,
    dataset_version_option,
    open_dataset,
    safe,
    safe_json,
    storage_option,
    storage_options_for,
    trusted_roots_for,
)

STAGE_COLUMNS = ("download", "read", "decode", "transform", "collate")


def _workers(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 0 for c in counts):
        raise click.BadParameter(f"{value!r} is not a list of worker counts such as 1,2,4,8")
    return sorted(set(counts))


@cli.command()
@click.argument("dataset")
@click.option(
    "--workers",
    callback=_workers,
    default=None,
    metavar="N,N,...",
    help="Worker counts to measure [default: 1, 2, 4, ... up to the CPU cores].",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--decode",
    type=click.Choice(list(bench_run.DECODE)),
    default="torch",
    show_default=True,
    help="none: stored bytes; fast: torch with simplejpeg (the fast extra).",
)
@click.option("--samples", type=click.IntRange(min=1), default=None, help="Samples per point.")
@click.option(
    "--seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds per point [default: 10, unless --samples is given].",
)
@click.option("--prefetch", default=None, help="Bytes each worker downloads ahead, e.g. 512MB.")
@click.option(
    "--device", default=None, help="Consume through a DeviceLoader on this device (cuda, cpu)."
)
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0),
    default=0.0,
    help="A simulated training step per batch, in ms (for the data-wait share).",
)
@click.option(
    "--ideal",
    is_flag=True,
    help="Also serve the batches from memory through the same --step-ms or --device: the throughput a "
    "perfect loader reaches (without either there is nothing to compare, and it is not measured).",
)
@click.option(
    "--plot",
    "plot_path",
    default=None,
    metavar="FILE.png",
    help="Write the plots (the plot extra).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
@dataset_version_option
@storage_option
def bench(  # noqa: PLR0913 - one per option
    dataset: str,
    workers: list[int] | None,
    batch_size: int,
    decode: str,
    samples: int | None,
    seconds: float | None,
    prefetch: str | None,
    device: str | None,
    step_ms: float,
    ideal: bool,
    plot_path: str | None,
    as_json: bool,
    quiet: bool,
    storage_options: tuple[str, ...],
) -> None:
    """Measure reading DATASET with each worker count and recommend num_workers.

    Each count gets a fresh loader. Remote datasets are read twice per count: from an empty disk
    cache, then from the cache. Ctrl-C stops with what was measured so far.
    """
    bench_run.check_decode(decode)
    if plot_path is not None:
        from .plots import pyplot

        pyplot()  # before measuring: a missing extra is said at once
    store, manifest = open_dataset(dataset, storage_options)
    options = storage_options_for(storage_options, dataset)
    settings = bench_run.Settings(
        version=manifest.version,
        batch_size=batch_size,
        decode=decode,
        samples=samples,
        seconds=seconds if seconds is not None or samples is not None else 10.0,
        prefetch=parse_size(prefetch, "--prefetch") if prefetch is not None else None,
        storage_options=options or None,
        trusted_roots=trusted_roots_for(storage_options) or None,
        device=device,
        step_ms=step_ms,
    )
    counts = workers if workers is not None else bench_run.default_workers()
    no_ideal = bench_run.why_no_ideal(settings) if ideal else None
    progress = None if quiet or as_json or not sys.stderr.isatty() else _bar(samples)
    points = bench_run.sweep(dataset, counts, settings, remote=not store.local, progress=progress)
    interrupted = any(p.interrupted for p in points)
    baseline = (
        bench_run.replay(dataset, settings)
        if ideal and no_ideal is None and not interrupted
        else None
    )
    result = {
        "dataset_samples": manifest.num_samples,  # one epoch's samples (a split part's own)
        "decoders": bench_run.decoders((f["name"] for f in manifest.fields), decode),
        **summary(dataset, settings, points, baseline, interrupted, no_ideal),
    }
    if plot_path is not None and any(p["samples"] for p in result["points"]):
        from .plots import bench_figure

        bench_figure(result, plot_path)
    if as_json:
        click.echo(safe_json(result, indent=2))
    else:
        click.echo(table(result))
        if plot_path is not None:
            click.echo(f"plot: {safe(plot_path)}")
    if interrupted:
        sys.exit(130)


def _bar(samples: int | None) -> Any:
    from tqdm import tqdm

    return lambda label: tqdm(
        total=samples, desc=label, unit=" samples", unit_scale=True, leave=False, file=sys.stderr
    )


def summary(
    dataset: str,
    settings: bench_run.Settings,
    points: list[bench_run.Point],
    baseline: bench_run.Point | None,
    interrupted: bool,
    no_ideal: str | None = None,
) -> dict[str, Any]:
    """The documented JSON: settings, every point, the recommendation and the headroom to the ideal
    (``ideal_skipped``: why ``--ideal`` was not measured)."""
    measured = {
        p.workers: p.samples_per_s
        for p in points
        if p.phase in ("local", "warm") and p.samples and not p.interrupted
    }
    best = max(measured.values(), default=0.0)
    return {
        "dataset": dataset,
        "batch_size": settings.batch_size,
        "decode": settings.decode,
        "samples_per_point": settings.samples,
        "seconds_per_point": settings.seconds,
        "device": settings.device,
        "step_ms": settings.step_ms,
        "cores": usable_cores(),
        "points": [dataclasses.asdict(p) for p in points],
        "recommended_workers": bench_run.recommend(measured),
        "best_samples_per_s": best,
        "ideal": dataclasses.asdict(baseline) if baseline is not None else None,
        "headroom": baseline.samples_per_s / best if baseline is not None and best > 0 else None,
        "ideal_skipped": no_ideal,
        "interrupted": interrupted,
    }


def table(result: dict[str, Any]) -> str:
    """The result as a table, the recommendation and, with --ideal, the headroom."""
    head = (
        f"{'workers':>7} {'cache':>5} {'samples/s':>10} {'MB/s':>8} {'1st batch':>9} "
        + " ".join(f"{s:>9}" for s in STAGE_COLUMNS)
        + f" {'wait':>5} {'peak RSS':>9}"
    )
    lines = [head]
    for p in result["points"]:
        shares = " ".join(f"{100 * p['stages'].get(s, 0.0):>8.0f}%" for s in STAGE_COLUMNS)
        cache = {"local": "-"}.get(p["phase"], p["phase"])
        lines.append(
            f"{p['workers']:>7} {cache:>5} {p['samples_per_s']:>10,.0f} {p['mb_per_s']:>8.1f} "
            f"{p['first_batch_s']:>8.2f}s {shares} {100 * p['stages'].get('wait', 0.0):>4.0f}% "
            f"{p['peak_rss_mb']:>6,.0f} MB" + ("  (interrupted)" if p["interrupted"] else "")
        )
    lines += legend(result)
    if result.get("decoders"):
        used = ", ".join(f"{name}: {lib}" for name, lib in result["decoders"].items())
        lines.append(f"decoders: {used}")
    best = result["recommended_workers"]
    if best is not None:
        lines.append(
            f"recommended: num_workers={best} (the fewest within 5% of the best, "
            f"{result['best_samples_per_s']:,.0f} samples/s)"
        )
    ideal = result["ideal"]
    if ideal is not None and result["headroom"] is not None:
        lines.append(
            f"ideal (the same batches from memory, through {_consumer(result)}): "
            f"{ideal['samples_per_s']:,.0f} samples/s, {result['headroom']:.1f}x the best measured"
        )
    elif result.get("ideal_skipped"):
        lines += _note("ideal:", result["ideal_skipped"])
    if result["interrupted"]:
        lines.append("interrupted: the points above are what was measured")
    return "\n".join(safe(line) for line in lines)


def _consumer(result: dict[str, Any]) -> str:
    """What took the batches: "a 50 ms step and copies to cuda"; "" for nothing (and for the CPU, where a
    DeviceLoader copies nothing)."""
    device = result.get("device")
    parts = [
        f"a {result['step_ms']:g} ms step" if result.get("step_ms") else "",
        f"copies to {device}" if device and not str(device).startswith("cpu") else "",
    ]
    return " and ".join(p for p in parts if p)


def _note(head: str, text: str) -> list[str]:
    """``text`` after ``head``, wrapped to the table's width."""
    return textwrap.wrap(
        text,
        width=112,
        initial_indent=f"{head:<8}",
        subsequent_indent=" " * 8,
        break_on_hyphens=False,
    )


def legend(result: dict[str, Any]) -> list[str]:
    """What the stage and wait columns mean for this run. With nothing to do between batches, the main
    process waits nearly all the time whatever the loader does, so the wait line says so when there was no step."""
    stages = (
        "shares of the workers' time (with 0 workers: of the main process, which then reads itself)"
    )
    if result.get("step_ms"):
        wait = (
            f"share of the main process's time spent waiting for the next batch, beside {_consumer(result)} "
            "per batch: what a training loop with that step would lose to data (0%: the loader keeps up)"
        )
    else:
        wait = (
            "share of the main process's time spent waiting for the next batch; with nothing else to do (no "
            "--step-ms) it is near 100% whatever the loader does: give --step-ms your training step's time "
            "to see what that step would lose to data"
        )
    return [*_note("stages:", stages), *_note("wait:", wait)]
