"""Every byte in or out of a dataset goes through here, by fsspec URL or plain path.

A :class:`Store` is one folder (a prefix on object storage). Local folders use the
operating system directly (memory-mapped reads, rename-into-place writes); every
other protocol goes through fsspec. Writes are atomic: a reader sees a whole file or
none. The store knows nothing about ranks, shards or manifests.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import posixpath
import tempfile
import uuid
from collections.abc import Iterator
from typing import IO, Any

from .errors import StorageError

_FIXES = {
    errno.ENOSPC: "no space left on the device; free some space or choose another destination",
    errno.EDQUOT: "disk quota exceeded; free some space or choose another destination",
    errno.EROFS: "the file system is read-only; choose another destination",
    errno.EFBIG: "the file is larger than this file system or process allows",
    errno.EACCES: "permission denied; check the permissions (or credentials) for this location",
    errno.EPERM: "operation not permitted; check the permissions (or credentials) for this location",
    errno.ENOENT: "no such file or folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder, not a file",
}


def describe_os_error(exc: BaseException) -> str:
    """A short, human explanation of an OS or storage error."""
    if isinstance(exc, OSError) and exc.errno in _FIXES:
        return _FIXES[exc.errno]
    if isinstance(exc, FileNotFoundError):  # fsspec raises it without an errno
        return _FIXES[errno.ENOENT]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


@contextlib.contextmanager
def storage_errors(action: str, url: str) -> Iterator[None]:
    """Turn OS and fsspec errors raised inside into one-line :class:`StorageError` naming ``url``."""
    try:
        yield
    except StorageError:
        raise
    except (OSError, ValueError) as exc:
        raise StorageError(f"{action} {url}: {describe_os_error(exc)}") from exc


def is_url(path: str) -> bool:
    """Whether ``path`` names a protocol (``s3://...``) rather than a local path."""
    return "://" in path and not path.startswith("file://")


class Store:
    """One folder on local disk or object storage, addressed by URL or path."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        url = os.fspath(url)
        if url.startswith("file://"):
            url = url[len("file://"):]
        self.url = url.rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.local = not is_url(self.url)
        if self.local:  # plain OS calls; fsspec (slow to import) only for other protocols
            self.root = os.path.abspath(self.url)
            self.fs = None
        else:
            import fsspec

            with storage_errors("cannot open", self.url):
                self.fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self.root = root.rstrip("/")

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def path(self, name: str) -> str:
        """The filesystem path of ``name`` (a ``/``-separated path relative to this folder)."""
        if self.local:
            return os.path.join(self.root, *name.split("/"))
        return posixpath.join(self.root, name)

    def url_of(self, name: str) -> str:
        """The user-facing URL of ``name``, for messages."""
        if self.local:
            return self.path(name)
        return posixpath.join(self.url, name)

    def exists(self, name: str) -> bool:
        with storage_errors("cannot check", self.url_of(name)):
            if self.local:
                return os.path.exists(self.path(name))
            return bool(self.fs.exists(self.path(name)))

    def size(self, name: str) -> int:
        with storage_errors("cannot stat", self.url_of(name)):
            if self.local:
                return os.stat(self.path(name)).st_size
            return int(self.fs.size(self.path(name)))

    def read_bytes(self, name: str) -> bytes | mmap.mmap:
        """The whole object; local files are memory-mapped instead of copied."""
        with storage_errors("cannot read", self.url_of(name)):
            if self.local:
                with open(self.path(name), "rb") as f:
                    if os.fstat(f.fileno()).st_size == 0:
                        return b""
                    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            return self.fs.cat_file(self.path(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` atomically."""
        with self.open_write(name) as f:
            f.write(data)

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[IO[bytes]]:
        """A binary file whose content appears at ``name`` only when the block succeeds.

        Locally the data goes to a hidden temporary file beside the target and is renamed
        into place. Elsewhere it is spooled to a local temporary file and uploaded in one
        put, which object stores make visible atomically.
        """
        url = self.url_of(name)
        if self.local:
            final = self.path(name)
            tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp")
            with storage_errors("cannot write", url):
                os.makedirs(os.path.dirname(final), exist_ok=True)
                f = open(tmp, "wb", buffering=0)  # noqa: SIM115 - closed below; callers write in large pieces
            try:
                with storage_errors("cannot write", url):
                    yield f
                    f.close()
                    os.replace(tmp, final)
            finally:
                f.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            with tempfile.NamedTemporaryFile(prefix="shardstream-", suffix=".part") as f, \
                    storage_errors("cannot write", url):
                yield f
                f.flush()
                self.fs.put_file(f.name, self.path(name))

    def remove(self, name: str) -> None:
        with storage_errors("cannot remove", self.url_of(name)):
            if self.local:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(name))
            elif self.fs.exists(self.path(name)):
                self.fs.rm_file(self.path(name))

    def makedirs(self) -> None:
        """Create this folder (a no-op on object stores without folders)."""
        with storage_errors("cannot create", self.url):
            if self.local:
                os.makedirs(self.root, exist_ok=True)
            else:
                self.fs.makedirs(self.root, exist_ok=True)

    def is_dir(self) -> bool:
        with storage_errors("cannot check", self.url):
            if self.local:
                return os.path.isdir(self.root)
            return bool(self.fs.isdir(self.root))

    def list_files(self, recursive: bool = False) -> list[str]:
        """Names of the files in this folder (relative, ``/``-separated, sorted)."""
        with storage_errors("cannot list", self.url):
            if self.local:
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
            if not self.fs.exists(self.root):
                return []
            if recursive:
                paths = self.fs.find(self.root)
            else:
                paths = [e["name"] for e in self.fs.ls(self.root, detail=True) if e["type"] == "file"]
            prefix = self.root + "/"
            return sorted(p[len(prefix):] for p in paths if p.startswith(prefix))
