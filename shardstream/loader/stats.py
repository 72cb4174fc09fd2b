"""Live loader stats: what the input pipeline delivered, and where its time went, in one call.

The workers count with plain integers into a small shared table (see
:mod:`shardstream.dataset.counters`); the loader adds what only the main process knows (the
batches it handed out, the time the training loop was blocked in ``next(loader)``) and sums
it all on demand, so the numbers are always on and cost a few clock reads per batch.
``loader.stats()`` is a :class:`LoaderStats`; :func:`verdict` says in one line whether the
training loop waits for data and which stage to fix. :class:`StepClock` is the training loop's
side (wait for a batch against compute, per step), which ``DeviceLoader.stats()`` reports as
:class:`DeviceStats`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any

from ..errors import UsageError

log = logging.getLogger("shardstream")

STAGES = ("download", "read", "decode", "transform", "collate")
ADVICE = {
    "download": "try a larger prefetch= or more workers; a second epoch reads from the disk cache",
    "read": "try more workers, uncompressed shards, or a local copy of the dataset",
    "decode": "try more workers or the fast decoder (pip install 'shardstream[fast]')",
    "transform": "try more workers, a cheaper transform, or augmentations on the GPU",
    "collate": "try more workers or fewer, larger fields per sample",
    "transfer": "the workers keep up: try fewer, larger batches, or pin_memory=False with the shared-memory ring",
    "copy": "host-to-device copies dominate: keep images uint8 and convert on the GPU (DeviceLoader(dtype=...))",
}
INPUT_BOUND = 0.10  # a training loop waiting this share of its step time for data is input-bound


@dataclasses.dataclass(frozen=True)
class LoaderStats:
    """What a loader delivered and where the time went, summed over its workers since it was made.

    Stage seconds are worker time (they add up over workers, so they can exceed the wall time):
    ``download_s`` is time a reader blocked on a shard still downloading, ``read_s`` opening,
    indexing and reading shards, then ``decode_s``, ``transform_s`` and ``collate_s``.
    ``wait_s`` is the main process's time blocked in ``next(loader)``; ``elapsed_s`` the wall
    time of its passes (first request to last batch), so ``wait_s / elapsed_s`` is the share of
    the training loop's time spent waiting for data.
    """

    samples: int = 0
    batches: int = 0
    samples_read: int = 0
    storage_bytes: int = 0
    cache_bytes: int = 0
    cache_hits: int = 0
    cache_misses: int = 0
    download_s: float = 0.0
    transfer_s: float = 0.0
    read_s: float = 0.0
    decode_s: float = 0.0
    transform_s: float = 0.0
    collate_s: float = 0.0
    skipped: int = 0
    last_skip: str | None = None
    wait_s: float = 0.0
    elapsed_s: float = 0.0

    def stage_seconds(self) -> dict[str, float]:
        """Worker seconds per stage (see :data:`STAGES`)."""
        return {stage: getattr(self, f"{stage}_s") for stage in STAGES}

    def stage_shares(self) -> dict[str, float]:
        """Each stage's share of the workers' measured time (0 to 1; all 0 before any batch)."""
        seconds = self.stage_seconds()
        total = sum(seconds.values())
        return {stage: (s / total if total > 0 else 0.0) for stage, s in seconds.items()}

    @property
    def dominant_stage(self) -> str | None:
        """The stage that took the most worker time, or None before any was measured."""
        seconds = self.stage_seconds()
        stage = max(seconds, key=seconds.__getitem__)
        return stage if seconds[stage] > 0 else None

    @property
    def data_wait_fraction(self) -> float:
        """The share of the training loop's wall time spent blocked in ``next(loader)``."""
        return self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def verdict(self) -> str:
        """One line: input-bound or not, and which stage to fix (see :func:`verdict`)."""
        return verdict(self.data_wait_fraction, self.stage_seconds(), self.batches)

    def as_dict(self) -> dict[str, Any]:
        """Every field, plus ``data_wait_fraction``, ``samples_per_s`` and ``dominant_stage``."""
        return {
            **dataclasses.asdict(self),
            "data_wait_fraction": self.data_wait_fraction,
            "samples_per_s": self.samples_per_s,
            "dominant_stage": self.dominant_stage,
        }

    def scalars(self) -> dict[str, float]:
        """The numeric fields, as TensorBoard's ``add_scalars``, ``wandb.log`` or Lightning's ``log_dict`` take them."""
        return {k: float(v) for k, v in self.as_dict().items() if isinstance(v, (int, float))}


def verdict(
    wait_fraction: float, stage_seconds: Mapping[str, float], steps: int, copy_s: float = 0.0
) -> str:
    """ "input-bound: 38% of step time waiting for data; decode dominates; try more workers or the fast
    decoder", or that the loop is compute-bound; ``copy_s``: host-to-device copy time, a stage too."""
    if steps == 0:
        return "no batches yet"
    stages = {k: v for k, v in stage_seconds.items() if v > 0}
    stage = max(stages, key=stages.__getitem__) if stages else None
    share = f"{wait_fraction:.0%} of step time waiting for data"
    if wait_fraction < INPUT_BOUND:
        return f"compute-bound: {share}; the input pipeline keeps up"
    if copy_s > sum(stages.values()):
        return f"input-bound: {share}; host-to-device copies dominate; {ADVICE['copy'].split(': ', 1)[1]}"
    if stage is None:
        return f"input-bound: {share}; {ADVICE['transfer']}"
    return f"input-bound: {share}; {stage} dominates; {ADVICE[stage]}"


Callback = Callable[[dict[str, float]], Any]


class StatsRecorder:
    """The main process's side of a loader's stats: batches handed out, time blocked, and the
    periodic report. ``counters`` is the dataset's shared table, ``dataset`` gives skips and names."""

    def __init__(self, dataset: Any):
        self.dataset = dataset
        self.counters = dataset.counters  # the dataset stage's table (shardstream.dataset.counters)
        self.samples = self.batches = 0
        self.wait_ns = self.elapsed_ns = 0
        self._mark: int | None = None  # when the last batch was handed out (or the pass began)
        self._resumed = 0  # when the training loop last asked for a batch
        self._every = 0
        self._callback: Callback | None = None

    def begin(self) -> None:
        """A pass starts: its elapsed time, and the wait for its first batch, count from now."""
        self._mark = self._resumed = perf_counter_ns()

    def resumed(self) -> None:
        """The training loop asks for the next batch."""
        self._resumed = perf_counter_ns()

    def delivered(self, samples: int) -> None:
        """A batch of ``samples`` is handed out."""
        now = perf_counter_ns()
        self.wait_ns += now - self._resumed
        if self._mark is not None:
            self.elapsed_ns += now - self._mark
        self._mark = now
        self.samples += samples
        self.batches += 1
        if self._every and self.batches % self._every == 0:
            self.report()

    def report_every(self, every: int, callback: Callback | None) -> None:
        if every < 0:
            raise UsageError(f"every must be 0 (off) or more, not {every}")
        self._every, self._callback = int(every), callback

    def report(self) -> None:
        stats = self.stats()
        if self._callback is not None:
            self._callback(stats.scalars())
        else:
            log.info(
                "shardstream: %s batches, %.0f samples/s, %s",
                f"{stats.batches:,}",
                stats.samples_per_s,
                stats.verdict(),
            )

    def stats(self) -> LoaderStats:
        t = self.counters.totals()
        ds = self.dataset
        hits = max(t["opened"] - t["downloads"], 0)
        last = None
        if t["skip_shard"] >= 0:
            last = ds.describe(t["skip_shard"], t["skip_sample"])
        return LoaderStats(
            samples=self.samples,
            batches=self.batches,
            samples_read=t["samples"],
            storage_bytes=t["downloaded_bytes"] + t["local_bytes"],
            cache_bytes=max(t["opened_bytes"] - t["downloaded_bytes"], 0),
            cache_hits=hits,
            cache_misses=t["downloads"],
            download_s=t["wait_ns"] / 1e9,
            transfer_s=t["download_ns"] / 1e9,
            read_s=t["read_ns"] / 1e9,
            decode_s=t["decode_ns"] / 1e9,
            transform_s=t["transform_ns"] / 1e9,
            collate_s=t["collate_ns"] / 1e9,
            skipped=ds.skipped,
            last_skip=last,
            wait_s=self.wait_ns / 1e9,
            elapsed_s=self.elapsed_ns / 1e9,
        )


class StepClock:
    """The training loop's clock: time waiting for a batch (from asking to getting it) and time computing
    (from getting it to asking for the next), per step and in total; plain ints, a few clock reads a step."""

    def __init__(self, keep: int = 100_000):
        self.steps = self.wait_ns = self.compute_ns = self.copy_ns = self.h2d_bytes = 0
        # (wait, compute)
        self.history: collections.deque[tuple[int, int]] = collections.deque(maxlen=keep)
        self.every = 0
        self.report: Callable[[], None] | None = None
        self._asked = self._wait = 0
        self._handed: int | None = None

    def begin(self) -> None:
        self._asked, self._handed = perf_counter_ns(), None  # the time between passes is neither

    def handed(self) -> None:
        now = perf_counter_ns()
        self._wait = now - self._asked
        self.wait_ns += self._wait
        self.steps += 1
        self._handed = now
        # its compute time once the loop asks for the next batch
        self.history.append((self._wait, 0))
        if self.every and self.report is not None and self.steps % self.every == 0:
            self.report()

    def asked(self) -> None:
        now = perf_counter_ns()
        if self._handed is not None:
            compute = now - self._handed
            self.compute_ns += compute
            self.history[-1] = (self._wait, compute)
        self._asked = now


@dataclasses.dataclass(frozen=True)
class DeviceStats:
    """A ``DeviceLoader``'s numbers: the training loop's wait for data against its compute.

    ``wait_s``: time the loop was blocked getting a batch; ``compute_s``: time between getting a batch
    and asking for the next (its step; with CUDA, up to the loop's own synchronisation); ``copy_s`` and
    ``h2d_bytes``: the host-to-device copies (GPU time on the side stream); ``history``: per step,
    (wait, compute) seconds, the last 100,000; ``loader``: the wrapped ShardLoader's stats, if it is one.
    """

    loader: LoaderStats | None
    steps: int
    wait_s: float
    compute_s: float
    copy_s: float
    h2d_bytes: int
    history: list[tuple[float, float]]

    @property
    def data_wait_fraction(self) -> float:
        """The share of step time (wait + compute) spent waiting for data."""
        total = self.wait_s + self.compute_s
        return self.wait_s / total if total > 0 else 0.0

    def verdict(self) -> str:
        """ "input-bound: 38% of step time waiting for data; decode dominates; try more workers or ..."."""
        stages = self.loader.stage_seconds() if self.loader is not None else {}
        return verdict(self.data_wait_fraction, stages, self.steps, self.copy_s)

    def as_dict(self) -> dict[str, Any]:
        """The loader's fields, then these (``history`` left out), ``data_wait_fraction`` and ``verdict``."""
        own = {
            "steps": self.steps,
            "step_wait_s": self.wait_s,
            "step_compute_s": self.compute_s,
            "h2d_copy_s": self.copy_s,
            "h2d_bytes": self.h2d_bytes,
            "data_wait_fraction": self.data_wait_fraction,
        }
        inner = self.loader.as_dict() if self.loader is not None else {}
        inner.pop("data_wait_fraction", None)
        return {**inner, **own, "verdict": self.verdict()}

    def scalars(self) -> dict[str, float]:
        """The numeric values of :meth:`as_dict`, for TensorBoard, W&B or Lightning."""
        return {k: float(v) for k, v in self.as_dict().items() if isinstance(v, (int, float))}


def report(stats: DeviceStats, callback: Callback | None) -> None:
    """Pass ``stats.scalars()`` to ``callback``, or log a line with the verdict."""
    if callback is not None:
        callback(stats.scalars())
    else:
        log.info("shardstream: step %s: %s", f"{stats.steps:,}", stats.verdict())
