"""Every byte in or out of a dataset goes through a :class:`Store`: one folder (a prefix on object storage).

``Store(url)`` picks the backend, as fsspec picks a filesystem by protocol: :class:`LocalStore`
(:mod:`.local_store`) for local folders, which uses the operating system directly (memory-mapped
reads, rename-into-place writes), and :class:`FsspecStore` (:mod:`.fsspec_store`) for every other
protocol, with transient errors (resets, timeouts, 5xx, throttling) retried with backoff under a
:class:`RetryPolicy` and permanent ones (missing object, access denied) reported at once.
``http(s)://`` is read-only. Writes are atomic: a reader sees a whole file or none. A store knows
nothing about ranks, shards or manifests; names inside it never leave it.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import mmap
import os
from collections.abc import Callable, Iterator
from typing import IO, Any

from ..errors import StorageError
from .conditional import Expect
from .retry import DamagedRead, RetryPolicy
from .urls import READ_ONLY, connection_options, is_url, normalize, protocol_of

# protocol -> the backend's class by dotted path, imported when first used (as fsspec's registry); "*": any other
BACKENDS = {
    "file": "shardstream.storage.local_store:LocalStore",
    "s3": "shardstream.storage.s3_store:S3Store",
    "s3a": "shardstream.storage.s3_store:S3Store",
    "*": "shardstream.storage.fsspec_store:FsspecStore",
}
Check = Callable[[bytes], "str | None"]  # what is wrong with bytes read (``None``: nothing)
PartCheck = Callable[[int, bytes], "str | None"]  # the same for the i-th of several reads


class Store:
    """One folder on local disk or object storage, addressed by URL or path.

    ``Store(url, ...)`` makes the backend the URL needs (:class:`LocalStore` or :class:`FsspecStore`).
    ``storage_options`` go to fsspec (``endpoint_url``, ``anon``, ``profile``...); ``retry`` says how
    remote requests are retried and timed out.
    """

    local: bool
    root: str
    # folders outside this one that names may start with (``../a``): the shards a merged or split dataset
    # reads where they are (see :meth:`reach`)
    roots: tuple[str, ...] = ()
    # full-URL roots the manifest declares: not names here (see reach), named in errors
    url_roots: tuple[str, ...] = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Store:
        # the factory: the backend by protocol (subclasses, and unpickling, come as they are)
        if cls is Store:
            url = normalize(args[0] if args else kwargs["url"])
            module, _, name = BACKENDS.get(protocol_of(url), BACKENDS["*"]).partition(":")
            cls = getattr(importlib.import_module(module), name)
        return super().__new__(cls)

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ):
        self.url = normalize(url)
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.protocol = protocol_of(self.url)
        self.read_only = self.protocol in READ_ONLY
        self.root = self._locate()

    def _locate(self) -> str:
        """The folder's path in its filesystem (connecting to it where the backend needs to)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    # -- names -------------------------------------------------------------------------------------
    def path(self, name: str) -> str:
        """The filesystem path of ``name`` (a ``/``-separated path relative to this folder).

        Names never leave the folder: an absolute name, a ``..`` segment or a URL is refused.
        """
        raise NotImplementedError

    def url_of(self, name: str) -> str:
        """The user-facing URL of ``name``, for messages."""
        raise NotImplementedError

    def is_local(self, name: str) -> bool:
        """Whether ``name`` is a local file (mapped, not downloaded): this store's kind, for every name of
        one folder (a :class:`~shardstream.storage.routed.RoutedStore` says it per name)."""
        return self.local

    def reach(self, roots: list[str]) -> None:
        """Let names start with ``roots``: relative folders beside this one (``../a``, ``../../b/c``), as a
        manifest that reads other datasets' shards where they are declares them. On object storage they stay
        inside the bucket. Full-URL roots (``s3://bucket/a``) are not names here: only a
        :class:`~shardstream.storage.routed.RoutedStore` the reader made for them reads them."""
        self.url_roots = tuple(root for root in roots if "://" in root)
        roots = [root for root in roots if "://" not in root]
        for root in roots:
            problem = root_problem(root)
            ups = root.split("/").count("..")
            if problem is None and not self.local and ups > self.root.count("/"):
                problem = "climbs out of the bucket"
            if problem is not None:
                raise StorageError(
                    f"{root!r:.80} is not a folder beside {self.url}: it {problem}; the manifest that "
                    "names it is damaged, re-create it"
                )
        self.roots = tuple(roots)

    def _beyond(self, name: str) -> bool:
        """Whether ``name`` lies under one of :attr:`roots` (checked as a name inside it)."""
        if not self.roots or not name.startswith("../"):
            return False
        for root in self.roots:
            if name.startswith(root + "/"):
                self._inside(name[len(root) + 1 :])
                return True
        return False

    def _inside(self, name: str) -> None:
        if self._beyond(name):
            return
        if (
            not isinstance(name, str)
            or not name
            or name.startswith(("/", "\\"))
            or "://" in name
            or "\0" in name
            or ".." in name.replace("\\", "/").split("/")
        ):
            shown = repr(name)[:200]
            declared = [
                r for r in self.url_roots if isinstance(name, str) and name.startswith(r + "/")
            ]
            if declared:
                raise StorageError(
                    f"{shown} is under {declared[0]!r:.120}, outside {self.url}; read a dataset that "
                    "names shards by full URL with ShardDataset, ShardMap or MixedDataset and "
                    f"StorageSettings(trusted_roots={{{declared[0]!r:.120}: {{...fsspec options}}}}), "
                    "or a command with --trust-root"
                )
            raise StorageError(
                f"{shown} is not a name inside {self.url}: names are relative '/'-separated paths "
                "without '..' segments; the manifest (or the caller) points outside the dataset, "
                "re-pack or re-index it"
            )

    def _writable(self, url: str) -> None:
        if self.read_only:
            raise StorageError(
                f"cannot write {url}: {self.protocol}:// URLs are read-only; write to a local "
                "folder or a bucket (s3://, gs://) and serve that"
            )

    # -- reading -----------------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        """The fsspec filesystem (``None`` for local folders)."""
        return None

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def size(self, name: str) -> int:
        raise NotImplementedError

    def read_bytes(
        self, name: str, nbytes: int = 0, check: Check | None = None, advice: str = ""
    ) -> bytes | mmap.mmap:
        """The whole object; local files are memory-mapped instead of copied.

        Given its size ``nbytes`` (from a manifest), an object on object storage comes in
        concurrent ranged GETs of up to ``PART_SIZE``, with no request for its size first.
        ``check(data)`` says what is wrong with bytes that arrived (or ``None``); damaged bytes
        are read again within the same retry budget as transport errors, and in the end raise
        :class:`~shardstream.errors.CorruptShardError` ending with ``advice``.
        """
        raise NotImplementedError

    def read_many(
        self, names: list[str], check: PartCheck | None = None, advice: str = ""
    ) -> list[bytes]:
        """Small objects read whole, in one call (concurrent GETs), each retried alone as in :meth:`read_ranges`;
        ``check(i, data)`` as there."""
        raise NotImplementedError

    def read_ranges(
        self,
        names: list[str],
        starts: list[int],
        ends: list[int],
        check: PartCheck | None = None,
        advice: str = "",
    ) -> list[bytes]:
        """Bytes ``starts[i]:ends[i]`` of each ``names[i]``: all in one call (concurrent ranged GETs on object
        storage), ``check(i, data)`` as in :meth:`read_bytes`, within the same retry budget. Each request is
        retried alone, with the whole budget: a request that fails (or whose bytes fail ``check``) is
        made again, the others are not; an error names the object whose request failed."""
        raise NotImplementedError

    def map_local(self, name: str) -> tuple[bytes | mmap.mmap, os.stat_result]:
        """A local file's bytes, memory-mapped, and the status of exactly the file mapped."""
        raise StorageError(
            f"cannot map {self.url_of(name)}: only files in a local folder are mapped"
        )

    def _checked(self, name: str, data: Any, check: Check | None, advice: str) -> Any:
        problem = None if check is None else check(data)
        if problem is not None:
            raise DamagedRead(self.url_of(name), problem, advice)
        return data

    def _checked_parts(
        self, names: list[str], parts: list[Any], check: PartCheck | None, advice: str
    ) -> list[bytes]:
        for i, part in enumerate(parts):
            problem = None if check is None else check(i, part)
            if problem is not None:
                raise DamagedRead(self.url_of(names[i]), problem, advice)
        return parts

    # -- writing -----------------------------------------------------------------------------------
    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name`` atomically."""
        with self.open_write(name) as f:
            f.write(data)

    def open_write(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A binary file whose content appears at ``name`` only when the block succeeds. Failures of the
        file itself (writes, no space) and of publishing it are :class:`StorageError`; the block's own
        exceptions pass through unchanged."""
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError

    def makedirs(self) -> None:
        """Create this folder (a no-op on object stores without folders)."""
        raise NotImplementedError

    def is_dir(self) -> bool:
        raise NotImplementedError

    def list_files(self, recursive: bool = False) -> list[str]:
        """Names of the files in this folder (relative, ``/``-separated, sorted)."""
        raise NotImplementedError

    # -- conditional writes: an exclusive publish (see :mod:`.conditional`) ------------------------
    def read_tagged(self, name: str) -> tuple[bytes, str] | None:
        """The object's bytes and a tag of their version, for a later :meth:`write_if`; ``None`` if there is
        none. The tag is read before the bytes: bytes newer than their tag make a write conditional on it
        fail, never succeed."""
        raise NotImplementedError

    def write_if(
        self, name: str, data: bytes, expect: Expect, fsync: bool = False, locked: bool = False
    ) -> None:
        """Write ``data`` to ``name`` atomically, only if ``name`` holds what ``expect`` says; else
        :class:`~shardstream.storage.conditional.WriteConflict`. With ``fsync`` (local folders) the bytes are
        on disk before they get the name; ``locked``: the caller holds :meth:`locked`. A store without
        conditional writes (:meth:`honours_conditions` is ``False``) just writes."""
        self._writable(self.url_of(name))
        self.write_bytes(name, data)

    def honours_conditions(self, scratch: str) -> bool:
        """Whether this store refuses a conditional write whose condition fails (``scratch``: a name of the
        caller's that a store may write and remove to find out)."""
        return False

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Within the block, this process holds the folder's exclusive lock (local folders; a no-op
        elsewhere). Not reentrant."""
        return contextlib.nullcontext()


def root_problem(root: object) -> str | None:
    """What keeps ``root`` from being a folder beside a dataset's (one or more ``..`` segments, then plain
    ones), or None."""
    if not isinstance(root, str) or not root.startswith("../") and root != "..":
        return "does not start with '../'"
    segments = root.split("/")
    ups = 0
    while ups < len(segments) and segments[ups] == "..":
        ups += 1
    rest = segments[ups:]
    if any(s in ("", ".", "..") or "\\" in s or "\0" in s or "://" in s for s in rest):
        return "has an empty, '.' or '..' segment after its leading '..' ones"
    return None


class WholeFile(io.FileIO):
    """An unbuffered file whose :meth:`write` writes all it is given or raises: a file system that is
    nearly full takes part of a write (the system call returns fewer bytes) and refuses the rest with
    ``ENOSPC`` on the next call, which a single unchecked ``write`` never makes; the file :meth:`Store.open_write`
    yields is one, so no writer can publish a file cut short."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = view.nbytes
        while view.nbytes:
            written = super().write(view)
            if not written:  # None (non-blocking) or 0: nothing was taken, nothing will be
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
        return total


@contextlib.contextmanager
def sink_errors(url: str, path: str) -> Iterator[None]:
    """OS errors of the file being written (no space, I/O errors) as a one-line :class:`StorageError`;
    anything else the block raises (its own errors, those of files it reads) passes unchanged."""
    from .classify import describe_os_error

    try:
        yield
    except OSError as exc:
        if exc.filename not in (None, path):
            raise
        raise StorageError(f"cannot write {url}: {describe_os_error(exc)}") from exc


__all__ = [
    "Check",
    "PartCheck",
    "Store",
    "WholeFile",
    "connection_options",
    "is_url",
    "sink_errors",
]
