"""``LocalStore``: a folder on local disk, through the operating system (fsspec is never imported).

Reads are memory maps (no copy of a shard), writes go to a hidden temporary file beside the target
and are renamed into place, so a reader sees a whole file or none.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
import posixpath
import uuid
from collections.abc import Iterator
from typing import IO

from ..errors import StorageError
from .classify import describe_os_error, storage_errors
from .conditional import Expect
from .retry import DamagedRead
from .store import Check, PartCheck, Store, WholeFile, sink_errors

_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS)
_CANNOT_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


class LocalStore(Store):
    """One local folder (what ``Store(path)`` makes for a path or ``file://`` URL)."""

    local = True

    def _locate(self) -> str:
        return os.path.abspath(self.url)

    def path(self, name: str) -> str:
        self._inside(name)
        path = os.path.join(self.root, *name.split("/"))
        return os.path.normpath(path) if name.startswith("../") else path

    def url_of(self, name: str) -> str:
        return self.path(name)

    def exists(self, name: str) -> bool:
        with storage_errors("cannot check", self.url_of(name)):
            return os.path.exists(self.path(name))

    def size(self, name: str) -> int:
        with storage_errors("cannot stat", self.url_of(name)):
            return os.stat(self.path(name)).st_size

    def read_bytes(
        self, name: str, nbytes: int = 0, check: Check | None = None, advice: str = ""
    ) -> bytes | mmap.mmap:
        data = self.map_local(name)[0]
        try:
            return self._checked(name, data, check, advice)
        except DamagedRead as exc:
            raise exc.exhausted(1) from None

    def read_many(
        self, names: list[str], check: PartCheck | None = None, advice: str = ""
    ) -> list[bytes]:
        with storage_errors("cannot read", self.url):
            ends = [os.path.getsize(self.path(n)) for n in names]
        return self.read_ranges(names, [0] * len(names), ends, check, advice)

    def read_ranges(
        self,
        names: list[str],
        starts: list[int],
        ends: list[int],
        check: PartCheck | None = None,
        advice: str = "",
    ) -> list[bytes]:
        parts = []
        for name, start, end in zip(names, starts, ends):
            with storage_errors("cannot read", self.url_of(name)), open(self.path(name), "rb") as f:
                parts.append(os.pread(f.fileno(), end - start, start))
        try:
            return self._checked_parts(names, parts, check, advice)
        except DamagedRead as exc:
            raise exc.exhausted(1) from None

    def map_local(self, name: str) -> tuple[bytes | mmap.mmap, os.stat_result]:
        with storage_errors("cannot read", self.url_of(name)), open(self.path(name), "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size == 0:
                return b"", st
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), st

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[IO[bytes]]:
        """The data goes to a hidden temporary file beside the target, renamed into place at the end."""
        url = self.url_of(name)
        final = self.path(name)
        tmp = os.path.join(
            os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp"
        )
        with storage_errors("cannot write", url):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            f = WholeFile(tmp, "wb")  # unbuffered: callers write in large pieces
        try:
            with sink_errors(url, tmp):
                yield f
            with storage_errors("cannot write", url):
                f.close()
                os.replace(tmp, final)
        finally:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def remove(self, name: str) -> None:
        with (
            storage_errors("cannot remove", self.url_of(name)),
            contextlib.suppress(FileNotFoundError),
        ):
            os.unlink(self.path(name))

    def makedirs(self) -> None:
        with storage_errors("cannot create", self.url):
            os.makedirs(self.root, exist_ok=True)

    def is_dir(self) -> bool:
        with storage_errors("cannot check", self.url):
            return os.path.isdir(self.root)

    def list_files(self, recursive: bool = False) -> list[str]:
        with storage_errors("cannot list", self.url):
            if not os.path.isdir(self.root):
                return []
            if not recursive:
                return sorted(e.name for e in os.scandir(self.root) if e.is_file())
            out = []
            for dirpath, _, files in os.walk(self.root):
                rel = os.path.relpath(dirpath, self.root)
                for fn in files:
                    out.append(fn if rel == "." else posixpath.join(*rel.split(os.sep), fn))
            return sorted(out)

    def read_tagged(self, name: str) -> tuple[bytes, str] | None:
        """The bytes and their sha256 (the tag of a local file's version)."""
        try:
            data = bytes(self.read_bytes(name))
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise
        return data, hashlib.sha256(data).hexdigest()

    def write_if(
        self, name: str, data: bytes, expect: Expect, fsync: bool = False, locked: bool = False
    ) -> None:
        _place(self.path(name), data, expect, fsync, self.url_of(name), locked)

    def honours_conditions(self, scratch: str) -> bool:
        return True

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on the folder itself (no lock file is left behind)."""
        with storage_errors("cannot lock", self.url):
            os.makedirs(self.root, exist_ok=True)
        with _lock_folder(self.root):
            yield


@contextlib.contextmanager
def _lock_folder(folder: str) -> Iterator[None]:
    import fcntl  # POSIX

    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def _tag_of(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def _place(final: str, data: bytes, expect: Expect, fsync: bool, url: str, locked: bool) -> None:
    """Write ``final`` through a temporary file: a hard link for a new name, a checked rename for a version."""
    tmp = os.path.join(
        os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp"
    )
    try:
        with storage_errors("cannot write", url):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    try:
                        os.fsync(f.fileno())
                    except OSError as exc:
                        if exc.errno not in _CANNOT_SYNC:
                            raise StorageError(
                                f"cannot write {url}: {describe_os_error(exc)}"
                            ) from exc
            if expect.tag is None:
                try:
                    os.link(tmp, final)  # exclusive: fails if the name exists
                    return
                except FileExistsError:
                    raise expect.conflict(url) from None
                except OSError as exc:
                    if exc.errno not in _NO_LINKS:
                        raise
                    # no hard links on this file system: the same check as for a version, under the lock
            with contextlib.nullcontext() if locked else _lock_folder(os.path.dirname(final)):
                found = _tag_of(final)
                if found != expect.tag:
                    raise expect.conflict(url, found)
                os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


__all__ = ["LocalStore"]
