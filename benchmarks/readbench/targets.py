"""The issue's targets, printed as met or missed (never asserted: this is a benchmark, not a test).

Local, shardstream with default settings (its "shardstream" row): raw bytes >= 100,000 samples/s (median
of the runs) and >= 5x the fastest of the others; Pillow and simplejpeg decode >= 95% of the decode limit
measured in the same run (one decode loop per core, all at once; median) and >= 1.5x webdataset (Pillow);
simplejpeg >= 2.5x webdataset (Pillow); TTFB <= 0.15 s (2 workers; <= 0.05 s in the main process);
no memory growth over 3 epochs; Arrow batches within 2x of pyarrow's own read. Remote (issue 4, item 6):
raw bytes from S3 >= 3x webdataset; TTFB <= 1 s from a cold cache; with the added latency, >= 80% of the
rate without.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import LOADER_MODES, LOCAL, MEMORY_EPOCHS
from .jobs import Result, find
from .procfs import cores

PEERS = ("webdataset", "mosaic", "litdata")  # shardstream's own rows are not others
RAW_RATE_TARGET = 100_000.0
RAW_VS_OTHERS_TARGET = 5.0
PILLOW_VS_LIMIT_TARGET = 0.95  # of the cores' measured decode rate, both decoders
PILLOW_VS_WDS_TARGET = 1.5
FAST_VS_WDS_PILLOW_TARGET = 2.5
TTFB_TARGET = 0.15
ARROW_VS_PYARROW_TARGET = 2.0
# RSS after the last epoch at most 5% above the first's counts as "no growth"
MEMORY_GROWTH_LIMIT = 0.05
# ...and for --remote s3 (issue 4, item 6).
REMOTE_RAW_VS_WDS_TARGET = 3.0
REMOTE_TTFB_TARGET = 1.0
LATENCY_RATIO_TARGET = 0.8  # throughput with the added latency / without


@dataclass
class Target:
    name: str
    goal: str
    value: str
    met: bool | None  # None: not measured (a tool or mode left out, or a run failed)

    @property
    def verdict(self) -> str:
        return "n/a" if self.met is None else "met" if self.met else "MISSED"


def ratio_target(
    name: str, goal: str, top: Result | None, bottom: float | None, target: float, what: str
) -> Target:
    if top is None or not bottom:
        return Target(name, goal, "n/a", None)
    value = top.best / bottom
    return Target(name, goal, f"{value:.2f}x ({what})", value >= target)


def targets(results: list[Result]) -> list[Target]:
    out: list[Target] = []
    raw = find(results, "shardstream", "raw")
    out.append(
        Target(
            "raw bytes",
            f">= {RAW_RATE_TARGET:,.0f} samples/s",
            f"{raw.best:,.0f} samples/s" if raw else "n/a",
            None if raw is None else raw.best >= RAW_RATE_TARGET,
        )
    )
    others = [r for tool in PEERS if (r := find(results, tool, "raw")) is not None]
    fastest = max(others, key=lambda r: r.best) if others else None
    out.append(
        ratio_target(
            "raw bytes vs others",
            f">= {RAW_VS_OTHERS_TARGET:g}x the fastest of webdataset/mosaic/litdata",
            raw,
            fastest.best if fastest else None,
            RAW_VS_OTHERS_TARGET,
            f"vs {fastest.tool}" if fastest else "",
        )
    )
    pillow = find(results, "shardstream", "pillow")
    for mode, decoder in (("pillow", "pillow"), ("fast", "simplejpeg")):
        loop = find(results, decoder, "limit")
        limit = max(loop.values("parallel_rate")) if loop else None
        out.append(
            ratio_target(
                f"{decoder} decode vs decode limit",
                f">= {PILLOW_VS_LIMIT_TARGET:.0%} of {cores()} {decoder} loops at once",
                find(results, "shardstream", mode),
                limit,
                PILLOW_VS_LIMIT_TARGET,
                f"limit {limit:,.0f}/s" if limit else "",
            )
        )
    wds_pillow = find(results, "webdataset", "pillow")
    out.append(
        ratio_target(
            "Pillow decode vs webdataset",
            f">= {PILLOW_VS_WDS_TARGET:g}x webdataset (Pillow)",
            pillow,
            wds_pillow.best if wds_pillow else None,
            PILLOW_VS_WDS_TARGET,
            "both Pillow",
        )
    )
    out.append(
        ratio_target(
            "fast decoder vs webdataset",
            f">= {FAST_VS_WDS_PILLOW_TARGET:g}x webdataset (Pillow)",
            find(results, "shardstream", "fast"),
            wds_pillow.best if wds_pillow else None,
            FAST_VS_WDS_PILLOW_TARGET,
            "simplejpeg vs Pillow",
        )
    )
    for mode in LOADER_MODES:
        r = find(results, "shardstream", mode)
        ttfb = r.ttfb if r else None
        out.append(
            Target(
                f"TTFB ({mode})",
                f"<= {TTFB_TARGET:g} s (median)",
                "n/a" if ttfb is None else f"{ttfb:.3f} s",
                None if ttfb is None else ttfb <= TTFB_TARGET,
            )
        )
    memory = find(results, "shardstream", "memory")
    if memory is None:
        out.append(Target("memory over 3 epochs", "no growth", "n/a", None))
    else:
        growth = max(memory_growth(run) for run in memory.runs)
        out.append(
            Target(
                "memory over 3 epochs",
                f"no growth (RSS after epoch {MEMORY_EPOCHS} <= epoch 1 "
                f"+ {MEMORY_GROWTH_LIMIT:.0%})",
                f"{growth:+.1%} (worst run)",
                growth <= MEMORY_GROWTH_LIMIT,
            )
        )
    ours, theirs = find(results, "shardstream", "arrow"), find(results, "pyarrow", "arrow")
    if ours is None or theirs is None:
        out.append(
            Target("Arrow batches vs pyarrow", f"within {ARROW_VS_PYARROW_TARGET:g}x", "n/a", None)
        )
    else:
        slower = theirs.best / ours.best
        out.append(
            Target(
                "Arrow batches vs pyarrow",
                f"within {ARROW_VS_PYARROW_TARGET:g}x of pyarrow's own read",
                f"{slower:,.1f}x slower",
                slower <= ARROW_VS_PYARROW_TARGET,
            )
        )
    return out


def memory_growth(run: dict[str, Any]) -> float:
    epochs = run["epochs"]
    return epochs[-1]["rss"] / epochs[0]["rss"] - 1


def remote_modes(results: list[Result]) -> list[str]:
    return [m for m in LOADER_MODES if any(r.mode == m and r.place != LOCAL for r in results)]


def remote_targets(results: list[Result], places: list[str]) -> list[Target]:
    """Issue 4, item 6: raw bytes from S3 vs webdataset, TTFB from a cold cache, and the cost of added latency.

    ``places``: direct, through the proxy, through the proxy with the added latency. The latency
    ratio compares the last two, so that only the latency differs (the proxy's own cost is the
    same on both sides); the table also shows it against direct reads.
    """
    direct, proxied, slowed = places
    out: list[Target] = []
    raw, wds = (
        find(results, "shardstream", "raw", direct),
        find(results, "webdataset", "raw", direct),
    )
    out.append(
        ratio_target(
            f"raw bytes @{direct} vs webdataset",
            f">= {REMOTE_RAW_VS_WDS_TARGET:g}x webdataset (fsspec opener)",
            raw,
            wds.best if wds else None,
            REMOTE_RAW_VS_WDS_TARGET,
            f"{raw.best:,.0f} vs {wds.best:,.0f} samples/s" if raw and wds else "",
        )
    )
    for mode in remote_modes(results):
        r = find(results, "shardstream", mode, direct)
        ttfb = r.ttfb if r else None
        out.append(
            Target(
                f"TTFB ({mode} @{direct}, cold cache)",
                f"<= {REMOTE_TTFB_TARGET:g} s (median)",
                "n/a" if ttfb is None else f"{ttfb:.3f} s",
                None if ttfb is None else ttfb <= REMOTE_TTFB_TARGET,
            )
        )
    for mode in remote_modes(results):
        slow, base = (
            find(results, "shardstream", mode, slowed),
            find(results, "shardstream", mode, proxied),
        )
        name = f"{mode} @{slowed} vs @{proxied}"
        goal = f">= {LATENCY_RATIO_TARGET:.0%} of the rate without the added latency"
        if slow is None or base is None:
            out.append(Target(name, goal, "n/a", None))
            continue
        ratio = slow.best / base.best
        out.append(
            Target(
                name,
                goal,
                f"{ratio:.0%} ({slow.best:,.0f} vs {base.best:,.0f} samples/s)",
                ratio >= LATENCY_RATIO_TARGET,
            )
        )
    return out


def target_lines(found: list[Target]) -> list[str]:
    return [f"{t.name}: {t.value}; target {t.goal}: {t.verdict}" for t in found]
