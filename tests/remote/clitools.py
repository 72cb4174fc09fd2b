"""Running ``shardstream`` in the tests: in this process through click's runner, or as the real executable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from shardstream.cli import cli

_EXE = Path(sys.executable).with_name("shardstream")
SHARDSTREAM = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "shardstream"]


def invoke(*args: object) -> Result:
    """``shardstream ARGS`` in this process; errors must end in ``sys.exit``, never an escaping exception."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def ok(*args: object) -> Result:
    """``invoke`` that must succeed."""
    result = invoke(*args)
    assert result.exit_code == 0, (
        f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    )
    return result


def run(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real ``shardstream`` executable in a child process."""
    return subprocess.run(
        [*SHARDSTREAM, *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def one_line_error(result: Result | subprocess.CompletedProcess[str], *names: str) -> str:
    """The command failed with exit code 1 and printed exactly one ``error:`` line naming every one of ``names``."""
    code = result.exit_code if isinstance(result, Result) else result.returncode
    text = result.stderr
    assert code == 1, f"exit {code}\nstdout: {result.stdout}\nstderr: {text}"
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), text
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]
