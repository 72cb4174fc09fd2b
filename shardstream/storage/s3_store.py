"""``S3Store``: an S3 prefix (AWS, or an S3-compatible server), whose writes can be conditional.

A conditional write is one PUT with ``If-None-Match: *`` (the name must be free) or ``If-Match:
<ETag>`` (it must still hold that version); the server answers 412 when the condition fails, which
is a :class:`~shardstream.storage.conditional.WriteConflict`. AWS S3, moto (5.2) and SeaweedFS
(4.48) honour both headers; a server that does not know them just writes, so
:meth:`S3Store.honours_conditions` asks it once with a scratch object.
"""

from __future__ import annotations

import errno
from typing import Any

from ..errors import StorageError
from .classify import storage_errors
from .conditional import Expect, WriteConflict
from .fsspec_store import FsspecStore

_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict")


class S3Store(FsspecStore):
    """One prefix in an S3 bucket (what ``Store(url)`` makes for ``s3://`` and ``s3a://``)."""

    # a GET from byte 0: without a range, s3fs asks for the object's size first (a HEAD per read)
    WHOLE = {"start": 0}  # read only

    def write_if(
        self, name: str, data: bytes, expect: Expect, fsync: bool = False, locked: bool = False
    ) -> None:
        url = self.url_of(name)
        self._writable(url)
        condition: dict[str, Any] = (
            {"IfNoneMatch": "*"} if expect.tag is None else {"IfMatch": expect.tag}
        )
        limit = self.retry.time_limit(len(data))
        if limit is not None:
            # taken by fsspec's sync(): the request is cancelled when it runs out
            condition["timeout"] = limit
        path = self.path(name)

        def put() -> None:
            try:
                self.fs.pipe_file(path, data, **condition)
            except Exception as exc:
                if _is_conflict(exc):
                    raise expect.conflict(url) from exc
                raise

        with storage_errors("cannot write", url):
            self.retry.call(put, lambda: f"cannot write {url}")

    def honours_conditions(self, scratch: str) -> bool:
        """``scratch`` is written, written again only if it does not exist, then removed: a server that ignores
        ``If-None-Match`` overwrites it."""
        self.write_bytes(scratch, b"probe")
        try:
            self.write_if(scratch, b"probe", Expect(None))
            honoured = False
        except WriteConflict:
            honoured = True
        except (
            StorageError
        ) as exc:  # 501 NotImplemented, or 400 for a header it does not know: no conditions
            if not isinstance(exc.__cause__, OSError) or exc.__cause__.errno not in (
                errno.ENOSYS,
                errno.EINVAL,
            ):
                raise
            honoured = False
        self.remove(scratch)
        return honoured


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


__all__ = ["S3Store"]
