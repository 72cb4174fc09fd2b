"""The local engine: run a shard plan's jobs in a pool of processes (threads for remote stores).

Each job writes one shard from its plan entry, so the shards are the same bytes whatever the
number of workers; results come back in plan order. Worker processes end with the process
that started them, even when it is killed with SIGKILL.
"""

from __future__ import annotations

import ctypes
import itertools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import UsageError
from ..host import usable_cores

R = TypeVar("R")


@dataclass(frozen=True)
class Execution:
    """How a pack runs its shard jobs: ``workers`` at a time on ``engine`` (``"local"``, or ``"ray"`` on the
    cluster at ``ray_address``), with a progress bar or not."""

    workers: int
    progress: bool = True
    engine: str = "local"
    ray_address: str | None = None


def default_workers() -> int:
    """The cores this process may use."""
    return usable_cores()


def pool_context() -> multiprocessing.context.BaseContext:
    """How pack's worker processes start: fork (instant) while this process has no other threads, for
    which it is safe; spawn otherwise."""
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """Pool initializer: end this worker when ``parent`` (the process that started it) ends.

    On Linux the kernel sends SIGKILL (``PR_SET_PDEATHSIG``); elsewhere a thread watches the
    parent. Either way a parent that is already gone ends the worker at once.
    """
    armed = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
        except (OSError, AttributeError):
            armed = False
    if not armed:
        threading.Thread(
            target=_watch_parent, args=(parent,), name="shardstream-parent-watch", daemon=True
        ).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


class NoBar:
    """What ``progress_bar`` gives without progress: a context manager whose ``update`` does nothing."""

    def update(self, n: float = 1) -> None:
        pass

    def __enter__(self) -> NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress_bar(progress: bool, total: int | None, unit: str = "B") -> Any:
    """A tqdm bar on a terminal (tqdm imported only then: ``pack -q`` starts faster), else a :class:`NoBar`."""
    if not progress:
        return NoBar()
    from tqdm import tqdm

    class _Bar(tqdm):
        monitor_interval = 0  # no monitor thread: it would make forking the workers unsafe

    return _Bar(
        total=total,
        unit=unit,
        unit_scale=True,
        disable=None,
        desc="packing",
        leave=False,
        dynamic_ncols=True,
    )


_INHERITED: dict[
    int, tuple[Callable[..., Any], Sequence[tuple[Any, ...]]]
] = {}  # run -> (job, jobs), for forks
_RUNS = itertools.count()


def _inherited_job(run: int, i: int) -> Any:
    """In a forked worker: job ``i`` of ``run``, from the memory the worker started with."""
    job, jobs = _INHERITED[run]
    return job(*jobs[i])


def run_local(
    job: Callable[..., R],
    jobs: Sequence[tuple[Any, ...]],
    workers: int,
    processes: bool,
    on_done: Callable[[int], None],
) -> list[R]:
    """``job(*args)`` for each of ``jobs``, ``workers`` at a time, results in order; ``on_done(i)`` after each.

    Processes for local folders; threads for remote stores, whose clients hold per-process
    state (connections, event loops, memory:// contents). Forked workers find the jobs in the memory
    they start with: only job numbers go through the pool's pipes, not the arguments (a folder plan's
    20,000 samples took this process a fifth of a second to pickle, beside the workers).
    """
    results: list[R] = []
    if workers == 1 or len(jobs) == 1:
        for i, args in enumerate(jobs):
            results.append(job(*args))
            on_done(i)
        return results
    size = min(workers, len(jobs))
    pool_type = ProcessPoolExecutor if processes else ThreadPoolExecutor
    kwargs: dict[str, Any] = {}
    run = None
    if processes:
        context = pool_context()
        kwargs = {"mp_context": context, "initializer": die_with_parent, "initargs": (os.getpid(),)}
        if context.get_start_method() == "fork":  # the pool forks its workers at the first submit
            run = next(_RUNS)
            _INHERITED[run] = (job, jobs)
    try:
        with pool_type(size, **kwargs) as pool:
            futures = [
                pool.submit(job, *args) if run is None else pool.submit(_inherited_job, run, i)
                for i, args in enumerate(jobs)
            ]
            try:
                for i, future in enumerate(futures):
                    results.append(future.result())
                    on_done(i)
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        if run is not None:
            del _INHERITED[run]
    return results


# Engines other than this module's local pool, by name: a dotted path imported only when a pack uses it
# (its module gives the install hint for its library).
ENGINES: dict[str, str] = {"ray": "shardstream.packing.ray_engine:run_ray"}


def run_jobs(
    run: Execution,
    job: Callable[..., R],
    jobs: Sequence[tuple[Any, ...]],
    processes: bool,
    on_done: Callable[[int], None],
    describe: Callable[[int], str] | None = None,
) -> list[R]:
    """``job(*args)`` for each of ``jobs`` on ``run.engine`` (``"local"``: a pool of ``run.workers``;
    ``"ray"``: Ray tasks, on the cluster at ``run.ray_address``), results in plan order, ``on_done(i)``
    after each; ``describe(i)`` names job ``i``'s input in errors."""
    import importlib

    engine = run.engine
    if engine == "local":
        return run_local(job, jobs, run.workers, processes, on_done)
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; use one of local, {', '.join(ENGINES)}")
    module, _, name = ENGINES[engine].partition(":")
    run_on = getattr(importlib.import_module(module), name)
    return run_on(job, jobs, on_done, address=run.ray_address, describe=describe)
