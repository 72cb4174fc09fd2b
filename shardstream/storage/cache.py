"""A bounded local cache of downloaded shards, shared by the processes of one host.

Files are named by the shard's sha256, so a re-packed dataset never reads a stale
copy and identical shards are stored once. A download goes to a temporary file that
is renamed into place, so readers see whole files only; while one process downloads
a shard, the others that need it wait for that download instead of repeating it.

Coordination uses ``flock`` locks, which belong to open files: a process that crashes
holds none, so nothing stale can block a later run. A reader keeps a shared lock on a
shard for as long as it maps it; eviction (least recently used first, once the total
passes the limit) takes an exclusive lock without waiting and skips shards in use.
Files left by a crash (half-written downloads) are removed by the next eviction pass.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ..errors import StorageError
from .classify import describe_os_error

log = logging.getLogger("shardstream")

_SUFFIX = ".shard"
_PART = re.compile(r"^\.[0-9a-f]{64}\.part$")
_STALE_PART = 2.0  # an unlocked partial download older than this was abandoned (its writer locks it at once)


def default_cache_dir() -> str:
    """``<system temp>/shardstream-<uid>/cache``: shared by this user's runs on this host."""
    return os.path.join(tempfile.gettempdir(), f"shardstream-{os.getuid()}", "cache")


def _lock(fd: int, kind: int, wait: bool = True) -> bool:
    try:
        fcntl.flock(fd, kind if wait else kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _unlink_if_same(fd: int, path: str) -> None:
    """Remove ``path`` if it is still the file open as ``fd`` (not one made there since)."""
    try:
        now, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return
    if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _map_locked(fd: int) -> Any:
    """A read-only map of ``fd`` that keeps the shared lock taken on it: the map holds a
    duplicate of the descriptor, and an ``flock`` lasts until its last descriptor closes."""
    if os.fstat(fd).st_size == 0:
        return b""
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


class DiskCache:
    """Shards on local disk, by content hash, within ``limit`` bytes (``None``: half the free space now)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, limit: int | None = None):
        self.root = os.path.abspath(os.fspath(root)) if root is not None else default_cache_dir()
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot create the shard cache {self.root}: {describe_os_error(exc)}; "
                               "choose another cache_dir") from exc
        if limit is None:
            stat = os.statvfs(self.root)
            limit = stat.f_bavail * stat.f_frsize // 2
        if limit <= 0:
            raise ValueError(f"cache_limit must be positive, not {limit}")
        self.limit = int(limit)
        self._warned = False

    def __repr__(self) -> str:
        return f"DiskCache({self.root!r}, limit={self.limit})"

    def path(self, key: str) -> str:
        return os.path.join(self.root, key + _SUFFIX)

    def open(self, key: str) -> Any | None:
        """The cached shard ``key``, mapped and locked against eviction; ``None`` if absent."""
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            _lock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_nlink == 0:  # evicted between open and lock
                return None
            with contextlib.suppress(OSError):
                os.utime(path)  # least recently used goes first
            return _map_locked(fd)
        finally:
            os.close(fd)

    def get(self, key: str, download: Callable[[], bytes | bytearray | memoryview]) -> Any:
        """The shard ``key``: from the cache, or from ``download()`` (once per host at a time)."""
        while True:
            found = self.open(key)
            if found is not None:
                return found
            part = os.path.join(self.root, f".{key}.part")
            try:
                fd = os.open(part, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
            except FileExistsError:
                self._wait_for(part)  # another process downloads it
                continue
            found = self.open(key)  # finished by another process just before we claimed the download
            if found is not None:
                _unlink_if_same(fd, part)
                os.close(fd)
                return found
            return self._download(key, fd, part, download)

    @staticmethod
    def _wait_for(part: str) -> None:
        """Wait while another process writes ``part``; remove it if its writer is gone."""
        try:
            fd = os.open(part, os.O_RDONLY)
        except FileNotFoundError:
            return  # finished or given up: look again
        fresh = False
        try:
            if _lock(fd, fcntl.LOCK_EX, wait=False):  # nobody writes it
                fresh = time.time() - os.fstat(fd).st_mtime <= _STALE_PART
                if not fresh:
                    _unlink_if_same(fd, part)
            else:
                _lock(fd, fcntl.LOCK_SH)  # blocks until the download ends, one way or another
        finally:
            os.close(fd)
        if fresh:
            time.sleep(0.01)  # just created; its writer locks it next

    def _download(self, key: str, fd: int, part: str, download: Callable[[], bytes | bytearray | memoryview]) -> Any:
        try:
            _lock(fd, fcntl.LOCK_EX)
            data = download()
            self._make_room(len(data))
            try:
                if len(data):
                    os.posix_fallocate(fd, 0, len(data))  # the blocks at once: faster writes, and no space fails here
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.replace(part, self.path(key))
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise StorageError(f"cannot cache a shard in {self.root}: {describe_os_error(exc)}; "
                                       "lower cache_limit or choose another cache_dir") from exc
                raise StorageError(f"cannot cache a shard in {self.root}: {describe_os_error(exc)}") from exc
            _lock(fd, fcntl.LOCK_SH)  # keep it from eviction while mapped
            return _map_locked(fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            raise
        finally:
            os.close(fd)

    def usage(self) -> int:
        """Bytes of shards in the cache (all processes')."""
        return sum(size for _, _, size in self._entries())

    def _entries(self) -> list[tuple[float, str, int]]:
        out = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if entry.name.endswith(_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat()
                        out.append((st.st_mtime, entry.path, st.st_size))
        return out

    def _make_room(self, nbytes: int) -> None:
        """Evict unused shards, oldest first, until ``nbytes`` more fit under the limit."""
        self._clear_abandoned()
        entries = sorted(self._entries())
        total = sum(size for _, _, size in entries)
        for _, path, size in entries:
            if total + nbytes <= self.limit:
                return
            if self._evict(path):
                total -= size
        if total + nbytes > self.limit and not self._warned:
            self._warned = True
            log.warning("the shard cache %s holds %d bytes in use, more than cache_limit=%d allows; "
                        "raise cache_limit (it must hold the shards being read at once)", self.root, total, self.limit)

    @staticmethod
    def _evict(path: str) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            if not _lock(fd, fcntl.LOCK_EX, wait=False):
                return False  # someone reads it
            _unlink_if_same(fd, path)
            return True
        finally:
            os.close(fd)

    def _clear_abandoned(self) -> None:
        """Remove partial downloads whose writers are gone (a crash); leave running ones alone."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if not _PART.match(entry.name):
                    continue
                try:
                    fd = os.open(entry.path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                try:
                    if _lock(fd, fcntl.LOCK_EX, wait=False) and time.time() - os.fstat(fd).st_mtime > _STALE_PART:
                        _unlink_if_same(fd, entry.path)
                finally:
                    os.close(fd)
