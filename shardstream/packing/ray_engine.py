"""The Ray engine: a shard plan's jobs as Ray tasks, on a laptop or a cluster, results in plan order.

The driver plans the shards exactly as the local engine does; each job becomes one task that reads
its part of the source and writes its shard straight to the destination (atomically: a rename into
place for local folders, one PUT of the whole object for object stores), so no shard bytes travel
through the driver or Ray's object store and a retried task leaves nothing half-written. A shard's
name comes from its index in the plan and the run's token, never from a task attempt: the output is
the same bytes as a local pack. Ray retries a task whose worker died (SIGKILL, a lost node) up to
``retries`` times; an exception raised by the job itself is an error in the data and ends the pack
with that error, before any manifest is written.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from ..errors import ShardstreamError

R = TypeVar("R")
INSTALL = "pip install 'shardstream[ray]'"
DEFAULT_RETRIES = 3
STOP_SECONDS = 30.0  # how long tasks called off may take to stop on their own (closing their files) before a kill


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ShardstreamError(f"engine='ray' needs Ray; install it with: {INSTALL}") from None
    return ray


def connect(address: str | None = None, num_cpus: int | None = None) -> str:
    """Join the Ray cluster at ``address`` (else ``RAY_ADDRESS``), or start a local one; the address used.

    A process that already called ``ray.init`` keeps its cluster.
    """
    ray = _ray()
    if ray.is_initialized():
        return "the cluster this process joined"
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _probe(address)
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
            return address
        ray.init(
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
    except Exception as exc:  # ConnectionError, TimeoutError, RuntimeError, ... by Ray version
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShardstreamError(
            f"cannot reach {where} ({first}); start one with 'ray start --head' and pass its "
            "address (ray_address= or --ray-address, or RAY_ADDRESS), or leave the address out "
            "for a local instance"
        ) from exc
    return "local"


def _probe(address: str) -> None:
    """Fail fast on a cluster that does not answer: Ray itself waits minutes for its GCS."""
    import socket

    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise ShardstreamError(
            f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}); start one with "
            "'ray start --head' and pass its address (ray_address= or --ray-address, or "
            "RAY_ADDRESS), or leave the address out for a local instance"
        ) from None


def run_ray(
    job: Callable[..., R],
    jobs: Sequence[tuple[Any, ...]],
    on_done: Callable[[int], None],
    *,
    address: str | None = None,
    retries: int = DEFAULT_RETRIES,
    num_cpus: int | None = None,
    describe: Callable[[int], str] | None = None,
) -> list[R]:
    """``job(*args)`` for each of ``jobs`` as Ray tasks, results in plan order; ``on_done(i)`` as each ends.

    ``describe(i)`` names job ``i``'s input (its first source file) in errors.
    """
    ray = _ray()
    connect(address, num_cpus)
    task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=False)(job)
    refs = [task.remote(*args) for args in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                i = index[ref]
                results[i] = _result(
                    ray, ref, f"shard {i}" + (f" ({describe(i)})" if describe else ""), retries
                )
                on_done(i)
    except BaseException:
        stop(ray, pending)
        raise
    return results


def map_ray(
    fn: Callable[[Any], R],
    items: Sequence[Any],
    *,
    address: str | None = None,
    ahead: int | None = None,
    retries: int = DEFAULT_RETRIES,
    describe: Callable[[int], str] | None = None,
) -> Iterator[tuple[int, R]]:
    """``(i, fn(items[i]))`` in order, each call a Ray task, up to ``ahead`` beyond the one being consumed
    (default: two per CPU of the cluster). For sources read sample by sample: the results come back to
    this process, which writes the shards in order."""
    ray = _ray()
    connect(address)
    task = ray.remote(num_cpus=1, max_retries=retries, retry_exceptions=False)(_apply)
    shipped = ray.put(fn)  # sent once (Ray pickles it by value: lambdas and closures too)
    ahead = max(ahead or 2 * int(ray.cluster_resources().get("CPU", 1)), 1)
    pending: deque[Any] = deque()
    try:
        for i in range(len(items)):
            while len(pending) <= ahead and i + len(pending) < len(items):
                pending.append(task.remote(shipped, items[i + len(pending)]))
            what = f"input {i}" + (f" ({describe(i)})" if describe else "")
            yield i, _result(ray, pending.popleft(), what, retries)
    finally:
        stop(ray, list(pending))


class RayPool:
    """``submit(fn, *args)`` as Ray tasks, returning futures like a ``ThreadPoolExecutor``'s (a drop-in for
    packs that submit their own jobs, such as tables' Arrow shards); a future raises what its job raised."""

    def __init__(self, address: str | None = None, retries: int = DEFAULT_RETRIES):
        self.ray = _ray()
        connect(address)
        self.retries = retries
        self._tasks: dict[Any, Any] = {}
        self._refs: list[Any] = []

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        task = self._tasks.get(fn)
        if task is None:
            task = self._tasks[fn] = self.ray.remote(
                num_cpus=1, max_retries=self.retries, retry_exceptions=False
            )(fn)
        ref = task.remote(*args)
        self._refs.append(ref)
        out: Future[R] = Future()
        n = len(self._refs) - 1

        def settle(done: Future[Any]) -> None:
            try:
                out.set_result(_result(self.ray, ref, f"shard {n}", self.retries))
            except BaseException as exc:  # handed to whoever waits on the future
                out.set_exception(exc)

        ref.future().add_done_callback(settle)
        return out

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            stop(self.ray, self._refs)


def stop(ray: Any, refs: list[Any]) -> None:
    """Call off ``refs`` and return once they have ended: a running task is interrupted (its ``finally``
    blocks run: a shard being written is not left half-written under a temporary name), and killed only if
    it has not stopped after :data:`STOP_SECONDS`. The caller tidies up after this (a pack that lost its
    destination removes its files), so no task of the run writes anything after that."""
    if not refs:
        return
    for ref in refs:
        ray.cancel(ref, force=False)
    _, running = ray.wait(refs, num_returns=len(refs), timeout=STOP_SECONDS)
    for ref in running:
        ray.cancel(ref, force=True)
    if running:
        ray.wait(running, num_returns=len(running), timeout=STOP_SECONDS)


def _apply(fn: Callable[[Any], R], item: Any) -> R:
    return fn(item)


def _result(ray: Any, ref: Any, what: str, retries: int) -> Any:
    try:
        return ray.get(ref)
    except (
        ray.exceptions.RayTaskError
    ) as exc:  # the job raised: the data's error, as the local engine gives it
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
        if isinstance(cause, ShardstreamError):
            raise cause from None
        detail = (
            f"{type(cause).__name__}: {cause}" if cause is not None else str(exc).splitlines()[0]
        )
        raise ShardstreamError(f"{what} failed on Ray: {detail}") from None
    except (
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.NodeDiedError,
        ray.exceptions.RayError,
    ) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ShardstreamError(
            f"{what}: its Ray worker died {retries + 1} times ({first}); check the workers' "
            "memory and logs, then pack again (completed shards are written again)"
        ) from None


__all__ = ["DEFAULT_RETRIES", "INSTALL", "RayPool", "connect", "map_ray", "run_ray"]
