"""Background loading of what a reader needs next, within a byte budget.

A worker knows its plan, so it knows which shards it reads next. It hands them to a
:class:`Prefetcher` in the order it will need them; a few threads load them (download,
check, decompress, index) while the worker decodes the current ones. The bytes of
shards loading or loaded but not yet taken stay under ``budget`` (at least one shard is
always allowed, however large; a budget of 0 loads nothing ahead), so memory and
bandwidth in flight are bounded.
Threads are daemons started in the process that reads, so forked workers never
inherit them. :meth:`Prefetcher.close` calls off what is queued and what is running:
a download in its backoff stops at once, one under way stops before it writes
anything to the cache, and close waits a bounded time for the threads to end.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Generic, TypeVar

from ..errors import UsageError
from .retry import cancelled_by

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """Loads items (shard indices) ahead of use with ``load(item)``, ``size(item)`` bytes each."""

    def __init__(
        self, load: Callable[[int], T], size: Callable[[int], int], budget: int, threads: int = 4
    ):
        if threads < 1:
            raise UsageError(f"threads must be at least 1, not {threads}")
        self._load = load
        self._size = size
        self.budget = max(int(budget), 0)
        self._lock = threading.Lock()
        self._wanted: OrderedDict[int, None] = OrderedDict()  # in order of need, not started
        self._started: dict[int, Future[T]] = {}  # loading or loaded, not taken
        self._taken: set[int] = set()  # handed out and still in the plan: not loaded again
        self._held = 0  # bytes of the started ones
        self._tasks: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._stop = threading.Event()  # calls off the loads running in the threads
        self._threads = [
            threading.Thread(target=self._work, name=f"shardstream-prefetch-{i}", daemon=True)
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()
        self._closed = False
        # wanted items wait for resume() (a reader's own first requests go first)
        self._paused = False

    def pause(self) -> None:
        """Start nothing more until :meth:`resume` (loads under way go on)."""
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        """Start loading what is wanted again."""
        with self._lock:
            self._paused = False
            self._start_more()

    def want(self, items: Iterable[int]) -> None:
        """Items needed soon, in order of need; those already wanted or started are ignored."""
        with self._lock:
            for item in items:
                if item not in self._started and item not in self._taken:
                    self._wanted.setdefault(item, None)
            self._start_more()

    def keep_only(self, items: Iterable[int]) -> None:
        """Forget the wanted and loaded items not in ``items`` (the plan moved past them)."""
        keep = set(items)
        with self._lock:
            self._taken &= keep
            for item in [i for i in self._wanted if i not in keep]:
                del self._wanted[item]
            for item in [i for i, f in self._started.items() if i not in keep and f.done()]:
                del self._started[item]
                self._held -= self._size(item)
            self._start_more()

    def take(self, item: int) -> T:
        """The loaded ``item`` (waiting for it, or loading it here if it was never started)."""
        with self._lock:
            future = self._started.get(item)
            if future is None:
                self._wanted.pop(item, None)
            self._taken.add(item)
        if future is None:
            return self._load(item)
        try:
            return future.result()
        finally:
            with self._lock:
                if self._started.get(item) is future:
                    del self._started[item]
                    self._held -= self._size(item)
                self._start_more()

    def coming(self, item: int) -> bool:
        """Whether ``item`` is on its way: loading, or waiting its turn within the budget (not loaded yet)."""
        with self._lock:
            future = self._started.get(item)
            return self.budget > 0 and (
                item in self._wanted or future is not None and not future.done()
            )

    def queued(self) -> tuple[list[int], list[int]]:
        """(items started: loading or loaded and not taken yet; items wanted that wait for room in
        the budget), each in order of need."""
        with self._lock:
            return list(self._started), list(self._wanted)

    def in_flight(self) -> int:
        """Bytes loading or loaded and not yet taken."""
        with self._lock:
            return self._held

    def close(self, timeout: float = 1.0) -> None:
        """Drop everything not taken, call off the loads running (they stop at their next check:
        before a retry) and wait up to ``timeout`` seconds for the threads to end; one still in a
        request then ends with it, and what it got is still written to the cache (other processes may
        be waiting for that file)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            self._wanted.clear()
            for future in self._started.values():
                future.cancel()  # a waiting taker gets CancelledError
            self._started.clear()
            self._held = 0
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(deadline - time.monotonic(), 0.0))

    def _start_more(self) -> None:  # with the lock held
        while self._wanted and not self._closed and not self._paused:
            item = next(iter(self._wanted))
            size = self._size(item)
            if self.budget == 0 or (self._started and self._held + size > self.budget):
                return  # budget 0: nothing ahead; otherwise at least one, however large
            del self._wanted[item]
            future: Future[T] = Future()
            self._started[item] = future
            self._held += size
            self._tasks.put(item)

    def _work(self) -> None:
        while True:
            item = self._tasks.get()
            if item is None:
                return
            with self._lock:
                future = self._started.get(item)
            if future is None or not future.set_running_or_notify_cancel():
                continue  # forgotten meanwhile
            try:
                with cancelled_by(self._stop):
                    future.set_result(self._load(item))
            except BaseException as exc:  # handed to whoever takes it
                future.set_exception(exc)
