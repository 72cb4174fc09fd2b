"""Private files on this host: folders only this user can reach, ``flock`` locks, and removing the
file one holds open (never one made at its path since). The shard cache and the host-wide check
records are built on these."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat

from ..errors import StorageError
from .classify import describe_os_error

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def private_dir(path: str, tighten: bool = False) -> None:
    """Make ``path`` a folder of this user's that nobody else can reach (created 0700 if missing).

    Raises :class:`StorageError` if it is a link or not a folder, belongs to another user, or
    others can reach it; with ``tighten``, one that others could only read (made by an earlier
    version) is made private instead.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(
            f"cannot create the shard cache {path}: {describe_os_error(exc)}; "
            "choose another cache_dir"
        ) from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except OSError as exc:
        problem = "it is a symbolic link" if os.path.islink(path) else describe_os_error(exc)
        raise StorageError(
            f"cannot use the shard cache {path}: {problem}; choose another cache_dir or remove it"
        ) from exc
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != os.geteuid():
            raise StorageError(
                f"cannot use the shard cache {path}: it belongs to another user (uid {st.st_uid}), "
                "who could plant shards in it; choose another cache_dir or remove it"
            )
        if mode & 0o077 and tighten and not mode & 0o022:
            os.fchmod(fd, 0o700)
        elif mode & 0o077:
            raise StorageError(
                f"cannot use the shard cache {path}: other users can reach it (mode {mode:04o}); "
                f"run 'chmod 700 {path}', choose another cache_dir, or remove it"
            )
    finally:
        os.close(fd)


def lock(fd: int, kind: int, wait: bool = True) -> bool:
    """Take the ``flock`` lock ``kind`` on ``fd``; without ``wait``, ``False`` if another holds it."""
    try:
        fcntl.flock(fd, kind if wait else kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def unlink_if_same(fd: int, path: str) -> None:
    """Remove ``path`` if it is still the file open as ``fd`` (not one made there since)."""
    try:
        now, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return
    if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
