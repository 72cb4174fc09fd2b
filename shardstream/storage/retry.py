"""How requests to remote storage are retried and timed out, and how background work is called off."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import CorruptShardError, StorageError, UsageError
from .classify import describe_os_error, is_transient

_T = TypeVar("_T")

# not the global generator: workers seed that one for the user's augmentations
_JITTER = random.Random()
# the event that calls off this thread's work (set by a closing Prefetcher)
_SCOPE = threading.local()
log = logging.getLogger("shardstream")


class Cancelled(Exception):
    """Work in a background thread was called off (its :class:`Prefetcher` closed) before its bytes arrived."""


@contextlib.contextmanager
def cancelled_by(event: threading.Event) -> Iterator[None]:
    """Within the block, :func:`check_cancelled` and :func:`pause` in this thread stop once ``event`` is set."""
    previous = getattr(_SCOPE, "event", None)
    _SCOPE.event = event
    try:
        yield
    finally:
        _SCOPE.event = previous


def check_cancelled() -> None:
    """Raise :class:`Cancelled` if this thread's work has been called off."""
    event = getattr(_SCOPE, "event", None)
    if event is not None and event.is_set():
        raise Cancelled("called off: the prefetcher closed")


def pause(seconds: float) -> None:
    """Sleep, waking at once (with :class:`Cancelled`) if this thread's work is called off."""
    event = getattr(_SCOPE, "event", None)
    if event is None:
        time.sleep(seconds)
    else:
        event.wait(seconds)
    check_cancelled()


class DamagedRead(CorruptShardError):
    """Bytes that arrived whole but failed their check (size, checksum): retried like a transient
    error, within the same attempts; once they run out, raised with how many reads failed."""

    def __init__(self, url: str, problem: str, advice: str):
        super().__init__(f"{url}: {problem}")
        self.url, self.problem, self.advice = url, problem, advice

    def exhausted(self, attempts: int) -> CorruptShardError:
        reads = f"on each of {attempts} downloads" if attempts > 1 else "when read"
        return CorruptShardError(f"{self.url}: {self.problem} {reads}; {self.advice}")


@dataclass(frozen=True)
class RetryPolicy:
    """How requests to remote storage are retried and timed out.

    Args:
        retries: attempts after the first one fails with a transient error (or with damaged
            bytes); one budget for both, never one inside the other.
        timeout: seconds one request may take (``None``: no limit); reads of large
            objects get ``nbytes / min_rate`` seconds more.
        backoff: the first wait between attempts, doubled each time (with jitter).
        max_backoff: the longest wait between attempts.
        min_rate: the slowest transfer, in bytes per second, that is not a stall.
    """

    retries: int = 5
    timeout: float | None = 60.0
    backoff: float = 0.2
    max_backoff: float = 10.0
    min_rate: float = 1 << 20

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise UsageError(f"retries must be 0 or more, not {self.retries}")
        if self.timeout is not None and self.timeout <= 0:
            raise UsageError(f"timeout must be positive seconds or None, not {self.timeout}")

    def wait(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): exponential, with full jitter."""
        return _JITTER.uniform(0.5, 1.0) * min(self.max_backoff, self.backoff * 2**attempt)

    def time_limit(self, nbytes: int = 0) -> float | None:
        """The timeout for one request that moves ``nbytes``."""
        return None if self.timeout is None else self.timeout + nbytes / self.min_rate

    def call(self, fn: Callable[[], _T], describe: Callable[[], str]) -> _T:
        """``fn()``, retried on transient errors and :class:`DamagedRead`; the last error is raised
        with the attempt count in its message."""
        attempt = 0
        while True:
            check_cancelled()
            try:
                return fn()
            except Exception as exc:  # _failed raises what is not retried
                self._failed(exc, attempt, describe)
            pause(self.wait(attempt))
            attempt += 1

    def call_each(
        self, count: int, attempt: Callable[[list[int]], list[Any]], describe: Callable[[int], str]
    ) -> list[Any]:
        """Requests ``0 .. count - 1``, each retried alone: ``attempt(todo)`` makes the requests ``todo`` at
        once and gives, per request, its result or the exception it ended in (a :class:`DamagedRead` for
        bytes that failed their check); an exception it raises counts against each of them. Only the
        requests that failed are made again, and each has the whole budget of :attr:`retries`: a batch of
        64 ranged reads is not lost to one bad answer among them. The first request to run out (or to
        fail permanently) raises as :meth:`call` does, ``describe(i)`` naming it."""
        results: list[Any] = [None] * count
        failures = [0] * count
        todo = list(range(count))
        while True:
            check_cancelled()
            try:
                outcomes = attempt(todo)
            except Exception as exc:  # the attempt as a whole: each of them failed
                outcomes = [exc] * len(todo)
            again = []
            for i, outcome in zip(todo, outcomes):
                if isinstance(outcome, BaseException):
                    self._failed(outcome, failures[i], lambda i=i: describe(i))
                    failures[i] += 1
                    again.append(i)
                else:
                    results[i] = outcome
            if not again:
                return results
            pause(self.wait(max(failures[i] for i in again) - 1))
            todo = again

    def _failed(self, exc: BaseException, attempt: int, describe: Callable[[], str]) -> None:
        """After attempt number ``attempt`` (0-based) ended in ``exc``: return if it is to be retried,
        else raise (``exc`` itself when retrying cannot help, or the error of a budget spent)."""
        if isinstance(exc, DamagedRead):
            if attempt >= self.retries:
                raise exc.exhausted(attempt + 1) from None
            log.warning("%s; downloading it again", exc)
            return
        if not isinstance(exc, Exception) or not is_transient(exc):
            raise exc
        if attempt >= self.retries:
            raise StorageError(
                f"{describe()}: {describe_os_error(exc)} (gave up after {attempt + 1} attempts)"
            ) from exc
