"""Sources on object storage (``s3://``, ``gs://``, any fsspec URL): listed through fsspec, read in workers.

A folder tree in a bucket is listed once, by the driver, in one recursive listing with sizes;
names are sorted and hidden entries (a leading ``.`` in any part) skipped, as for local folders,
so a pack of a bucket is as deterministic as a pack of a folder. Each worker reads its files
itself, with a file system it opens once per process.
"""

from __future__ import annotations

from typing import Any

from ..errors import SourceError
from ..storage import Store

_FILESYSTEMS: dict[tuple[str, str], Any] = {}  # this process's: (protocol, options) -> file system


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def walk_remote(
    url: str, storage_options: dict[str, Any] | None = None
) -> tuple[list[tuple[str, str, int]], int]:
    """(relative path, URL, size) of every non-hidden object under ``url``, sorted; and the hidden count."""
    store = Store(url, storage_options)
    try:
        found = store.fs.find(store.root, detail=True)
    except Exception as exc:  # fsspec backends raise their own types
        raise SourceError(
            f"cannot list {url}: {type(exc).__name__}: {exc}; check the URL and the credentials"
        ) from exc
    prefix = store.root.rstrip("/") + "/"
    protocol = url.split("://", 1)[0]
    if store.root in found and found[store.root].get("type") == "file":  # the URL names one object
        info = found[store.root]
        return [(store.root.rsplit("/", 1)[-1], url, int(info.get("size") or 0))], 0
    out, hidden = [], 0
    for name, info in sorted(found.items()):
        if info.get("type") != "file" or not name.startswith(prefix):
            continue
        rel = name[len(prefix) :]
        if any(part.startswith(".") for part in rel.split("/")):
            hidden += 1
            continue
        out.append((rel, f"{protocol}://{name}", int(info.get("size") or 0)))
    return out, hidden


def arrow_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """A pyarrow file system over fsspec's for ``url``, and the path it knows ``url`` by."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    store = Store(url, storage_options)
    return PyFileSystem(FSSpecHandler(store.fs)), store.root


def read_remote(url: str, size: int, storage_options: dict[str, Any] | None = None) -> bytes:
    """The bytes of the object at ``url``, which must still be ``size`` bytes long."""
    protocol = url.split("://", 1)[0]
    key = (protocol, repr(sorted((storage_options or {}).items())))
    fs = _FILESYSTEMS.get(key)
    if fs is None:
        fs = _FILESYSTEMS[key] = Store(f"{protocol}://placeholder", storage_options).fs
    try:
        data = fs.cat_file(url)
    except Exception as exc:
        raise SourceError(f"cannot read {url}: {type(exc).__name__}: {exc}") from exc
    if len(data) != size:
        raise SourceError(
            f"{url} changed while packing (it was {size} bytes, now {len(data)}); let it settle and "
            "pack again"
        )
    return data


__all__ = ["arrow_filesystem", "is_remote", "read_remote", "walk_remote"]
