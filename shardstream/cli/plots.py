"""Pictures of ``shardstream bench`` results and of a training run's data wait (matplotlib, the ``plot`` extra).

:func:`bench_figure` draws throughput against ``num_workers`` (the recommendation marked, the
replay baseline as a line), where the workers' time goes per stage, and, for runs through a
``DeviceLoader``, the data wait per step; :func:`data_wait_figure` draws the last one from a
training run's ``DeviceLoader.stats()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import UsageError

STAGE_COLORS = {
    "download": "#8c564b",
    "read": "#1f77b4",
    "decode": "#ff7f0e",
    "transform": "#2ca02c",
    "collate": "#9467bd",
}
SIZE = (13.0, 4.2)  # inches at 100 dpi: 1300 x 420 pixels, readable at 100%
DPI = 100


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only), or a one-line error naming the extra."""
    try:
        import matplotlib
    except ImportError as exc:
        raise UsageError(
            "plots need matplotlib: pip install 'shardstream[plot]' (the table and --json do not)"
        ) from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def bench_figure(result: Mapping[str, Any], path: str) -> None:
    """Write ``shardstream bench``'s result (its JSON) as a PNG at ``path``."""
    plt = pyplot()
    fig = _bench(plt, result)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _bench(plt: Any, result: Mapping[str, Any]) -> Any:
    """The figure: throughput, the stages with the main process's wait on its own axes below them, and
    with a device, the data wait per step."""
    points = [p for p in result["points"] if p["phase"] != "ideal" and p["samples"] > 0]
    waits = next(
        (p for p in points if p["workers"] == result.get("recommended_workers") and p["data_wait"]),
        None,
    )
    panels = 3 if waits is not None else 2
    fig = plt.figure(
        figsize=(SIZE[0] if panels == 3 else 9.0, SIZE[1]), dpi=DPI, layout="constrained"
    )
    grid = fig.add_gridspec(2, panels, height_ratios=[3, 1])
    _throughput(fig.add_subplot(grid[:, 0]), points, result)
    stages = fig.add_subplot(grid[0, 1])
    _stages(stages, fig.add_subplot(grid[1, 1], sharex=stages), points)
    if waits is not None:
        _waits(
            fig.add_subplot(grid[:, 2]),
            waits["data_wait"],
            f"data wait per step, num_workers={waits['workers']}",
            step_ms=result.get("step_ms") or None,
        )
    fig.suptitle(
        f"shardstream bench: {_short(result['dataset'])}, batch {result['batch_size']}, "
        f"decode {result['decode']}",
        fontsize=11,
    )
    return fig


def data_wait_figure(
    history: Sequence[tuple[float, float]], path: str, title: str = "data wait and compute per step"
) -> None:
    """Write a training run's data wait per step (``DeviceLoader.stats().history``) as a PNG at ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, SIZE[1]), dpi=DPI)
    _waits(ax, [w for w, _ in history], title, [c for _, c in history])
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _thousands() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}")


def _short(text: str, most: int = 60) -> str:
    return text if len(text) <= most else "..." + text[-(most - 3) :]


def _throughput(ax: Any, points: list[dict[str, Any]], result: Mapping[str, Any]) -> None:
    top = max((p["samples_per_s"] for p in points), default=0.0)
    for phase, style in (("local", "o-"), ("warm", "o-"), ("cold", "s--")):
        mine = sorted((p["workers"], p["samples_per_s"]) for p in points if p["phase"] == phase)
        if mine:
            ax.plot(
                [w for w, _ in mine],
                [t for _, t in mine],
                style,
                label=f"{phase} cache" if phase != "local" else "measured",
            )
    best = result.get("recommended_workers")
    chosen = [p for p in points if p["workers"] == best and p["phase"] in ("local", "warm")]
    if chosen:
        ax.plot(
            [best],
            [chosen[0]["samples_per_s"]],
            "*",
            color="crimson",
            markersize=16,
            zorder=3,
            label=f"recommended: num_workers={best}",
        )
    ideal = result.get("ideal")
    if ideal and ideal["samples_per_s"] <= 3 * top:
        ax.axhline(
            ideal["samples_per_s"],
            color="gray",
            linestyle=":",
            label="ideal (same step, batches from memory)",
        )
        top = max(top, ideal["samples_per_s"])
    elif ideal:  # still far above what was measured: named, not drawn
        ax.plot(
            [], [], " ", label=f"ideal: {ideal['samples_per_s']:,.0f} samples/s (off the scale)"
        )
    workers = sorted({p["workers"] for p in points})
    ax.set_xticks(workers)
    if workers:  # room around the end points, so that no marker is cut by the frame
        pad = max(0.06 * (workers[-1] - workers[0]), 0.3)
        ax.set_xlim(workers[0] - pad, workers[-1] + pad)
    ax.set_ylim(0, 1.15 * top if top > 0 else 1.0)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("throughput (samples/s)")
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_title("throughput against num_workers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _stages(ax: Any, below: Any, points: list[dict[str, Any]]) -> None:
    """Stacked shares of the workers' time on ``ax``; the main process's wait, a share of its own wall time,
    as bars of their own on ``below`` (another quantity, on another scale)."""
    shown = [p for p in points if p["phase"] in ("local", "warm")] or points
    labels = [f"{p['workers']}" + (" cold" if p["phase"] == "cold" else "") for p in shown]
    bottom = [0.0] * len(shown)
    for stage, color in STAGE_COLORS.items():
        values = [100 * p["stages"].get(stage, 0.0) for p in shown]
        if any(values):
            ax.bar(labels, values, bottom=bottom, color=color, label=stage, width=0.6)
            bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("share of worker time (%)")
    ax.set_ylim(0, 128)  # the stages' legend above the bars, which reach 100
    ax.set_yticks(range(0, 101, 20))
    ax.set_title("where the workers' time goes, per stage")
    ax.tick_params(labelbottom=False)
    ax.legend(
        fontsize=8, loc="upper center", ncol=5, frameon=False, handlelength=1.2, columnspacing=1.0
    )
    waits = [100 * p["stages"].get("wait", 0.0) for p in shown]
    bars = below.bar(labels, waits, color="0.45", width=0.6)
    below.bar_label(bars, fmt="%.0f%%", fontsize=7, padding=1)
    below.set_ylim(0, 135)
    below.set_yticks([0, 100])
    below.set_ylabel("main process\nwaiting (%)", fontsize=8)
    below.set_xlabel("num_workers")


def _waits(
    ax: Any,
    waits: Sequence[float],
    title: str,
    computes: Sequence[float] | None = None,
    step_ms: float | None = None,
) -> None:
    """Data wait per step (and the compute beside it, from a training run); the axis names what is drawn."""
    steps = range(1, len(waits) + 1)
    ax.plot(steps, [1000 * w for w in waits], lw=1, label="waiting for data")
    if computes is not None:
        ax.plot(steps, [1000 * c for c in computes], lw=1, alpha=0.7, label="computing")
    if step_ms:
        ax.axhline(step_ms, color="gray", linestyle=":", label=f"the step (--step-ms {step_ms:g})")
    if computes is not None or step_ms:
        ax.legend(fontsize=8)
    ax.set_xlabel("training step")
    ax.set_ylabel("time per step (ms)" if computes is not None else "data wait per step (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
