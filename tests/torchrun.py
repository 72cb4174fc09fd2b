"""Real ``torchrun`` for the tests: local ranks on one node (gloo), a free port, none of this process's rank
variables, and a test failure (not a hang) if the ranks do not finish."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(
    nproc: int, script: str | Path, *args: str, timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``args`` as ``nproc`` ranks; its output, once every rank exited with 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(script),
        *args,
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:  # a hang is what equal per-rank work must prevent
        pytest.fail(f"torchrun timed out after {timeout:.0f} s\n{exc.stdout}\n{exc.stderr}")
    assert done.returncode == 0, (
        f"torchrun failed ({done.returncode})\n{done.stdout}\n{done.stderr[-6000:]}"
    )
    return done
