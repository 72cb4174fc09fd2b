"""Conditional writes: an object written only while its name holds what the writer expects.

:func:`read_tagged` gives an object's bytes with a tag of their version; :func:`write_if` writes a
name only if it still holds nothing (``Expect(None)``) or that version (``Expect(tag)``), else raises
:class:`WriteConflict`. That is what makes a publish exclusive: of two writers that read the same
version, one writes and the other is refused.

- Local folders: the data goes to a temporary file beside the name (synced with ``fsync``); a new
  name is made by a hard link of it (atomic and exclusive on local and network file systems), a
  version is replaced by a check and rename under an exclusive ``flock`` on the folder (writers of
  this module exclude each other). The tag is the sha256 of the bytes.
- S3: one PUT with ``If-None-Match: *`` or ``If-Match: <ETag>``; the store answers 412 when the
  condition fails. AWS S3, moto (5.2) and SeaweedFS (4.48) honour both; :func:`honours_conditions`
  asks a store (one scratch object), because a server that does not know the headers just writes.
- Other object stores (GCS, memory): not supported here; :func:`write_if` writes unconditionally
  and :func:`honours_conditions` says ``False``, so that callers check afterwards instead.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import StorageError
from .classify import describe_os_error, storage_errors
from .store import Store

__all__ = ["Expect", "WriteConflict", "folder_lock", "honours_conditions", "read_tagged", "write_if"]

_S3 = ("s3", "s3a")
_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict")
_NO_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.EXDEV, errno.ENOSYS)
_CANNOT_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


class WriteConflict(StorageError):
    """A conditional write found its name holding something other than it expected: another writer was first."""


@dataclass(frozen=True)
class Expect:
    """What a conditional write expects to replace: ``tag=None`` nothing (the name is free), else the version
    whose :func:`read_tagged` tag this is."""

    tag: str | None = None


def read_tagged(store: Store, name: str) -> tuple[bytes, str] | None:
    """The object's bytes and a tag of their version (its ETag on object storage, the sha256 of the bytes
    locally), for a later :func:`write_if`; ``None`` if there is none. The tag is read before the bytes:
    bytes newer than their tag make a write conditional on it fail, never succeed."""
    try:
        if store.local:
            data = bytes(store.read_bytes(name))
            return data, hashlib.sha256(data).hexdigest()
        url = store.url_of(name)

        def info() -> dict[str, Any]:
            store.fs.invalidate_cache()  # fsspec's listings never expire: others change the bucket meanwhile
            return store.fs.info(store.path(name))

        with storage_errors("cannot stat", url):
            found = store.retry.call(info, lambda: f"cannot stat {url}")
        tag = found.get("ETag") or found.get("etag") or found.get("generation")
        data = bytes(store.read_bytes(name))
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise
    return data, str(tag) if tag is not None else hashlib.sha256(data).hexdigest()


def honours_conditions(store: Store, scratch: str) -> bool:
    """Whether ``store`` refuses a conditional write whose condition fails. Local folders do; S3 is asked:
    ``scratch`` (a name of the caller's) is written, written again only if it does not exist, then removed
    (a server that ignores ``If-None-Match`` overwrites it). Other stores: ``False``."""
    if store.local:
        return True
    if store.protocol not in _S3:
        return False
    store.write_bytes(scratch, b"probe")
    try:
        write_if(store, scratch, b"probe", Expect(None))
        honoured = False
    except WriteConflict:
        honoured = True
    except StorageError as exc:  # 501 NotImplemented, or 400 for a header it does not know: no conditions
        if not isinstance(exc.__cause__, OSError) or exc.__cause__.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        honoured = False
    store.remove(scratch)
    return honoured


def write_if(store: Store, name: str, data: bytes, expect: Expect, fsync: bool = False, locked: bool = False
             ) -> None:
    """Write ``data`` to ``name`` atomically, only if ``name`` holds what ``expect`` says (see the module's
    documentation); else :class:`WriteConflict`. With ``fsync`` (local folders) the bytes are on disk before
    they get the name; ``locked``: the caller holds :func:`folder_lock` (local folders). Stores without
    conditional writes just write."""
    url = store.url_of(name)
    if store.read_only:
        raise StorageError(f"cannot write {url}: {store.protocol}:// URLs are read-only")
    if store.local:
        _place_local(store.path(name), data, expect, fsync, url, locked)
    elif store.protocol in _S3:
        _put_s3(store, name, data, expect)
    else:
        store.write_bytes(name, data)


def _conflict(url: str, expect: Expect, found: str | None = "") -> WriteConflict:
    held = ("already exists" if expect.tag is None else "is gone" if found is None
            else "holds another version than expected")
    return WriteConflict(f"cannot write {url}: it {held} (another writer was first)")


def _is_conflict(exc: BaseException) -> bool:
    """Whether a client error is a refused condition (HTTP 412, or S3's 409 for a concurrent conditional write)."""
    for error in (exc, exc.__cause__):
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _CONFLICT_CODES or status == 412:
                return True
    return False


def _put_s3(store: Store, name: str, data: bytes, expect: Expect) -> None:
    url = store.url_of(name)
    condition: dict[str, Any] = {"IfNoneMatch": "*"} if expect.tag is None else {"IfMatch": expect.tag}
    limit = store.retry.time_limit(len(data))
    if limit is not None:
        condition["timeout"] = limit  # taken by fsspec's sync(): the request is cancelled when it runs out

    def put() -> None:
        try:
            store.fs.pipe_file(store.path(name), data, **condition)
        except Exception as exc:
            if _is_conflict(exc):
                raise _conflict(url, expect) from exc
            raise

    with storage_errors("cannot write", url):
        store.retry.call(put, lambda: f"cannot write {url}")


@contextlib.contextmanager
def folder_lock(store: Store) -> Iterator[None]:
    """Within the block, this process holds an exclusive ``flock`` on the store's local folder (taken on the
    folder itself: no lock file is left behind); a no-op for object stores. Not reentrant."""
    if not store.local:
        yield
        return
    with storage_errors("cannot lock", store.url):
        os.makedirs(store.root, exist_ok=True)
    with _folder_lock(store.root):
        yield


@contextlib.contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    import fcntl  # POSIX

    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def _local_tag(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def _place_local(final: str, data: bytes, expect: Expect, fsync: bool, url: str, locked: bool) -> None:
    tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.{uuid.uuid4().hex[:8]}.tmp")
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
                            raise StorageError(f"cannot write {url}: {describe_os_error(exc)}") from exc
            if expect.tag is None:
                try:
                    os.link(tmp, final)  # exclusive: fails if the name exists
                    return
                except FileExistsError:
                    raise _conflict(url, expect) from None
                except OSError as exc:
                    if exc.errno not in _NO_LINKS:
                        raise
                    # no hard links on this file system: the same check as for a version, under the lock
            with contextlib.nullcontext() if locked else _folder_lock(os.path.dirname(final)):
                found = _local_tag(final)
                if found != expect.tag:
                    raise _conflict(url, expect, found)
                os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
