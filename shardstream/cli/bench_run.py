"""What ``shardstream bench`` measures: one pass per worker count, each in a fresh loader.

Each point reads the dataset (epoch 0 from its start, so every point reads the same samples)
until a sample count or a time is reached, and keeps its throughput, time to the first batch,
the loader's stage times (:meth:`ShardLoader.stats`) and the peak memory of the loader's
processes. Remote datasets get two passes per point: from an empty disk cache (cold) and
again from the cache it filled (warm). :func:`recommend` picks ``num_workers``; :func:`replay`
serves batches from memory, the throughput a perfect loader would reach (``--ideal``), which
means something only when the batches go somewhere: a training step or a device (:func:`why_no_ideal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.util
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch: imported when a point is measured, not with the command line
    from ..dataset import ShardDataset
from ..errors import UsageError
from ..host import usable_cores
from ..sizes import count
from ..storage import StorageSettings

DECODE = {"none": None, "pil": "pil", "torch": "torch", "fast": "torch"}


@dataclasses.dataclass
class Point:
    """One pass: ``phase`` is ``"local"``, ``"cold"`` or ``"warm"`` (a remote dataset's disk cache), or ``"ideal"``."""

    workers: int
    phase: str
    samples: int = 0
    seconds: float = 0.0
    first_batch_s: float = 0.0
    samples_per_s: float = 0.0
    mb_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    # share of worker time, and "wait"
    stages: dict[str, float] = dataclasses.field(default_factory=dict)
    # loader.stats().as_dict() (DeviceLoader's)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    # per step, seconds (with a device)
    data_wait: list[float] = dataclasses.field(default_factory=list)
    interrupted: bool = False


@dataclasses.dataclass(frozen=True)
class Settings:
    """How each point reads: the ShardDataset and loader arguments, the limits, and the consumer."""

    batch_size: int = 64
    decode: str = "torch"
    samples: int | None = None
    seconds: float | None = 10.0
    prefetch: int | str | None = None
    storage_options: dict[str, Any] | None = None
    trusted_roots: dict[str, dict[str, Any]] | None = None  # where a merge names shards by full URL
    device: str | None = None  # a DeviceLoader on it consumes the batches
    step_ms: float = 0.0  # a simulated training step per batch
    version: int | None = None  # the dataset's version read (None: the latest)

    def dataset(self, url: str, cache_dir: str | None = None) -> ShardDataset:
        from ..dataset import ShardDataset

        kwargs: dict[str, Any] = {
            "decode": DECODE[self.decode],
            "shuffle": True,
            "seed": 0,
            "version": self.version,
        }
        if self.storage_options is not None:
            kwargs["storage_options"] = self.storage_options
        if self.trusted_roots:
            kwargs["storage"] = StorageSettings(trusted_roots=self.trusted_roots)
        if cache_dir is not None:
            kwargs["cache_dir"] = cache_dir
        if self.prefetch is not None:
            kwargs["prefetch"] = self.prefetch
        return ShardDataset(url, **kwargs)


def check_decode(decode: str) -> None:
    """``fast`` needs simplejpeg (the ``fast`` extra)."""
    if decode == "fast":
        try:
            import simplejpeg  # noqa: F401
        except ImportError as exc:
            raise UsageError(
                "--decode fast needs simplejpeg: pip install 'shardstream[fast]'"
            ) from exc


def decoders(field_names: Iterable[str], decode: str) -> dict[str, str]:
    """Which library decodes each image, video and audio field under ``decode`` (with its version):
    the backend a measured rate depends on; empty with ``none``."""
    from importlib.metadata import PackageNotFoundError, version

    from ..formats.media_header import media_kind
    from ..manifest.image_sizes import IMAGE_EXTENSIONS

    def named(package: str, label: str) -> str:
        try:
            return f"{label} {version(package)}"
        except PackageNotFoundError:
            return f"{label} (not installed)"

    if decode == "none":
        return {}
    out = {}
    for name in field_names:
        ext = name.rsplit(".", 1)[-1].lower()
        if media_kind(ext) is not None and decode in ("torch", "fast"):
            out[name] = named("av", "PyAV")
        elif ext in ("jpg", "jpeg") and decode != "pil":
            fast = decode == "fast" or importlib.util.find_spec("simplejpeg") is not None
            out[name] = named("simplejpeg", "simplejpeg") if fast else named("pillow", "Pillow")
        elif ext in IMAGE_EXTENSIONS:
            out[name] = named("pillow", "Pillow")
    return out


def why_no_ideal(settings: Settings) -> str | None:
    """Why ``--ideal`` would measure nothing here, or None. Batches replayed from memory to a consumer that
    does nothing (no ``--step-ms``, no device other than the CPU) time only the replay loop: millions of
    samples/s, thousands of times any loader, which says nothing about the headroom."""
    if settings.step_ms > 0:
        return None
    why = "no --device but the CPU"
    if settings.device is not None:
        from ..device import DeviceLoader

        # copies to an accelerator: real work
        if DeviceLoader((), settings.device).device.type != "cpu":
            return None
        if not str(settings.device).startswith("cpu"):
            why = f"--device {settings.device} is the CPU here, where nothing is copied"
    return (
        f"not measured: nothing takes the batches (no --step-ms, {why}), so replaying them from memory "
        "would time an empty loop; give --step-ms your training step's time (or --device cuda on a GPU) to "
        "see how far the loader is from keeping that step busy"
    )


def default_workers() -> list[int]:
    """1, 2, 4, ... up to the CPU cores this process may use, and the core count itself."""
    cores = usable_cores()
    counts, n = [], 1
    while n < cores:
        counts.append(n)
        n *= 2
    return [*counts, cores]


def recommend(throughput: Mapping[int, float], within: float = 0.05) -> int | None:
    """The smallest worker count within ``within`` (5%) of the best throughput; None without points."""
    if not throughput:
        return None
    best = max(throughput.values())
    return min(w for w, t in throughput.items() if t >= (1 - within) * best)


def rss_bytes() -> int:
    """Resident memory of this process and its children (DataLoader workers), summed; shared pages count
    once per process, so this is an upper bound."""
    pids, total, seen = [os.getpid()], 0, set()
    while pids:
        pid = pids.pop()
        if pid in seen:
            continue
        seen.add(pid)
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                pids.extend(int(p) for p in f.read().split())
    return total


Progress = Callable[[int], None]  # samples so far


def _consume(
    batches: Iterable[Any],
    settings: Settings,
    samples_in: Callable[[Any], int],
    tick: Progress,
    point: Point,
) -> None:
    """Take batches until the point's limit, timing the first one; memory sampled a few times a second."""
    started = time.perf_counter()
    first_at, first_samples, last_rss = None, 0, 0.0
    limit, seconds = settings.samples, settings.seconds
    peak = 0
    try:
        for batch in batches:
            now = time.perf_counter()
            n = samples_in(batch)
            point.samples += n
            if first_at is None:
                first_at, first_samples = now, n
                point.first_batch_s = now - started
            if now - last_rss > 0.25:
                peak, last_rss = max(peak, rss_bytes()), now
            if settings.step_ms:
                time.sleep(settings.step_ms / 1000)
            tick(point.samples)
            if (limit is not None and point.samples >= limit) or (
                seconds is not None and now - started >= seconds
            ):
                break
    except KeyboardInterrupt:
        point.interrupted = True
    end = time.perf_counter()
    point.seconds = end - started
    steady = point.samples - first_samples
    span = end - first_at if first_at is not None else 0.0
    point.samples_per_s = (
        steady / span if steady > 0 and span > 0 else point.samples / max(point.seconds, 1e-9)
    )
    point.peak_rss_mb = max(peak, rss_bytes()) / 1e6


def _endless(loader: Any) -> Iterator[Any]:
    """The loader's passes, one after the other (it moves to the next epoch by itself)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            return


def measure(
    url: str,
    workers: int,
    settings: Settings,
    phase: str = "local",
    cache_dir: str | None = None,
    tick: Progress = lambda n: None,
) -> Point:
    """One point: a fresh dataset and loader with ``workers`` workers, read until the limit."""
    from ..device import DeviceLoader

    ds = settings.dataset(url, cache_dir)
    loader = ds.loader(batch_size=settings.batch_size, num_workers=workers)
    consumer = DeviceLoader(loader, settings.device) if settings.device else None
    point = Point(workers, phase)
    batches = _endless(consumer if consumer is not None else loader)
    size = settings.batch_size
    try:
        _consume(batches, settings, lambda b: size, tick, point)
    finally:
        batches.close()  # stops the workers of this point before the next starts
    stats = (consumer or loader).stats()
    inner = stats if consumer is None else stats.loader
    point.samples = min(point.samples, inner.samples)  # the last batch of a pass may be short
    point.stats = stats.as_dict()
    point.stages = {**inner.stage_shares(), "wait": stats.data_wait_fraction}
    if consumer is not None:
        point.data_wait = [w for w, _ in stats.history]
    per_sample = ds.sample_set.stored_bytes_per_sample
    point.mb_per_s = point.samples_per_s * per_sample / 1e6
    del loader, consumer, ds
    gc.collect()
    return point


def sweep(
    url: str,
    workers: Iterable[int],
    settings: Settings,
    remote: bool,
    progress: Callable[[str], Any] | None = None,
) -> list[Point]:
    """Every worker count, each in a fresh loader (cold then warm over remote storage); a Ctrl-C stops
    the sweep with the points measured so far (the one cut short is marked ``interrupted``)."""
    points: list[Point] = []
    for w in workers:
        phases = ["cold", "warm"] if remote else ["local"]
        with tempfile.TemporaryDirectory(prefix="shardstream-bench-") as cache:
            for phase in phases:
                label = count(w, "worker") + ("" if phase == "local" else f", {phase} cache")
                bar = progress(label) if progress else None
                tick = (
                    (lambda n, bar=bar: bar.update(n - bar.n))
                    if bar is not None
                    else (lambda n: None)
                )
                try:
                    point = measure(url, w, settings, phase, cache if remote else None, tick)
                except KeyboardInterrupt:
                    point = Point(w, phase, interrupted=True)
                finally:
                    if bar is not None:
                        bar.close()
                points.append(point)
                if point.interrupted:
                    return points
    return points


def replay(url: str, settings: Settings, batches: int = 32) -> Point:
    """``--ideal``: up to ``batches`` batches read once, then served from memory to the same consumer
    (the same step, the same device copies) until the same limit: the throughput a loader that costs
    nothing would reach (see :func:`why_no_ideal` for when that means something)."""
    ds = settings.dataset(url)
    held: list[Any] = []
    for batch in ds.loader(batch_size=settings.batch_size, num_workers=0):
        held.append(batch)
        if len(held) >= batches:
            break

    def again() -> Iterator[Any]:
        while True:
            yield from held

    from ..device import DeviceLoader

    consumer = DeviceLoader(again(), settings.device) if settings.device else None
    point = Point(0, "ideal")
    source = iter(consumer) if consumer is not None else again()
    _consume(source, settings, lambda b: settings.batch_size, lambda n: None, point)
    per_sample = ds.sample_set.stored_bytes_per_sample
    point.mb_per_s = point.samples_per_s * per_sample / 1e6
    return point
