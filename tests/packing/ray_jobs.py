"""Jobs that Ray workers import (the tests put the repository on their PYTHONPATH)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from shardstream.errors import SourceError
from shardstream.packing.folder import ShardJob, write_shard


def killed_once(marker: str, index: int, job: ShardJob) -> Any:
    """``write_shard(job)``; on the first attempt at shard ``index`` the worker writes the shard and then
    SIGKILLs itself before returning (Ray retries the task: the shard is written again, identically)."""
    result = write_shard(job)
    if job.index == index and not Path(marker).exists():
        Path(marker).write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return result


def always_killed(marker: str, *args: Any) -> Any:
    with open(marker, "a") as f:
        f.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def square(x: int) -> int:
    return x * x


def bad_file(path: str) -> None:
    raise SourceError(f"{path}: not a JPEG (truncated); remove it or fix it")


def type_error(x: int) -> None:
    raise TypeError(f"cannot handle {x}")


def fails_on_shard_1(job: ShardJob) -> Any:
    """``write_shard``, except that shard 1 fails reading its first file (the driver uses it in place of
    ``write_shard``: a source file that cannot be read, on every attempt)."""
    if job.index == 1:
        raise SourceError(f"cannot read {job.samples[0].files[0][1]}: Input/output error")
    return write_shard(job)


def dies_on_shard_1(job: ShardJob) -> Any:
    """``write_shard``, except that shard 1's worker dies every time (SIGKILL)."""
    if job.index == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return write_shard(job)
