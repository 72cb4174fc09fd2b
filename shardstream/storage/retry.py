"""How requests to remote storage are retried and timed out."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import StorageError
from .classify import describe_os_error, is_transient

_T = TypeVar("_T")

_JITTER = random.Random()  # not the global generator: workers seed that one for the user's augmentations


@dataclass(frozen=True)
class RetryPolicy:
    """How requests to remote storage are retried and timed out.

    Args:
        retries: attempts after the first one fails with a transient error.
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
            raise ValueError(f"retries must be 0 or more, not {self.retries}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, not {self.timeout}")

    def wait(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): exponential, with full jitter."""
        return _JITTER.uniform(0.5, 1.0) * min(self.max_backoff, self.backoff * 2**attempt)

    def time_limit(self, nbytes: int = 0) -> float | None:
        """The timeout for one request that moves ``nbytes``."""
        return None if self.timeout is None else self.timeout + nbytes / self.min_rate

    def call(self, fn: Callable[[], _T], describe: Callable[[], str]) -> _T:
        """``fn()``, retried on transient errors; the last error is raised with the attempt count in its message."""
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if attempt >= self.retries:
                    raise StorageError(f"{describe()}: {describe_os_error(exc)} "
                                       f"(gave up after {attempt + 1} attempts)") from exc
            time.sleep(self.wait(attempt))
            attempt += 1

