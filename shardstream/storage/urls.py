"""URLs and paths: which are local, and the fsspec options the common connection settings make."""

from __future__ import annotations

import os
from typing import Any

from ..errors import StorageError

READ_ONLY = ("http", "https")  # plain web servers: read, never written
# object stores: prefixes need no creating, buckets are not made on the fly
BUCKETS = (
    "s3",
    "s3a",
    "gs",
    "gcs",
)


def is_url(path: str) -> bool:
    """Whether ``path`` names a protocol (``s3://...``) rather than a local path."""
    return "://" in path and not path.startswith("file://")


def normalize(url: str | os.PathLike[str]) -> str:
    """``url`` without ``file://`` and trailing slashes (the root stays ``/``)."""
    url = os.fspath(url)
    if url.startswith("file://"):
        url = url[len("file://") :]
    return url.rstrip("/") or "/"


def protocol_of(url: str) -> str:
    """``s3`` for ``s3://bucket/x``; ``file`` for a local path."""
    return url.split("://", 1)[0].lower() if is_url(url) else "file"


def connection_options(
    url: str, endpoint_url: str | None = None, anon: bool = False, profile: str | None = None
) -> dict[str, Any]:
    """fsspec storage options for ``url``'s protocol from the common settings: an endpoint
    (S3-compatible stores, a GCS emulator), anonymous access, an AWS profile."""
    protocol = protocol_of(url)
    out: dict[str, Any] = {}
    if endpoint_url:
        if protocol not in BUCKETS:
            raise StorageError(f"an endpoint URL applies to s3:// and gs:// locations, not {url}")
        out["endpoint_url"] = endpoint_url
    if anon:
        if protocol in ("gs", "gcs"):
            out["token"] = "anon"
        elif protocol in ("s3", "s3a"):
            out["anon"] = True
    if profile:
        if protocol not in ("s3", "s3a"):
            raise StorageError(
                f"a profile names AWS credentials; it applies to s3:// locations, not {url}"
            )
        out["profile"] = profile
    return out


__all__ = ["BUCKETS", "READ_ONLY", "connection_options", "is_url", "normalize", "protocol_of"]
