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

STAGE_COLORS = {"download": "#8c564b", "read": "#1f77b4", "decode": "#ff7f0e", "transform": "#2ca02c",
                "collate": "#9467bd"}
SIZE = (13.0, 4.2)  # inches at 100 dpi: 1300 x 420 pixels, readable at 100%
DPI = 100


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise UsageError("plots need matplotlib: pip install 'shardstream[plot]' (the table and --json do "
                         "not)") from exc
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def bench_figure(result: Mapping[str, Any], path: str) -> None:
    """Write ``shardstream bench``'s result (its JSON) as a PNG at ``path``."""
    plt = _pyplot()
    points = [p for p in result["points"] if p["phase"] != "ideal" and p["samples"] > 0]
    waits = next((p for p in points if p["workers"] == result.get("recommended_workers") and p["data_wait"]), None)
    panels = 3 if waits is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(SIZE[0] if panels == 3 else 9.0, SIZE[1]), dpi=DPI)
    fig.subplots_adjust(wspace=0.3)
    _throughput(axes[0], points, result)
    _stages(axes[1], points)
    if waits is not None:
        _waits(axes[2], waits["data_wait"], f"data wait per step, num_workers={waits['workers']}")
    fig.suptitle(f"shardstream bench: {_short(result['dataset'])}, batch {result['batch_size']}, "
                 f"decode {result['decode']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def data_wait_figure(history: Sequence[tuple[float, float]], path: str, title: str = "data wait per step") -> None:
    """Write a training run's data wait per step (``DeviceLoader.stats().history``) as a PNG at ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, SIZE[1]), dpi=DPI)
    _waits(ax, [w for w, _ in history], title, [c for _, c in history])
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _thousands() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}")


def _short(text: str, most: int = 60) -> str:
    return text if len(text) <= most else "..." + text[-(most - 3):]


def _throughput(ax: Any, points: list[dict[str, Any]], result: Mapping[str, Any]) -> None:
    for phase, style in (("local", "o-"), ("warm", "o-"), ("cold", "s--")):
        mine = sorted((p["workers"], p["samples_per_s"]) for p in points if p["phase"] == phase)
        if mine:
            ax.plot([w for w, _ in mine], [t for _, t in mine], style, label=f"{phase} cache" if phase != "local"
                    else "measured")
    best = result.get("recommended_workers")
    chosen = [p for p in points if p["workers"] == best and p["phase"] in ("local", "warm")]
    if chosen:
        ax.plot([best], [chosen[0]["samples_per_s"]], "*", color="crimson", markersize=16,
                label=f"recommended: num_workers={best}")
    ideal = result.get("ideal")
    top = max((p["samples_per_s"] for p in points), default=0.0)
    if ideal and ideal["samples_per_s"] <= 3 * top:
        ax.axhline(ideal["samples_per_s"], color="gray", linestyle=":", label="ideal (replay from memory)")
    elif ideal:  # a consumer that does nothing: the replay is off the scale
        ax.plot([], [], " ", label=f"ideal: {ideal['samples_per_s']:,.0f} samples/s (off the scale)")
    workers = sorted({p["workers"] for p in points})
    ax.set_xticks(workers)
    ax.set_xlabel("num_workers")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_title("throughput against num_workers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _stages(ax: Any, points: list[dict[str, Any]]) -> None:
    shown = [p for p in points if p["phase"] in ("local", "warm")] or points
    labels = [f"{p['workers']}" + (" cold" if p["phase"] == "cold" else "") for p in shown]
    bottom = [0.0] * len(shown)
    for stage, color in STAGE_COLORS.items():
        values = [100 * p["stages"].get(stage, 0.0) for p in shown]
        if any(values):
            ax.bar(labels, values, bottom=bottom, color=color, label=stage, width=0.6)
            bottom = [b + v for b, v in zip(bottom, values)]
    waits = [100 * p["stages"].get("wait", 0.0) for p in shown]
    ax.plot(labels, waits, "kD", label="main process waiting (% of wall time)")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("share of worker time (%)")
    ax.set_ylim(0, 105)
    ax.set_title("where the time goes, per stage")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)


def _waits(ax: Any, waits: Sequence[float], title: str, computes: Sequence[float] | None = None) -> None:
    steps = range(1, len(waits) + 1)
    ax.plot(steps, [1000 * w for w in waits], lw=1, label="waiting for data")
    if computes is not None:
        ax.plot(steps, [1000 * c for c in computes], lw=1, alpha=0.7, label="computing")
        ax.legend(fontsize=8)
    ax.set_xlabel("training step")
    ax.set_ylabel("time per step (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
