"""Every byte in or out of a dataset goes through here, by fsspec URL or plain path.

A :class:`Store` is one folder (a prefix on object storage). Local folders use the
operating system directly (memory-mapped reads, rename-into-place writes); every
other protocol goes through fsspec, with transient errors (resets, timeouts, 5xx,
throttling) retried with backoff under a :class:`RetryPolicy` and permanent ones
(missing object, access denied) reported at once. ``http(s)://`` is read-only. Writes
are atomic: a reader sees a whole file or none. The store knows nothing about ranks,
shards or manifests.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import posixpath
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..errors import StorageError
from .classify import describe_os_error, storage_errors
from .retry import DamagedRead, RetryPolicy

_READ_ONLY = ("http", "https")
_BUCKETS = ("s3", "s3a", "gs", "gcs")  # object stores: prefixes need no creating, buckets are not made on the fly
_LOOKUPS = ("exists", "size", "isdir", "ls", "find", "info")
PART_SIZE = 64 << 20  # bytes per ranged GET when a large object is read whole (shards download side by side too)
_CONNECTING = threading.Lock()  # one client per store, however many threads want one at once

Check = Callable[[bytes], "str | None"]  # what is wrong with bytes read (``None``: nothing)
PartCheck = Callable[[int, bytes], "str | None"]  # the same for the i-th of several reads


def _new_lock_after_fork() -> None:
    global _CONNECTING
    _CONNECTING = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_after_fork)


def connection_options(url: str, endpoint_url: str | None = None, anon: bool = False,
                       profile: str | None = None) -> dict[str, Any]:
    """fsspec storage options for ``url``'s protocol from the common settings: an endpoint
    (S3-compatible stores, a GCS emulator), anonymous access, an AWS profile."""
    protocol = url.split("://", 1)[0].lower() if is_url(url) else "file"
    out: dict[str, Any] = {}
    if endpoint_url:
        if protocol not in ("s3", "s3a", "gs", "gcs"):
            raise StorageError(f"an endpoint URL applies to s3:// and gs:// locations, not {url}")
        out["endpoint_url"] = endpoint_url
    if anon:
        if protocol in ("gs", "gcs"):
            out["token"] = "anon"
        elif protocol in ("s3", "s3a"):
            out["anon"] = True
    if profile:
        if protocol not in ("s3", "s3a"):
            raise StorageError(f"a profile names AWS credentials; it applies to s3:// locations, not {url}")
        out["profile"] = profile
    return out


def is_url(path: str) -> bool:
    """Whether ``path`` names a protocol (``s3://...``) rather than a local path."""
    return "://" in path and not path.startswith("file://")


class Store:
    """One folder on local disk or object storage, addressed by URL or path.

    ``storage_options`` go to fsspec (``endpoint_url``, ``anon``, ``profile``...);
    ``retry`` says how remote requests are retried and timed out.
    """

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None):
        url = os.fspath(url)
        if url.startswith("file://"):
            url = url[len("file://"):]
        self.url = url.rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.local = not is_url(self.url)
        self.protocol = "file" if self.local else self.url.split("://", 1)[0].lower()
        self.read_only = self.protocol in _READ_ONLY
        self._fs: Any = None
        self._pid = 0
        if self.local:  # plain OS calls; fsspec (slow to import) only for other protocols
            self.root = os.path.abspath(self.url)
        else:
            self.root = self._connect()[1].rstrip("/")

    def _connect(self) -> tuple[Any, str]:
        import fsspec

        options = dict(self.storage_options)
        single = self.protocol in ("s3", "s3a") and "retries" not in options.get("config_kwargs", {})
        if single:  # one attempt per call in the client, so that retries and timeouts are this store's alone
            options["config_kwargs"] = {**options.get("config_kwargs", {}), "retries": {"max_attempts": 0}}
            options["skip_instance_cache"] = True  # and so that the fsspec instance others share is left as it is
        with storage_errors("cannot open", self.url):
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **options)
            except TypeError as exc:
                raise StorageError(f"cannot open {self.url}: {exc}; check the storage options") from exc
        if single:
            fs.retries = 1  # s3fs's own loop (its class default is 5)
        self._fs, self._pid = fs, os.getpid()
        return fs, root

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (``None`` for local folders); made anew in a forked child, whose
        parent's event loop thread does not exist there, by one thread while the others wait."""
        if not self.local and (self._fs is None or self._pid != os.getpid()):
            with _CONNECTING:
                if self._fs is None or self._pid != os.getpid():
                    self._connect()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None  # reconnected where it is used
        return state

    def _remote(self, action: str, name: str | None, method: str, *args: Any, nbytes: int = 0,
                finish: Callable[[Any], Any] | None = None, **kwargs: Any) -> Any:
        """``self.fs.<method>(*args)`` (then ``finish(result)``, in the same attempt) with the retry
        policy; errors name the URL."""
        url = self.url if name is None else self.url_of(name)
        fs = self.fs
        limit = self.retry.time_limit(nbytes)
        from fsspec.asyn import AsyncFileSystem

        if limit is not None and isinstance(fs, AsyncFileSystem):
            kwargs["timeout"] = limit  # taken by fsspec's sync(): the request is cancelled when it runs out

        def attempt() -> Any:
            if method in _LOOKUPS:  # fsspec's listings cache never expires: others change the bucket meanwhile
                self.fs.invalidate_cache()
            result = getattr(self.fs, method)(*args, **kwargs)
            if isinstance(result, list):  # fsspec before 2026.6 returns failed ranges as exceptions
                for item in result:
                    if isinstance(item, BaseException):
                        raise item
            return result if finish is None else finish(result)

        with storage_errors(action, url):
            try:
                return self.retry.call(attempt, lambda: f"{action} {url}")
            except TypeError as exc:  # fsspec hands storage options on to the client lazily
                raise StorageError(f"{action} {url}: {exc}; check the storage options") from exc

    def _writable(self, url: str) -> None:
        if self.read_only:
            raise StorageError(f"cannot write {url}: {self.protocol}:// URLs are read-only; write to a local "
                               "folder or a bucket (s3://, gs://) and serve that")

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def path(self, name: str) -> str:
        """The filesystem path of ``name`` (a ``/``-separated path relative to this folder).

        Names never leave the folder: an absolute name, a ``..`` segment or a URL is refused.
        """
        self._inside(name)
        if self.local:
            return os.path.join(self.root, *name.split("/"))
        return posixpath.join(self.root, name)

    def url_of(self, name: str) -> str:
        """The user-facing URL of ``name``, for messages."""
        if self.local:
            return self.path(name)
        self._inside(name)
        return posixpath.join(self.url, name)

    def _inside(self, name: str) -> None:
        if (not isinstance(name, str) or not name or name.startswith(("/", "\\")) or "://" in name or "\0" in name
                or ".." in name.replace("\\", "/").split("/")):
            shown = repr(name)[:200]
            raise StorageError(f"{shown} is not a name inside {self.url}: names are relative '/'-separated paths "
                               "without '..' segments; the manifest (or the caller) points outside the dataset, "
                               "re-pack or re-index it")

    def exists(self, name: str) -> bool:
        if not self.local:
            return bool(self._remote("cannot check", name, "exists", self.path(name)))
        with storage_errors("cannot check", self.url_of(name)):
            return os.path.exists(self.path(name))

    def size(self, name: str) -> int:
        if not self.local:
            return int(self._remote("cannot stat", name, "size", self.path(name)))
        with storage_errors("cannot stat", self.url_of(name)):
            return os.stat(self.path(name)).st_size

    def read_bytes(self, name: str, nbytes: int = 0, check: Check | None = None,
                   advice: str = "") -> bytes | mmap.mmap:
        """The whole object; local files are memory-mapped instead of copied.

        Given its size ``nbytes`` (from a manifest), an object on object storage comes in
        concurrent ranged GETs of up to :data:`PART_SIZE`, with no request for its size first.
        ``check(data)`` says what is wrong with bytes that arrived (or ``None``); damaged bytes
        are read again within the same retry budget as transport errors, and in the end raise
        :class:`~shardstream.errors.CorruptShardError` ending with ``advice``.
        """
        url = self.url_of(name)

        def checked(data: Any) -> Any:
            problem = None if check is None else check(data)
            if problem is not None:
                raise DamagedRead(url, problem, advice)
            return data

        if not self.local:
            if nbytes <= 0 or self.read_only:  # plain HTTP servers need not honour ranges
                return self._remote("cannot read", name, "cat_file", self.path(name), nbytes=nbytes, finish=checked)
            starts = list(range(0, nbytes, PART_SIZE))
            ends = [min(start + PART_SIZE, nbytes) for start in starts]
            path = self.path(name)
            return self._remote("cannot read", name, "cat_ranges", [path] * len(starts), starts, ends,
                                on_error="raise", nbytes=nbytes,
                                finish=lambda parts: checked(parts[0] if len(parts) == 1 else b"".join(parts)))
        data = self.map_local(name)[0]
        try:
            return checked(data)
        except DamagedRead as exc:
            raise exc.exhausted(1) from None

    def read_many(self, names: list[str], check: PartCheck | None = None, advice: str = "") -> list[bytes]:
        """Small objects read whole, in one call (concurrent GETs); ``check(i, data)`` as in :meth:`read_ranges`."""
        if self.local or not names:
            with storage_errors("cannot read", self.url):
                ends = [os.path.getsize(self.path(n)) for n in names]
            return self.read_ranges(names, [0] * len(names), ends, check, advice)
        paths = [self.path(n) for n in names]
        return self._remote("cannot read", names[0], "cat", paths, on_error="raise",
                            finish=lambda found: self._checked_parts(names, [found[p] for p in paths], check, advice))

    def read_ranges(self, names: list[str], starts: list[int], ends: list[int], check: PartCheck | None = None,
                    advice: str = "") -> list[bytes]:
        """Bytes ``starts[i]:ends[i]`` of each ``names[i]``: all in one call (concurrent ranged GETs on object
        storage), ``check(i, data)`` as in :meth:`read_bytes`, within the same retry budget."""
        if not self.local and names:
            return self._remote("cannot read", names[0], "cat_ranges", [self.path(n) for n in names], starts, ends,
                                on_error="raise", nbytes=sum(ends) - sum(starts),
                                finish=lambda parts: self._checked_parts(names, parts, check, advice))
        parts = []
        for name, start, end in zip(names, starts, ends):
            with storage_errors("cannot read", self.url_of(name)), open(self.path(name), "rb") as f:
                parts.append(os.pread(f.fileno(), end - start, start))
        try:
            return self._checked_parts(names, parts, check, advice)
        except DamagedRead as exc:
            raise exc.exhausted(1) from None

    def _checked_parts(self, names: list[str], parts: list[Any], check: PartCheck | None, advice: str) -> list[bytes]:
        for i, part in enumerate(parts):
            problem = None if check is None else check(i, part)
            if problem is not None:
                raise DamagedRead(self.url_of(names[i]), problem, advice)
        return parts

    def map_local(self, name: str) -> tuple[bytes | mmap.mmap, os.stat_result]:
        """A local file's bytes, memory-mapped, and the status of exactly the file mapped."""
        with storage_errors("cannot read", self.url_of(name)), open(self.path(name), "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size == 0:
                return b"", st
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), st

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` atomically."""
        with self.open_write(name) as f:
            f.write(data)

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[IO[bytes]]:
        """A binary file whose content appears at ``name`` only when the block succeeds.

        Locally the data goes to a hidden temporary file beside the target and is renamed
        into place. Elsewhere it is spooled to an unnamed local temporary file (a killed
        process leaves nothing behind) and uploaded in one put, which object stores make
        visible atomically. Failures of the file itself (writes, no space) and of publishing
        it are :class:`StorageError`; the block's own exceptions pass through unchanged.
        """
        url = self.url_of(name)
        self._writable(url)
        if self.local:
            final = self.path(name)
            tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp")
            with storage_errors("cannot write", url):
                os.makedirs(os.path.dirname(final), exist_ok=True)
                f = open(tmp, "wb", buffering=0)  # noqa: SIM115 - closed below; callers write in large pieces
            try:
                with _sink_errors(url, tmp):
                    yield f
                with storage_errors("cannot write", url):
                    f.close()
                    os.replace(tmp, final)
            finally:
                f.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        else:
            with storage_errors("cannot write", url):
                f, spooled = _spool()
            try:
                with _sink_errors(url, spooled):
                    yield f
                self._remote("cannot write", name, "put_file", spooled, self.path(name), nbytes=f.tell())
            finally:
                f.close()
                if not spooled.startswith("/proc/"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(spooled)

    def remove(self, name: str) -> None:
        self._writable(self.url_of(name))
        if not self.local:
            if self.exists(name):
                self._remote("cannot remove", name, "rm_file", self.path(name))
            return
        with storage_errors("cannot remove", self.url_of(name)), contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(name))

    def makedirs(self) -> None:
        """Create this folder (a no-op on object stores without folders)."""
        self._writable(self.url)
        if not self.local:
            bucket = self.root.split("/", 1)[0]
            if self.protocol in _BUCKETS and not self._remote("cannot check", None, "exists", bucket):
                raise StorageError(f"cannot write {self.url}: the bucket {bucket!r} does not exist (or these "
                                   "credentials cannot see it); create it first, or check the name")
            if self.protocol not in _BUCKETS:
                self._remote("cannot create", None, "makedirs", self.root, exist_ok=True)
            return
        with storage_errors("cannot create", self.url):
            os.makedirs(self.root, exist_ok=True)

    def is_dir(self) -> bool:
        if not self.local:
            return bool(self._remote("cannot check", None, "isdir", self.root))
        with storage_errors("cannot check", self.url):
            return os.path.isdir(self.root)

    def list_files(self, recursive: bool = False) -> list[str]:
        """Names of the files in this folder (relative, ``/``-separated, sorted)."""
        if not self.local:
            if not self._remote("cannot list", None, "exists", self.root):
                return []
            if recursive:
                paths = self._remote("cannot list", None, "find", self.root)
            else:
                paths = [e["name"] for e in self._remote("cannot list", None, "ls", self.root, detail=True)
                         if e["type"] == "file"]
            prefix = self.root + "/"
            return sorted(p[len(prefix):] for p in paths if p.startswith(prefix))
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


def _spool() -> tuple[IO[bytes], str]:
    """An unbuffered temporary file for an upload, and a path that opens it for the uploader: on
    Linux an unnamed file (gone with the process, however it ends) reached through ``/proc``."""
    f = tempfile.TemporaryFile(prefix="shardstream-", suffix=".part", buffering=0)  # noqa: SIM115 - the caller closes it
    proc = f"/proc/self/fd/{f.fileno()}"
    if os.path.exists(proc):
        return f, proc
    f.close()  # no /proc: a named file, removed when the upload ends
    f = tempfile.NamedTemporaryFile(prefix="shardstream-", suffix=".part", buffering=0, delete=False)  # noqa: SIM115
    return f, f.name


@contextlib.contextmanager
def _sink_errors(url: str, path: str) -> Iterator[None]:
    """OS errors of the file being written (no space, I/O errors) as a one-line :class:`StorageError`;
    anything else the block raises (its own errors, those of files it reads) passes unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.filename not in (None, path):
            raise
        raise StorageError(f"cannot write {url}: {describe_os_error(exc)}") from exc
