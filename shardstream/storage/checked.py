"""Checks that run once per host for each version of a file, their results kept in the private cache.

Hashing a shard costs about 50 ms per 64 MB; doing it once per file version (a record of the
file's device, inode, size and modification time), not once per read, makes checking free on a
hot path. One process at a time runs a check; the others wait for it and take its result.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Callable

from .private import NOFOLLOW, lock, private_dir, unlink_if_same

FOLDER = "checked"


_READY: set[str] = set()  # record folders this process made or checked already


def record_path(root: str, name: str) -> str:
    """The record ``name`` in the private folder ``root/checked`` (made if missing)."""
    folder = os.path.join(root, FOLDER)
    if folder not in _READY:
        private_dir(folder)
        _READY.add(folder)
    return os.path.join(folder, name)


def checked_once(record: str, identity: str, check: Callable[[], bool]) -> bool:
    """Whether ``check()`` holds for ``identity``: ``True`` at once if the file ``record`` says it passed
    for this identity already, else the result of ``check()``, recorded when it passes."""
    fd = os.open(record, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    try:
        lock(fd, fcntl.LOCK_EX)
        if os.pread(fd, len(identity) + 1, 0) == identity.encode():
            return True
        try:
            passed = check()
        except BaseException:
            passed = False
            raise
        finally:
            if not passed:
                with contextlib.suppress(OSError):
                    unlink_if_same(fd, record)
        if passed:
            _write(fd, identity)
        return passed
    finally:
        os.close(fd)


def mark_checked(record: str, identity: str) -> None:
    """Record that ``identity`` passed (its bytes were checked as they were written)."""
    with contextlib.suppress(OSError):  # without the record the file is checked once more, no harm
        fd = os.open(record, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        try:
            lock(fd, fcntl.LOCK_EX)
            _write(fd, identity)
        finally:
            os.close(fd)


def _write(fd: int, identity: str) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, identity.encode(), 0)


def once_per_host(root: str, identity: str, check: Callable[[], None]) -> None:
    """Run ``check()`` (which raises if it fails) unless it passed for ``identity`` on this host already,
    as recorded in the private folder ``root/checked``."""

    def passes() -> bool:
        check()
        return True

    checked_once(record_path(root, hashlib.sha256(identity.encode()).hexdigest()), identity, passes)
