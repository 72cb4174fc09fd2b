"""Run ``shardstream`` commands in a forked child with a time limit, so that a hang or a crash is a
test failure that names the command, not a stuck test run.

A small server (``python -m tests.cli.fuzz_runner``) imports the command line and what it reads
shards with once; for each case it forks a child that runs the commands through click's test
runner, so a case costs a fork, not an interpreter start. The pytest process itself never forks.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# a child that wants more fails with MemoryError rather than meeting the OOM killer
MEMORY_LIMIT = 4 << 30
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Outcome:
    args: list[str]
    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    escaped: str | None = None  # an exception that got past the command line's error handling


def _send(fd: int, message: Any) -> None:
    data = pickle.dumps(message)
    data = struct.pack("<Q", len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def _child(fd: int, commands: list[list[str]]) -> None:
    import click.testing

    from shardstream.cli import cli

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    for args in commands:
        _send(fd, args)
        result = click.testing.CliRunner().invoke(cli, args)
        escaped = None
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            escaped = "".join(traceback.format_exception(result.exception))
        _send(
            fd, Outcome(args, result.exit_code, result.stdout_bytes, result.stderr_bytes, escaped)
        )


def _read_messages(fd: int, deadline: float) -> tuple[list[Any], bool]:
    """Every message the child sends until it closes its end; and whether the deadline passed first."""
    buf, messages = b"", []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return messages, True
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return messages, False
        buf += chunk
        while len(buf) >= 8 and len(buf) >= 8 + struct.unpack("<Q", buf[:8])[0]:
            n = struct.unpack("<Q", buf[:8])[0]
            messages.append(pickle.loads(buf[8 : 8 + n]))
            buf = buf[8 + n :]


def run_case(commands: list[list[str]], timeout: float) -> tuple[list[Outcome], str | None]:
    """In the server: fork a child for ``commands``; their outcomes, and a hang or death, or None."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(r)
            _child(w, commands)
        except BaseException:  # reported as the child's death
            traceback.print_exc()
            code = 3
        os._exit(code)
    os.close(w)
    try:
        messages, late = _read_messages(r, time.monotonic() + timeout)
    finally:
        os.close(r)
    if late:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    outcomes = [m for m in messages if isinstance(m, Outcome)]
    running = messages[-1] if messages and not isinstance(messages[-1], Outcome) else None
    where = f"shardstream {' '.join(running)}" if running else "between commands"
    if late:
        return outcomes, f"still running after {timeout:.0f} s: {where}"
    if running is not None or status != 0:
        return outcomes, f"the process died ({_describe(status)}) in: {where}"
    return outcomes, None


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"


def _warm_up() -> None:
    """Run every verb once on small datasets of each format, here, so that what the commands import
    and set up on first use is there already in every forked child."""
    import shutil
    import tempfile

    import click.testing

    from shardstream.cli import cli
    from tests.sample_datasets import write_dataset

    root = Path(tempfile.mkdtemp(prefix="shardstream-fuzz-"))
    try:
        for fmt, compression in (("tar", None), ("tar", "zstd"), ("arrow", None)):
            ds = write_dataset(root, [2, 1], fmt, compression, name=f"{fmt}-{compression}")
            for args in (
                ["info", ds],
                ["info", ds, "--json"],
                ["ls", ds],
                ["ls", ds, "--json"],
                ["cat", ds, "0"],
                ["cat", ds, "--key", "s0002"],
                ["verify", ds, "-q", "--workers", "1"],
                ["index", ds, "--overwrite", "-q"],
            ):
                click.testing.CliRunner().invoke(cli, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The server's loop: a pickled (commands, timeout) in, a pickled run_case result out."""
    _warm_up()
    while True:
        try:
            commands, timeout = pickle.load(requests)
        except EOFError:
            return
        pickle.dump(run_case(commands, timeout), replies)
        replies.flush()


class Runner:
    """The test's handle on a server process."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.cli.fuzz_runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )

    def run(self, commands: list[list[str]], timeout: float) -> tuple[list[Outcome], str | None]:
        """Each command's outcome, in order, and what went wrong with the child (a hang past
        ``timeout`` seconds for all the commands, or a death), naming the command, or None."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        pickle.dump((commands, timeout), self.proc.stdin)
        self.proc.stdin.flush()
        if not select.select([self.proc.stdout], [], [], timeout + 60)[0]:
            raise TimeoutError("the fuzz runner does not answer")
        return pickle.load(self.proc.stdout)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    # so that outcomes pickle as this module's, not __main__'s
    from tests.cli.fuzz_runner import (
        serve as _serve,
    )

    _serve(sys.stdin.buffer, sys.stdout.buffer)
