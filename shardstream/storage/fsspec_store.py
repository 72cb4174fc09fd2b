"""``FsspecStore``: a folder (a prefix) on object storage or any other fsspec filesystem.

Every call goes through :meth:`FsspecStore._call` under the store's :class:`RetryPolicy`
(transient errors retried with backoff, permanent ones reported at once, errors naming the URL);
several reads in one call (:meth:`FsspecStore.read_ranges`, :meth:`FsspecStore.read_many`) through
:meth:`FsspecStore._each`, which retries each request alone, each with its own timeout.
Large objects come in concurrent ranged GETs; writes are spooled to an unnamed local temporary
file and uploaded in one put, which object stores make visible atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..errors import StorageError
from .classify import as_storage_error, is_transient, storage_errors
from .inherited import track
from .retry import DamagedRead
from .store import Check, PartCheck, Store, WholeFile, sink_errors
from .urls import BUCKETS

# bytes per ranged GET when a large object is read whole (shards download side by side too)
PART_SIZE = 64 << 20
_CONNECTING = threading.Lock()  # one client per store, however many threads want one at once
FsCall = Callable[
    [Any, dict[str, Any]], Any
]  # (filesystem, extra keywords such as a timeout) -> result


def _new_lock_after_fork() -> None:
    global _CONNECTING
    _CONNECTING = threading.Lock()  # a thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_new_lock_after_fork)


class FsspecStore(Store):
    """One folder on an fsspec filesystem (what ``Store(url)`` makes for ``s3://``, ``gs://``, ``http://``...)."""

    local = False
    _fs: Any = None  # the filesystem, made by _connect in the process that uses it
    _pid = 0
    # what a whole read of an object of unknown size passes to the filesystem (see S3Store)
    WHOLE: dict[str, Any] = {}  # read only

    def _locate(self) -> str:
        return self._connect()[1].rstrip("/")

    def _connect(self) -> tuple[Any, str]:
        import fsspec

        options = dict(self.storage_options)
        single = self.protocol in ("s3", "s3a") and "retries" not in options.get(
            "config_kwargs", {}
        )
        if single:  # one attempt per call in the client, so that retries and timeouts are this store's alone
            options["config_kwargs"] = {
                **options.get("config_kwargs", {}),
                "retries": {"max_attempts": 0},
            }
            # and so that the fsspec instance others share is left as it is
            options["skip_instance_cache"] = True
        with storage_errors("cannot open", self.url):
            try:
                fs, root = fsspec.core.url_to_fs(self.url, **options)
            except TypeError as exc:
                raise StorageError(
                    f"cannot open {self.url}: {exc}; check the storage options"
                ) from exc
        if single:
            fs.retries = 1  # s3fs's own loop (its class default is 5)
        self._fs, self._pid = fs, os.getpid()
        track(self)  # a forked child keeps it, never closes it (see .inherited)
        return fs, root

    @property
    def fs(self) -> Any:
        """The fsspec filesystem; made anew in a forked child, whose parent's event loop thread does not
        exist there, by one thread while the others wait."""
        if self._fs is None or self._pid != os.getpid():
            with _CONNECTING:
                if self._fs is None or self._pid != os.getpid():
                    self._connect()
        return self._fs

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None  # reconnected where it is used
        return state

    def _call(
        self,
        action: str,
        name: str | None,
        call: FsCall,
        *,
        nbytes: int = 0,
        lookup: bool = False,
        finish: Callable[[Any], Any] | None = None,
    ) -> Any:
        """``call(fs, extra)`` (then ``finish(result)``, in the same attempt) under the retry policy, errors
        naming the URL; ``extra`` holds a timeout for async filesystems (fsspec's ``sync`` cancels the
        request when it runs out); ``lookup``: the call reads listings, whose cache is dropped first."""
        url = self.url if name is None else self.url_of(name)
        limit = self.retry.time_limit(nbytes)
        from fsspec.asyn import AsyncFileSystem

        extra = (
            {"timeout": limit} if limit is not None and isinstance(self.fs, AsyncFileSystem) else {}
        )

        def attempt() -> Any:
            if lookup:  # fsspec's listings cache never expires: others change the bucket meanwhile
                self.fs.invalidate_cache()
            result = call(self.fs, extra)
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

    def path(self, name: str) -> str:
        self._inside(name)
        path = posixpath.join(self.root, name)
        return posixpath.normpath(path) if name.startswith("../") else path

    def url_of(self, name: str) -> str:
        self._inside(name)
        if name.startswith("../"):  # under a root beside this folder (Store.reach)
            return f"{self.protocol}://{self.path(name)}"
        return posixpath.join(self.url, name)

    def exists(self, name: str) -> bool:
        path = self.path(name)
        return bool(
            self._call("cannot check", name, lambda fs, kw: fs.exists(path, **kw), lookup=True)
        )

    def size(self, name: str) -> int:
        path = self.path(name)
        return int(self._call("cannot stat", name, lambda fs, kw: fs.size(path, **kw), lookup=True))

    def read_bytes(
        self, name: str, nbytes: int = 0, check: Check | None = None, advice: str = ""
    ) -> bytes:
        path = self.path(name)
        if nbytes <= 0 or self.read_only:  # plain HTTP servers need not honour ranges
            return self._call(
                "cannot read",
                name,
                lambda fs, kw: fs.cat_file(path, **self.WHOLE, **kw),
                nbytes=nbytes,
                finish=lambda data: self._checked(name, data, check, advice),
            )
        starts = list(range(0, nbytes, PART_SIZE))
        ends = [min(start + PART_SIZE, nbytes) for start in starts]

        def whole(parts: list[bytes]) -> bytes:
            return self._checked(
                name, parts[0] if len(parts) == 1 else b"".join(parts), check, advice
            )

        return self._call(
            "cannot read",
            name,
            lambda fs, kw: fs.cat_ranges(
                [path] * len(starts), starts, ends, on_error="raise", **kw
            ),
            nbytes=nbytes,
            finish=whole,
        )

    def read_many(
        self, names: list[str], check: PartCheck | None = None, advice: str = ""
    ) -> list[bytes]:
        if not names:
            return []
        paths = [self.path(n) for n in names]

        def many(fs: Any, todo: list[int]) -> list[Any]:
            found = fs.cat([paths[i] for i in todo], on_error="return", **self.WHOLE)
            return [found[paths[i]] for i in todo]

        return self._each(
            names,
            [0] * len(names),
            lambda fs, i: fs._cat_file(paths[i], **self.WHOLE),
            many,
            check,
            advice,
        )

    def read_ranges(
        self,
        names: list[str],
        starts: list[int],
        ends: list[int],
        check: PartCheck | None = None,
        advice: str = "",
    ) -> list[bytes]:
        if not names:
            return []
        paths = [self.path(n) for n in names]

        def many(fs: Any, todo: list[int]) -> list[Any]:
            return fs.cat_ranges(
                [paths[i] for i in todo],
                [starts[i] for i in todo],
                [ends[i] for i in todo],
                on_error="return",
            )

        return self._each(
            names,
            [end - start for start, end in zip(starts, ends)],
            lambda fs, i: fs._cat_file(paths[i], start=starts[i], end=ends[i]),
            many,
            check,
            advice,
        )

    def _each(  # the requests, and how to make one or several
        self,
        names: list[str],
        sizes: list[int],
        one: Callable[[Any, int], Any],
        many: Callable[[Any, list[int]], list[Any]],
        check: PartCheck | None,
        advice: str,
    ) -> list[bytes]:
        """Request ``i`` for each of ``names``, all at once, each retried alone under the retry policy (see
        :meth:`RetryPolicy.call_each`): a batch of ranged reads in which a few fail makes those few again,
        not the whole batch. On an async filesystem ``one(fs, i)`` is request ``i``'s coroutine, with its
        own timeout (a stalled request fails alone); elsewhere ``many(fs, todo)`` makes several, each
        result the bytes or the exception it ended in. ``sizes[i]``: bytes request ``i`` moves."""
        from fsspec.asyn import AsyncFileSystem, sync

        def attempt(todo: list[int]) -> list[Any]:
            fs = self.fs
            if isinstance(fs, AsyncFileSystem):
                found = sync(fs.loop, self._gather, fs, todo, one, sizes)
            else:
                found = many(fs, todo)
            return [self._outcome(names[i], i, part, check, advice) for i, part in zip(todo, found)]

        with storage_errors("cannot read", self.url_of(names[0])):
            try:
                return self.retry.call_each(
                    len(names), attempt, lambda i: f"cannot read {self.url_of(names[i])}"
                )
            except TypeError as exc:  # fsspec hands storage options on to the client lazily
                raise StorageError(
                    f"cannot read {self.url_of(names[0])}: {exc}; check the storage options"
                ) from exc

    async def _gather(
        self, fs: Any, todo: list[int], one: Callable[[Any, int], Any], sizes: list[int]
    ) -> list[Any]:
        """Requests ``todo`` concurrently (at most the filesystem's batch size at a time), each within its
        own time limit; per request its result or the exception it ended in."""
        import asyncio

        slots = asyncio.Semaphore(max(1, int(getattr(fs, "batch_size", None) or 128)))

        async def request(i: int) -> Any:
            async with slots:
                return await asyncio.wait_for(one(fs, i), self.retry.time_limit(sizes[i]))

        return await asyncio.gather(*(request(i) for i in todo), return_exceptions=True)

    def _outcome(self, name: str, i: int, part: Any, check: PartCheck | None, advice: str) -> Any:
        """Request ``i``'s result as :meth:`RetryPolicy.call_each` takes it: the bytes, a
        :class:`DamagedRead` if they fail ``check``, a transient error as it is (retried), any other as
        the one-line error naming ``name`` it ends in."""
        if isinstance(part, BaseException):
            return (
                part
                if is_transient(part)
                else as_storage_error("cannot read", self.url_of(name), part)
            )
        problem = None if check is None else check(i, part)
        return part if problem is None else DamagedRead(self.url_of(name), problem, advice)

    @contextlib.contextmanager
    def open_write(self, name: str) -> Iterator[IO[bytes]]:
        """The data is spooled to an unnamed local temporary file (a killed process leaves nothing behind)
        and uploaded in one put, which object stores make visible atomically."""
        url = self.url_of(name)
        self._writable(url)
        with storage_errors("cannot write", url):
            f, spooled = _spool()
        try:
            with sink_errors(url, spooled):
                yield f
            path, nbytes = self.path(name), f.tell()
            self._call(
                "cannot write", name, lambda fs, kw: fs.put_file(spooled, path, **kw), nbytes=nbytes
            )
        finally:
            f.close()
            if not spooled.startswith("/proc/"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(spooled)

    def remove(self, name: str) -> None:
        self._writable(self.url_of(name))
        if self.exists(name):
            path = self.path(name)
            self._call("cannot remove", name, lambda fs, kw: fs.rm_file(path, **kw))

    def makedirs(self) -> None:
        self._writable(self.url)
        bucket = self.root.split("/", 1)[0]
        if self.protocol in BUCKETS:
            if not self._call(
                "cannot check", None, lambda fs, kw: fs.exists(bucket, **kw), lookup=True
            ):
                raise StorageError(
                    f"cannot write {self.url}: the bucket {bucket!r} does not exist (or these "
                    "credentials cannot see it); create it first, or check the name"
                )
            return
        self._call(
            "cannot create", None, lambda fs, kw: fs.makedirs(self.root, exist_ok=True, **kw)
        )

    def is_dir(self) -> bool:
        return bool(
            self._call("cannot check", None, lambda fs, kw: fs.isdir(self.root, **kw), lookup=True)
        )

    def list_files(self, recursive: bool = False) -> list[str]:
        if not self._call(
            "cannot list", None, lambda fs, kw: fs.exists(self.root, **kw), lookup=True
        ):
            return []
        if recursive:
            paths = self._call(
                "cannot list", None, lambda fs, kw: fs.find(self.root, **kw), lookup=True
            )
        else:
            entries = self._call(
                "cannot list", None, lambda fs, kw: fs.ls(self.root, detail=True, **kw), lookup=True
            )
            paths = [e["name"] for e in entries if e["type"] == "file"]
        prefix = self.root + "/"
        return sorted(p[len(prefix) :] for p in paths if p.startswith(prefix))

    def read_tagged(self, name: str) -> tuple[bytes, str] | None:
        """The bytes and the object's ETag (or generation; their sha256 where the store gives neither)."""
        path = self.path(name)
        try:
            found = self._call("cannot stat", name, lambda fs, kw: fs.info(path, **kw), lookup=True)
            data = bytes(self.read_bytes(name))
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise
        tag = found.get("ETag") or found.get("etag") or found.get("generation")
        return data, str(tag) if tag is not None else hashlib.sha256(data).hexdigest()


def _spool() -> tuple[IO[bytes], str]:
    """An unbuffered temporary file for an upload (a :class:`WholeFile`: a full temporary folder fails the
    write instead of cutting the upload short), and a path that opens it for the uploader: on Linux an
    unnamed file (gone with the process, however it ends) reached through ``/proc``."""
    made = tempfile.TemporaryFile(prefix="shardstream-", suffix=".part", buffering=0)  # noqa: SIM115 - handed on below
    with made:
        f = WholeFile(os.dup(made.fileno()), "wb+")
    proc = f"/proc/self/fd/{f.fileno()}"
    if os.path.exists(proc):
        return f, proc
    f.close()  # no /proc: a named file, removed when the upload ends
    fd, path = tempfile.mkstemp(prefix="shardstream-", suffix=".part")
    return WholeFile(fd, "wb+"), path


__all__ = ["PART_SIZE", "FsspecStore"]
