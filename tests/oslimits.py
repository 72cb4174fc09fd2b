"""Running code under real OS limits in tests: file permissions that apply even to root."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest


def drop_dac() -> None:
    """preexec_fn: lose CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH so root obeys file modes after exec."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def permission_preexec(tmp_path: Path):
    """A preexec_fn under which file modes apply (root loses its override), or skip the test."""
    preexec = drop_dac if os.geteuid() == 0 else None
    probe = tmp_path / "probe"
    probe.write_bytes(b"x")
    probe.chmod(0)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", f"open({str(probe)!r}, 'rb')"],
            capture_output=True,
            preexec_fn=preexec,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError) as exc:  # prctl refused
        pytest.skip(f"cannot take away root's permission override here: {exc}")
    finally:
        probe.unlink()
    if proc.returncode == 0:
        pytest.skip("file permissions do not apply to this process here")
    return preexec
