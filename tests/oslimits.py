"""Running code under real OS limits in tests: file permissions that apply even to root, and small
file systems that fill up (a tmpfs mounted for the test)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import subprocess
import sys
from collections.abc import Iterator
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


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (made here) for the block, or skip: mounting needs root."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a file system that fills up) needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def leave_free(folder: Path, nbytes: int = 0) -> Path:
    """Fill the file system of ``folder`` with one file, then give back ``nbytes`` (whole 4 KiB pages):
    exactly that much space is left. Returns the filler (remove it to free the rest)."""
    filler = folder / ".filler"
    chunk = b"\0" * (1 << 16)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                if not f.write(chunk):
                    break
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    size = filler.stat().st_size
    os.truncate(filler, max(size - size % 4096 - nbytes, 0))
    return filler
