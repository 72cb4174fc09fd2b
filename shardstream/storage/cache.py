"""A bounded local cache of downloaded shards, shared by the processes of one host.

Files are named by the shard's sha256 (re-packed datasets never read stale copies; identical
shards are stored once). A download goes to a temporary file renamed into place, so readers see
whole files only; while one process downloads a shard, the others wait for it, and if it fails
they get its error (a ``.KEY.failed`` record) instead of starting retries of their own.

The cache is private: its folder is 0700 and refused if it is a link, another user's, or open to
others; files are 0600, opened without following links. Only checked bytes enter it (the caller
checks each download against its key); a file of the wrong size is removed and fetched again.

Coordination uses ``flock`` locks, which belong to open files: a crashed process holds none. A
reader keeps a shared lock on a shard while it maps it; eviction (least recently used first, down
to the limit) takes an exclusive lock without waiting and skips shards in use. The cache is
trimmed when opened, before each download and when a reader lets go of a shard; the half-written
downloads of a crash go then too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import re
import stat
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

from .. import errors
from ..errors import CorruptShardError, ShardstreamError, StorageError
from .classify import describe_os_error
from .retry import check_cancelled

log = logging.getLogger("shardstream")

_SUFFIX = ".shard"
_KEY = re.compile(r"[0-9a-f]{64}")
_PART = re.compile(r"^\.[0-9a-f]{64}\.part$")
_FAILED = re.compile(r"^\.[0-9a-f]{64}\.failed$")
_STALE_PART = 2.0  # an unlocked partial download older than this was abandoned (its writer locks it at once)
_FAILED_FOR = 10.0  # seconds a failed download is reported to newcomers instead of tried again
_CHUNK = 16 << 20  # bytes written between checks that the work was not called off
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
Download = Callable[[], "bytes | bytearray | memoryview"]


def default_cache_dir() -> str:
    """``<system temp>/shardstream-<uid>/cache``: shared by this user's runs on this host."""
    return os.path.join(tempfile.gettempdir(), f"shardstream-{os.getuid()}", "cache")


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
        raise StorageError(f"cannot create the shard cache {path}: {describe_os_error(exc)}; "
                           "choose another cache_dir") from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as exc:
        problem = "it is a symbolic link" if os.path.islink(path) else describe_os_error(exc)
        raise StorageError(f"cannot use the shard cache {path}: {problem}; choose another cache_dir "
                           "or remove it") from exc
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != os.geteuid():
            raise StorageError(f"cannot use the shard cache {path}: it belongs to another user (uid {st.st_uid}), "
                               "who could plant shards in it; choose another cache_dir or remove it")
        if mode & 0o077 and tighten and not mode & 0o022:
            os.fchmod(fd, 0o700)
        elif mode & 0o077:
            raise StorageError(f"cannot use the shard cache {path}: other users can reach it (mode {mode:04o}); "
                               f"run 'chmod 700 {path}', choose another cache_dir, or remove it")
    finally:
        os.close(fd)


def _lock(fd: int, kind: int, wait: bool = True) -> bool:
    try:
        fcntl.flock(fd, kind if wait else kind | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _unlink_if_same(fd: int, path: str) -> None:
    """Remove ``path`` if it is still the file open as ``fd`` (not one made there since)."""
    try:
        now, held = os.lstat(path), os.fstat(fd)
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
        default = self.root == default_cache_dir()
        parent = os.path.dirname(self.root)
        if default:
            private_dir(parent, tighten=True)  # a predictable name in a shared folder: others may have made it
        else:
            try:
                os.makedirs(parent, exist_ok=True)
            except OSError as exc:
                raise StorageError(f"cannot create the shard cache {self.root}: {describe_os_error(exc)}; "
                                   "choose another cache_dir") from exc
        private_dir(self.root, tighten=default)
        if limit is None:
            st = os.statvfs(self.root)
            limit = st.f_bavail * st.f_frsize // 2
        if limit <= 0:
            raise ValueError(f"cache_limit must be positive, not {limit}")
        self.limit = int(limit)
        self._warned = self._warned_space = False
        self.trim()

    def __repr__(self) -> str:
        return f"DiskCache({self.root!r}, limit={self.limit})"

    def path(self, key: str) -> str:
        """The file of shard ``key``: a lower-case sha256 in hex, nothing else (so no name leaves the cache)."""
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise StorageError(f"{str(key)[:80]!r} is not a shard cache key (64 lower-case hex digits): the manifest "
                               "is damaged or hostile; re-pack or re-index the dataset")
        return os.path.join(self.root, key + _SUFFIX)

    def open(self, key: str, size: int | None = None) -> Any | None:
        """The cached shard ``key``, mapped and locked against eviction; ``None`` if absent (or of
        another size than ``size``: such a file is removed, to be downloaded again)."""
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise StorageError(f"cannot read the cached shard {path}: {describe_os_error(exc)}") from exc
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a link where a shard belongs: never followed
            return None
        try:
            _lock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            if st.st_nlink == 0:  # evicted between open and lock
                return None
            if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
                log.warning("the cached shard %s has %d bytes, not %s; downloading it again", path, st.st_size, size)
                _unlink_if_same(fd, path)
                return None
            with contextlib.suppress(OSError):
                os.utime(fd)  # least recently used goes first
            return self._mapped(fd)
        finally:
            os.close(fd)

    def get(self, key: str, download: Download, size: int | None = None) -> Any:
        """The shard ``key``: from the cache, or from ``download()`` (once per host at a time).

        ``download`` must return bytes checked against ``key`` (and ``size``, when given):
        what it returns is what later readers get.
        """
        since = None  # when this call began waiting for another process's download
        while True:
            found = self.open(key, size)
            if found is not None:
                return found
            record = self._failure(key, since)
            if record is not None:
                if record.get("uncached"):  # its file could not be written: read it into memory, side by side
                    return self._checked(download, size)
                age = time.time() - float(record["time"])
                message = " ".join(str(record.get("message", "")).split())
                kind = getattr(errors, str(record.get("error")), None)
                kind = kind if isinstance(kind, type) and issubclass(kind, ShardstreamError) else StorageError
                raise kind(f"{message} (the same download failed in another process {age:.0f} s ago)")
            part = os.path.join(self.root, f".{key}.part")
            try:
                fd = os.open(part, os.O_CREAT | os.O_EXCL | os.O_RDWR | _NOFOLLOW, 0o600)
            except FileExistsError:
                since = since or time.time()
                self._wait_for(part)  # another process downloads it
                continue
            found = self.open(key, size)  # finished by another process just before we claimed the download
            if found is not None:
                _unlink_if_same(fd, part)
                os.close(fd)
                return found
            return self._download(key, fd, part, download, size)

    @staticmethod
    def _checked(download: Download, size: int | None) -> Any:
        data = download()
        if size is not None and len(data) != size:
            raise CorruptShardError(f"a download gave {len(data)} bytes for a shard of {size}; it is not cached")
        return data

    @staticmethod
    def _wait_for(part: str) -> None:
        """Wait while another process writes ``part``; remove it if its writer is gone."""
        try:
            fd = os.open(part, os.O_RDONLY | _NOFOLLOW)
        except OSError:
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

    def _download(self, key: str, fd: int, part: str, download: Download, size: int | None) -> Any:
        try:
            _lock(fd, fcntl.LOCK_EX)
            try:
                data = self._checked(download, size)
            except ShardstreamError as exc:  # those waiting get it, rather than trying again in turn
                self._note(key, exc)
                raise
            check_cancelled()
            self._make_room(len(data))
            try:
                self._write(fd, data)
                os.replace(part, self.path(key))
            except OSError as exc:  # no space, quota, I/O error: the checked bytes are here all the same
                if not self._warned_space:
                    self._warned_space = True
                    log.warning("cannot keep shards in the cache %s: %s; reading them from memory instead (lower "
                                "cache_limit or choose another cache_dir)", self.root, describe_os_error(exc))
                self._note(key, exc, uncached=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                return data
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._failed_path(key))
            _lock(fd, fcntl.LOCK_SH)  # keep it from eviction while mapped
            return self._mapped(fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            raise
        finally:
            os.close(fd)

    @staticmethod
    def _write(fd: int, data: bytes | bytearray | memoryview) -> None:
        if len(data):
            try:
                os.posix_fallocate(fd, 0, len(data))  # the blocks at once: faster writes, and no space fails here
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
        view = memoryview(data).cast("B")
        while view:
            check_cancelled()  # a closed prefetcher's download writes nothing more
            view = view[os.write(fd, view[:_CHUNK]):]

    # -- failed downloads, as records the waiting processes read ---------------------------------------------

    def _failed_path(self, key: str) -> str:
        return os.path.join(self.root, f".{key}.failed")

    def _note(self, key: str, exc: BaseException, uncached: bool = False) -> None:
        record = {"time": time.time(), "error": type(exc).__name__, "message": str(exc), "uncached": uncached}
        with contextlib.suppress(OSError):  # best effort: without it, the waiting processes try in turn
            fd = os.open(self._failed_path(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o600)
            try:
                os.write(fd, json.dumps(record).encode())
            finally:
                os.close(fd)

    def _failure(self, key: str, since: float | None) -> dict[str, Any] | None:
        """The failure of ``key``'s download noted since ``since`` (when a caller began waiting) or just now."""
        try:
            fd = os.open(self._failed_path(key), os.O_RDONLY | _NOFOLLOW)
        except OSError:
            return None
        try:
            record = json.loads(os.read(fd, 1 << 16))
            when = float(record["time"])
        except (ValueError, KeyError, TypeError, OSError):
            return None
        finally:
            os.close(fd)
        if time.time() - when <= _FAILED_FOR or (since is not None and when >= since):
            return record
        return None

    # -- size: trimming to the limit ------------------------------------------------------------------------

    def _mapped(self, fd: int) -> Any:
        """A locked map of ``fd``; when the reader lets go of it, the cache is trimmed."""
        data = _map_locked(fd)
        if not isinstance(data, bytes):
            weakref.finalize(data, self.trim).atexit = False
        return data

    def trim(self) -> None:
        """Evict unused shards, oldest first, until the cache is within its limit."""
        with contextlib.suppress(OSError):  # also runs wherever a released map is collected
            self._make_room(0)

    def usage(self) -> int:
        """Bytes of shards in the cache (all processes')."""
        return sum(size for _, _, size in self._entries())

    def _entries(self) -> list[tuple[float, str, int]]:
        out = []
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if entry.name.endswith(_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat(follow_symlinks=False)
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
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
        except OSError:  # gone, or a link: not ours to follow
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True
        try:
            if not _lock(fd, fcntl.LOCK_EX, wait=False):
                return False  # someone reads it
            _unlink_if_same(fd, path)
            return True
        finally:
            os.close(fd)

    def _clear_abandoned(self) -> None:
        """Remove old failure records and partial downloads whose writers are gone (a crash)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if _FAILED.match(entry.name):
                    with contextlib.suppress(OSError):
                        if time.time() - entry.stat(follow_symlinks=False).st_mtime > 6 * _FAILED_FOR:
                            os.unlink(entry.path)
                if not _PART.match(entry.name):
                    continue
                try:
                    fd = os.open(entry.path, os.O_RDONLY | _NOFOLLOW)
                except OSError:
                    continue
                try:
                    if _lock(fd, fcntl.LOCK_EX, wait=False) and time.time() - os.fstat(fd).st_mtime > _STALE_PART:
                        _unlink_if_same(fd, entry.path)
                finally:
                    os.close(fd)
