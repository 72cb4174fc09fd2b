"""Jobs (a tool, a mode, a place to read from) and their results: which jobs and conversions a run needs.

Loader jobs run once per tool and mode (and, with ``--remote``, per place); ``limit`` adds the Pillow
and simplejpeg decode loops; ``memory`` and ``arrow`` need shardstream among the tools.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .config import LOADER_MODES, LOCAL
from .tools import DATA_OF


@dataclass
class Job:
    tool: str
    mode: str
    # or one of RemoteS3.places: read from the bucket directly or through a proxy
    place: str = LOCAL

    @property
    def label(self) -> str:
        return f"{self.tool}/{self.mode}" + ("" if self.place == LOCAL else f" @{self.place}")


@dataclass
class Result:
    tool: str
    mode: str
    place: str = LOCAL
    runs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # a known limitation of the tool (litdata and plain-http endpoints), not a failure
    unsupported: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.problems and self.unsupported is None

    @property
    def label(self) -> str:
        """The mode and, for remote runs, where it read from: ``raw`` or ``raw @s3 +50ms``."""
        return self.mode if self.place == LOCAL else f"{self.mode} @{self.place}"

    def medians(self, key: str) -> float | None:
        found = self.values(key)
        return statistics.median(found) if found else None

    def values(self, key: str) -> list[float]:
        return [r[key] for r in self.runs if r.get(key) is not None]

    @property
    def best(self) -> float:
        return max(self.values("rate"))

    @property
    def median(self) -> float:
        return statistics.median(self.values("rate"))

    @property
    def steady(self) -> float | None:
        """Best rate after the first batch: the epoch without the start-up that TTFB measures."""
        found = [
            (r["samples"] - r["first_samples"]) / (r["seconds"] - r["ttfb"])
            for r in self.runs
            if r.get("ttfb") is not None
            and r.get("first_samples") is not None
            and r["seconds"] > r["ttfb"]
        ]
        return max(found) if found else None

    @property
    def ttfb(self) -> float | None:
        found = self.values("ttfb")
        return statistics.median(found) if found else None

    @property
    def peak_rss(self) -> int:
        return max(int(v) for v in self.values("peak_rss"))

    @property
    def peak_anon(self) -> int:
        return max(int(v) for v in self.values("peak_anon"))


def find(results: list[Result], tool: str, mode: str, place: str = LOCAL) -> Result | None:
    """The successful result of ``tool`` in ``mode`` at ``place``, if there is one."""
    for r in results:
        if r.tool == tool and r.mode == mode and r.place == place and r.ok:
            return r
    return None


def jobs_for(tools: list[str], modes: list[str], places: list[str] | None = None) -> list[Job]:
    if places is not None:  # remote: the loader modes at each place
        return [
            Job(tool, mode, place)
            for place in places
            for mode in LOADER_MODES
            if mode in modes
            for tool in tools
        ]
    jobs = [Job(tool, mode) for mode in LOADER_MODES if mode in modes for tool in tools]
    if "limit" in modes:
        jobs += [Job("pillow", "limit"), Job("simplejpeg", "limit")]
    if "memory" in modes and "shardstream" in tools:
        jobs.append(Job("shardstream", "memory"))
    if "arrow" in modes and "shardstream" in tools:
        jobs += [Job("pyarrow", "arrow"), Job("shardstream", "arrow")]
    return jobs


def conversions_for(jobs: list[Job]) -> list[str]:
    names: list[str] = []
    for job in jobs:
        needed = (
            ["table", "arrow"]
            if job.mode == "arrow"
            else []
            if job.mode == "limit"
            else [DATA_OF[job.tool]]
        )
        names += [n for n in needed if n not in names]
    return names
