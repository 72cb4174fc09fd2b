"""A bounded local cache of downloaded shards, shared by the processes of one host.

Files are named by the shard's sha256 (re-packed datasets never read stale copies; identical
shards are stored once). A download goes to a temporary file renamed into place, so readers see
whole files only; while one process downloads a shard, the others wait for it, and if it fails
they get its error (a ``.KEY.failed`` record) instead of starting retries of their own.

A file is checked against its name once per version of it (its device, inode, size and
modification time, recorded in ``checked/``): one whose bytes no longer match (disk damage, a
crash of an older version, a user's mistake) is removed and fetched again, so a damaged cache
heals itself. That is one hash per cached file per host, not per read; a file this process wrote
from checked bytes is recorded as checked without hashing it again.

The cache is private: its folder is 0700 and refused if it is a link, another user's, or open to
others; files are 0600, opened without following links. Only checked bytes enter it (the caller
checks each download against its key); a file of the wrong size is removed and fetched again.

Coordination uses ``flock`` locks, which belong to open files: a crashed process holds none. A
reader keeps a shared lock on a shard while it maps it; eviction (least recently used first, by
the access time each open sets; the modification time stays the version's) takes an exclusive lock
without waiting and skips shards in use. The cache is trimmed when opened, before each download
and when a reader lets go of a shard; the half-written downloads of a crash go then too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
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
from ..errors import CorruptShardError, ShardstreamError, StorageError, UsageError
from .checked import checked_once, mark_checked, record_path
from .classify import describe_os_error
from .private import NOFOLLOW, lock, private_dir, unlink_if_same

log = logging.getLogger("shardstream")

_SUFFIX = ".shard"
_KEY = re.compile(r"[0-9a-f]{64}")
_PART = re.compile(r"^\.[0-9a-f]{64}\.part$")
_FAILED = re.compile(r"^\.[0-9a-f]{64}\.failed$")
# an unlocked partial download older than this was abandoned (its writer locks it at once)
_STALE_PART = 2.0
_FAILED_FOR = 10.0  # seconds a failed download is reported to newcomers instead of tried again
_CHUNK = 16 << 20  # bytes per write call
_REMAKE = 3  # times one download makes the removed folder again before it reads into memory
Download = Callable[[], "bytes | bytearray | memoryview"]


def default_cache_dir() -> str:
    """``<system temp>/shardstream-<uid>/cache``: shared by this user's runs on this host."""
    return os.path.join(tempfile.gettempdir(), f"shardstream-{os.getuid()}", "cache")


def _map_locked(fd: int) -> Any:
    """A read-only map of ``fd`` that keeps the shared lock taken on it: the map holds a
    duplicate of the descriptor, and an ``flock`` lasts until its last descriptor closes."""
    if os.fstat(fd).st_size == 0:
        return b""
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


class DiskCache:
    """Shards on local disk, by content hash, within ``limit`` bytes (``None``: half the free space now)."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        limit: int | None = None,
        quiet: bool = False,
    ):
        """``quiet``: say nothing when the disk is full (a cache of what can be made again, such as sample
        indexes, whose shard cache on the same disk says it)."""
        self.root = os.path.abspath(os.fspath(root)) if root is not None else default_cache_dir()
        if limit is not None and limit <= 0:
            raise UsageError(f"cache_limit must be positive, not {limit}")
        self.healed = 0  # cached files found damaged by this process, removed and fetched again
        self._warned = self._warned_space = quiet
        # a limit of half the free space says nothing about shards in use: a full disk says it (once)
        self._limit_given = limit is not None
        # no room at all (a full disk): downloads are read into memory, not cached (see :meth:`get`)
        self.full = not self._make_folder()
        if limit is None:
            st = os.statvfs(self.root) if not self.full else None
            limit = st.f_bavail * st.f_frsize // 2 if st is not None else 0
            self.full = limit <= 0
        self.limit = int(limit)
        if not self.full:
            self.trim()

    def warn_if_full(self) -> None:
        """Say (once) that shards will be read from memory, if the disk had no room when the cache was
        opened; a reader's process calls it when it opens a dataset, so its workers need not."""
        if self.full:
            self._warn_no_space("no space left on the device")

    def _make_folder(self) -> bool:
        """Make the cache's private folder; ``False`` if the disk has no room for it."""
        default = self.root == default_cache_dir()
        parent = os.path.dirname(self.root)
        try:
            if default:
                # a predictable name in a shared folder: others may have made it
                private_dir(parent, tighten=True)
            else:
                try:
                    os.makedirs(parent, exist_ok=True)
                except OSError as exc:
                    raise StorageError(
                        f"cannot create the shard cache {self.root}: {describe_os_error(exc)}; "
                        "choose another cache_dir"
                    ) from exc
            private_dir(self.root, tighten=default)
        except StorageError as exc:
            if getattr(exc.__cause__, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
                return False
            raise
        return True

    def _warn_no_space(self, why: str) -> None:
        if not self._warned_space:
            self._warned_space = True
            log.warning(
                "cannot keep shards in the cache %s: %s; reading them from memory instead (free some "
                "space there, lower cache_limit or choose another cache_dir)",
                self.root,
                why,
            )

    def __repr__(self) -> str:
        return f"DiskCache({self.root!r}, limit={self.limit})"

    def path(self, key: str) -> str:
        """The file of shard ``key``: a lower-case sha256 in hex, nothing else (so no name leaves the cache)."""
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise StorageError(
                f"{str(key)[:80]!r} is not a shard cache key (64 lower-case hex digits): the manifest "
                "is damaged or hostile; re-pack or re-index the dataset"
            )
        return os.path.join(self.root, key + _SUFFIX)

    def open(self, key: str, size: int | None = None, content: bool = False) -> Any | None:
        """The cached shard ``key``, mapped and locked against eviction; ``None`` if absent (or of
        another size than ``size``, or, with ``content`` (``key`` is the sha256 of the bytes), bytes
        that do not hash to it: such a file is removed, to be downloaded again)."""
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise StorageError(
                    f"cannot read the cached shard {path}: {describe_os_error(exc)}"
                ) from exc
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a link where a shard belongs: never followed
            return None
        try:
            lock(fd, fcntl.LOCK_SH)
            st = os.fstat(fd)
            if st.st_nlink == 0:  # evicted between open and lock
                return None
            if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
                log.warning(
                    "the cached shard %s has %d bytes, not %s; downloading it again",
                    path,
                    st.st_size,
                    size,
                )
                unlink_if_same(fd, path)
                return None
            if content and not self._intact(fd, path, key, st):
                return None
            # least recently used goes first; the mtime stays the version's
            with contextlib.suppress(OSError):
                os.utime(fd, ns=(time.time_ns(), st.st_mtime_ns))
            return self._mapped(fd)
        finally:
            os.close(fd)

    def get(
        self, key: str, download: Download, size: int | None = None, content: bool = False
    ) -> Any:
        """The shard ``key``: from the cache, or from ``download()`` (once per host at a time).

        ``download`` must return bytes checked against ``key`` (and ``size``, when given):
        what it returns is what later readers get. ``content``: ``key`` is the bytes' sha256, so a
        cached file is checked against it (once per version of the file) before it is served.
        """
        since = None  # when this call began waiting for another process's download
        remade = 0  # times the folder was made again in this call (a cleaner removed it)
        while True:
            found = self.open(key, size, content)
            if found is not None:
                return found
            if self.full:  # no room to keep it: from memory (said once)
                self.warn_if_full()
                return self._checked(download, size)
            record = self._failure(key, since)
            if record is not None:
                # its file could not be written: read it into memory, side by side
                if record.get("uncached"):
                    return self._checked(download, size)
                age = time.time() - float(record["time"])
                message = " ".join(str(record.get("message", "")).split())
                kind = getattr(errors, str(record.get("error")), None)
                kind = (
                    kind
                    if isinstance(kind, type) and issubclass(kind, ShardstreamError)
                    else StorageError
                )
                raise kind(
                    f"{message} (the same download failed in another process {age:.0f} s ago)"
                )
            part = os.path.join(self.root, f".{key}.part")
            try:
                fd = os.open(part, os.O_CREAT | os.O_EXCL | os.O_RDWR | NOFOLLOW, 0o600)
            except FileExistsError:
                since = since or time.time()
                self._wait_for(part)  # another process downloads it
                continue
            except FileNotFoundError:  # the folder was removed (a cleaner): made again
                remade += 1
                if remade <= _REMAKE and self._make_folder():
                    continue
                self._warn_no_space("its folder keeps disappearing")
                return self._checked(download, size)
            except OSError as exc:  # no room for a file, no permission: from memory
                self._warn_no_space(describe_os_error(exc))
                return self._checked(download, size)
            # finished by another process just before we claimed it
            found = self.open(key, size, content)
            if found is not None:
                unlink_if_same(fd, part)
                os.close(fd)
                return found
            return self._download(key, fd, part, download, size, content)

    @staticmethod
    def _checked(download: Download, size: int | None) -> Any:
        data = download()
        if size is not None and len(data) != size:
            raise CorruptShardError(
                f"a download gave {len(data)} bytes for a shard of {size}; it is not cached"
            )
        return data

    @staticmethod
    def _wait_for(part: str) -> None:
        """Wait while another process writes ``part``; remove it if its writer is gone."""
        try:
            fd = os.open(part, os.O_RDONLY | NOFOLLOW)
        except OSError:
            return  # finished or given up: look again
        fresh = False
        try:
            if lock(fd, fcntl.LOCK_EX, wait=False):  # nobody writes it
                fresh = time.time() - os.fstat(fd).st_mtime <= _STALE_PART
                if not fresh:
                    unlink_if_same(fd, part)
            else:
                lock(fd, fcntl.LOCK_SH)  # blocks until the download ends, one way or another
        finally:
            os.close(fd)
        if fresh:
            time.sleep(0.01)  # just created; its writer locks it next

    def _download(
        self, key: str, fd: int, part: str, download: Download, size: int | None, content: bool
    ) -> Any:
        try:
            lock(fd, fcntl.LOCK_EX)
            try:
                data = self._checked(download, size)
            except (
                ShardstreamError
            ) as exc:  # those waiting get it, rather than trying again in turn
                self._note(key, exc)
                raise
            # kept even if the work was called off meanwhile: the bytes are here and checked, and other
            # processes may be waiting for this file (dropping it made each of them download it again)
            self._make_room(len(data))
            try:
                self._write(fd, data)
                os.replace(part, self.path(key))
            except FileNotFoundError:
                return data  # the folder was removed meanwhile: the next download makes it again
            except (
                OSError
            ) as exc:  # no space, quota, I/O error: the checked bytes are here all the same
                self._warn_no_space(describe_os_error(exc))
                self._note(key, exc, uncached=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
                return data
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._failed_path(key))
            if content:  # written from checked bytes: no need to hash this version again
                mark_checked(self._record(key), _identity(os.fstat(fd)))
            lock(fd, fcntl.LOCK_SH)  # keep it from eviction while mapped
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
                # the blocks at once: faster writes, and no space fails here
                os.posix_fallocate(fd, 0, len(data))
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(fd, view[:_CHUNK]) :]

    # -- checking cached files against their names ------------------------------------------------------

    def _record(self, key: str) -> str:
        return record_path(self.root, key + ".ok")

    def _intact(self, fd: int, path: str, key: str, st: os.stat_result) -> bool:
        """Whether the cached file open as ``fd`` hashes to ``key`` (hashed once per version of the file);
        one that does not is removed, counted in :attr:`healed` and logged."""

        def hashes_to_key() -> bool:
            data = _map_locked(fd)
            try:
                return hashlib.sha256(data).hexdigest() == key
            finally:
                if not isinstance(data, bytes):
                    data.close()

        if checked_once(self._record(key), _identity(st), hashes_to_key):
            return True
        unlink_if_same(fd, path)
        self.healed += 1
        log.warning(
            "the cached shard %s does not match its sha256 (damaged on disk, or written by something "
            "else); removed it, downloading it again",
            path,
        )
        return False

    # -- failed downloads, as records the waiting processes read ---------------------------------------------

    def _failed_path(self, key: str) -> str:
        return os.path.join(self.root, f".{key}.failed")

    def _note(self, key: str, exc: BaseException, uncached: bool = False) -> None:
        record = {
            "time": time.time(),
            "error": type(exc).__name__,
            "message": str(exc),
            "uncached": uncached,
        }
        # best effort: without it, the waiting processes try in turn
        with contextlib.suppress(OSError):
            fd = os.open(
                self._failed_path(key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o600
            )
            try:
                os.write(fd, json.dumps(record).encode())
            finally:
                os.close(fd)

    def _failure(self, key: str, since: float | None) -> dict[str, Any] | None:
        """The failure of ``key``'s download noted since ``since`` (when a caller began waiting) or just now."""
        try:
            fd = os.open(self._failed_path(key), os.O_RDONLY | NOFOLLOW)
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
                        out.append((st.st_atime, entry.path, st.st_size))
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
        # a limit of its own (half the free space) says nothing when nothing is in use or the disk is
        # full: the disk-full warning says it
        if self._warned or total + nbytes <= self.limit:
            return
        if self._limit_given or (total and not self.full):
            self._warned = True
            coming = f" and {nbytes:,} for the shard arriving" if nbytes else ""
            log.warning(
                "the shard cache %s needs %s bytes (%s in shards being read%s), more than "
                "cache_limit=%s allows; raise cache_limit (it must hold the shards being read at once)",
                self.root,
                f"{total + nbytes:,}",
                f"{total:,}",
                coming,
                f"{self.limit:,}",
            )

    def discard(self, key: str) -> bool:
        """Remove the cached file ``key`` (one found damaged by what reads it), unless it is in use."""
        return self._evict(self.path(key))

    def _evict(self, path: str) -> bool:
        try:
            fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        except OSError:  # gone, or a link: not ours to follow
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return True
        try:
            if not lock(fd, fcntl.LOCK_EX, wait=False):
                return False  # someone reads it
            unlink_if_same(fd, path)
            with contextlib.suppress(OSError):
                os.unlink(self._record(os.path.basename(path)[: -len(_SUFFIX)]))
            return True
        finally:
            os.close(fd)

    def _clear_abandoned(self) -> None:
        """Remove old failure records and partial downloads whose writers are gone (a crash)."""
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.root):
                if _FAILED.match(entry.name):
                    with contextlib.suppress(OSError):
                        if (
                            time.time() - entry.stat(follow_symlinks=False).st_mtime
                            > 6 * _FAILED_FOR
                        ):
                            os.unlink(entry.path)
                if not _PART.match(entry.name):
                    continue
                try:
                    fd = os.open(entry.path, os.O_RDONLY | NOFOLLOW)
                except OSError:
                    continue
                try:
                    if (
                        lock(fd, fcntl.LOCK_EX, wait=False)
                        and time.time() - os.fstat(fd).st_mtime > _STALE_PART
                    ):
                        unlink_if_same(fd, entry.path)
                finally:
                    os.close(fd)


def _identity(st: os.stat_result) -> str:
    """A version of a file: device, inode, size and modification time (what a rewrite changes)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
