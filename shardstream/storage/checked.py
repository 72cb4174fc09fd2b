"""Checks that run once per host for each version of a file, their results kept in the private cache.

Hashing a shard costs about 50 ms per 64 MB; doing it once per file version (a record of the
file's device, inode, size and modification time), not once per read, makes checking free on a
hot path. One process at a time runs a check; the others wait for it and take its result.

A record is a convenience, never a condition: where none can be kept (the folder removed by a
cleaner mid-run is made again; a full disk leaves no room for one) the check runs unrecorded, and
runs again next time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
from collections.abc import Callable

from ..errors import StorageError
from .classify import describe_os_error
from .private import NOFOLLOW, lock, private_dir, unlink_if_same

FOLDER = "checked"


_READY: set[str] = set()  # record folders this process made or checked already


# what keeps a record from being kept, not from being trusted: the folder is gone, the disk is full
_NO_RECORD = (errno.ENOENT, errno.ENOSPC, errno.EDQUOT)


def record_path(root: str, name: str) -> str:
    """The record ``name`` in the private folder ``root/checked`` (made when a record is first opened)."""
    return os.path.join(root, FOLDER, name)


def _open_record(record: str) -> int:
    """The record file, opened (created if missing) in its private folder, which is made if it is missing,
    also when a cleaner removed it since this process made it. :class:`StorageError` if the folder is
    not safe to use (a link, another user's), or cannot be made (its cause the OS error)."""
    folder = os.path.dirname(record)
    if folder not in _READY:
        private_dir(folder)
        _READY.add(folder)
    try:
        return _open_file(record)
    except FileNotFoundError:  # removed since this process made it (a cleaner): made again
        private_dir(folder)
        return _open_file(record)


def _open_file(record: str) -> int:
    try:
        return os.open(record, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno in _NO_RECORD:
            raise
        raise StorageError(
            f"cannot use the check record {record}: {describe_os_error(exc)}; remove it, or choose "
            "another cache_dir"
        ) from exc


def _no_record(exc: BaseException) -> bool:
    """Whether ``exc`` (opening or making a record) means no record can be kept now, not a folder unsafe
    to use (which is an error)."""
    cause = exc.__cause__ if isinstance(exc, StorageError) else exc
    return isinstance(cause, OSError) and cause.errno in _NO_RECORD


def checked_once(record: str, identity: str, check: Callable[[], bool]) -> bool:
    """Whether ``check()`` holds for ``identity``: ``True`` at once if the file ``record`` says it passed
    for this identity already, else the result of ``check()``, recorded when it passes (and when a
    record can be kept: see the module)."""
    try:
        fd = _open_record(record)
    except (OSError, StorageError) as exc:
        if not _no_record(exc):
            raise
        return check()
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
            with contextlib.suppress(OSError):  # no room for the record: checked again next time
                _write(fd, identity)
        return passed
    finally:
        os.close(fd)


def mark_checked(record: str, identity: str) -> None:
    """Record that ``identity`` passed (its bytes were checked as they were written)."""
    try:
        fd = _open_record(record)
    except (OSError, StorageError) as exc:
        if not _no_record(exc):
            raise
        return  # without the record the file is checked once more, no harm
    with contextlib.suppress(OSError):  # (no room for it: the same)
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
