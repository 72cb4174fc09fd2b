"""Storage errors, classified: what is transient (retry it) and what is permanent (report it),
and how to say either in one line that names the URL."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from ..errors import StorageError, UsageError

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


_NO_CREDENTIALS = (
    "no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, name a profile "
    "(--profile NAME, storage_options={'profile': NAME}), or for a public bucket read anonymously "
    "(--anon, storage_options={'anon': True})"
)


# what S3 says of credentials it does not accept (InvalidAccessKeyId, SignatureDoesNotMatch), as a GET's
# error carries it (a HEAD's has no body: s3fs says "Forbidden")
_REFUSED_CREDENTIALS = ("access key id you provided does not exist", "signature we calculated")


def describe_os_error(exc: BaseException) -> str:
    """A short, human explanation of an OS or storage error."""
    if _no_credentials(exc):
        return _NO_CREDENTIALS
    text = " ".join(str(exc).split())
    if any(words in text.lower() for words in _REFUSED_CREDENTIALS):
        return (
            f"{text.rstrip('.')}: the credentials were refused; check AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or the profile) this process gets"
        )
    if isinstance(exc, OSError) and exc.errno in _FIXES:
        return _FIXES[exc.errno]
    if isinstance(exc, FileNotFoundError):  # fsspec raises it without an errno
        return _FIXES[errno.ENOENT]
    if isinstance(exc, TimeoutError) and not str(exc):
        return "the request timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return " ".join(exc.strerror.lower().split())
    return " ".join(str(exc).split()) or type(exc).__name__  # one line, whatever the client wrote


@contextlib.contextmanager
def storage_errors(action: str, url: str) -> Iterator[None]:
    """Turn OS and fsspec errors raised inside into one-line :class:`StorageError` naming ``url``."""
    try:
        yield
    except Exception as exc:
        error = as_storage_error(action, url, exc)
        if error is exc:
            raise
        try:
            raise error from exc
        finally:
            # the error's traceback holds this frame: kept here, it would hold the error, and every frame
            # of the call (a caller's loader with its worker processes among them) until a garbage collection
            del error


def as_storage_error(action: str, url: str, exc: BaseException) -> BaseException:
    """What :func:`storage_errors` raises for ``exc``: a one-line :class:`StorageError` naming ``url`` (its
    cause ``exc``), or ``exc`` itself (one already, or a bug rather than a storage problem)."""
    if isinstance(exc, (StorageError, UsageError)) or not isinstance(exc, Exception):
        return exc  # (a UsageError is a ValueError too, and no storage problem)
    if not isinstance(exc, (OSError, ValueError)) and (
        type(exc).__module__.split(".")[0] not in _NETWORK_MODULES
    ):
        return exc  # a bug, not a storage problem: keep its traceback
    error = StorageError(f"{action} {url}: {describe_os_error(exc)}")
    error.__cause__ = exc
    return error


# Errors that retrying cannot fix; anything else from the network stack is retried.
_PERMANENT = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    NotImplementedError,
    ValueError,
    TypeError,
)
_PERMANENT_ERRNOS = {
    errno.EINVAL,
    errno.EPERM,
    errno.EACCES,
    errno.ENOSYS,
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EROFS,
    getattr(errno, "EREMCHG", -1),
}
_NETWORK_MODULES = (
    "aiohttp",
    "botocore",
    "aiobotocore",
    "urllib3",
    "requests",
    "google",
    "gcsfs",
    "fsspec",
    "s3fs",
    "http",
    "ssl",
    "socket",
    "asyncio",
    "concurrent",
)

_TRANSIENT_NAMES = (
    "Connect",
    "Timeout",
    "Closed",
    "Reset",
    "Disconnect",
    "HTTPClient",
    "Payload",
    "IncompleteRead",
    "Streaming",
    "Throttl",
    "SlowDown",
    "Unavailable",
    "Transport",
    "Checksum",
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying ``exc`` may help: resets, timeouts, 5xx, 408/429 throttling; not 4xx, a missing
    object, bad credentials or configuration."""
    if isinstance(exc, _PERMANENT):
        return False
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    if isinstance(status, int) and 100 <= status < 600:  # an HTTP status decides
        return status >= 500 or status in (408, 429)
    if (
        isinstance(exc, OSError)
        and exc.errno is None
        and str(exc).startswith(("Forbidden", "Unauthorized"))
    ):
        return False  # gcsfs's 401/403
    # s3fs's OSErrors keep botocore's answer here
    response = getattr(exc.__cause__, "response", None)
    status = (
        response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(response, dict)
        else None
    )
    if isinstance(status, int) and 100 <= status < 600:
        return status >= 500 or status in (408, 429)
    if isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNOS:
        return False  # s3fs: an invalid request or bucket name, a wrong region, no permission
    if isinstance(exc, (OSError, TimeoutError, ConnectionError)):
        return True
    name = type(exc).__name__
    return type(exc).__module__.split(".")[0] in _NETWORK_MODULES and any(
        w in name for w in _TRANSIENT_NAMES
    )


def is_missing(exc: BaseException, hidden: bool = False) -> bool:
    """Whether the storage error ``exc`` says its object does not exist (404, no such file); with ``hidden``
    also whether it may not exist: S3 answers a GET of a missing key with 403 (AccessDenied), not 404, to a
    caller that may read objects but not list the bucket (no ``s3:ListBucket``: least-privilege roles,
    anonymous reads of a public bucket without public listing), so such a caller cannot tell a missing
    object from a forbidden one. Callers pass ``hidden`` only where an object that cannot be read may be
    taken as absent."""
    cause = exc.__cause__ if isinstance(exc, StorageError) else exc
    if isinstance(cause, FileNotFoundError):
        return True
    return hidden and (
        isinstance(cause, PermissionError)
        or (isinstance(cause, OSError) and cause.errno in (errno.EACCES, errno.EPERM))
    )


def _no_credentials(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) is botocore's "Unable to locate credentials"."""
    for _ in range(4):  # s3fs wraps botocore's error; look a few causes deep
        if exc is None:
            return False
        if type(exc).__name__ == "NoCredentialsError" or str(exc).startswith(
            "Unable to locate credentials"
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False
