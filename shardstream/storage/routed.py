"""A dataset's folder together with other locations it reads shards from, named by full URL.

A merge across stores (a local dataset and one in a bucket) names some shards by full URL
(``s3://bucket/a/shard-000000.tar``) under a root it declares (``s3://bucket/a``). :class:`RoutedStore`
reads such a name from that root's own :class:`Store` (with the options the reader gave for it) and
every other name from the dataset's folder, as before. It is made only for roots the reader listed
(``StorageSettings.trusted_roots``): a name under no given root stays a name of the dataset's folder,
which refuses URLs, so a manifest cannot make a reader fetch from anywhere it was not told to.

Shards under a local root are memory-mapped as usual (:meth:`RoutedStore.is_local`); the dataset
counts as remote (a shard cache, downloads ahead) as soon as one of its locations is.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from typing import IO, Any

from .store import Check, PartCheck, Store
from .urls import normalize

_SCHEMES = ("file://",)


def root_url(store: Store) -> str:
    """The full URL of ``store``'s folder, as a manifest names it (``file:///abs/path`` for local ones;
    ``memory://a/b`` for a memory store, whose root fsspec keeps as ``/a/b``)."""
    return f"file://{store.root}" if store.local else f"{store.protocol}://{store.root.lstrip('/')}"


def url_root_problem(root: object) -> str | None:
    """What keeps ``root`` from being a full-URL root (``s3://bucket/a``, ``file:///data/a``), or None."""
    if not isinstance(root, str) or "://" not in root:
        return "is not a URL"
    scheme, rest = root.split("://", 1)
    if not scheme.isascii() or not scheme.isalnum() or not scheme.islower():
        return "has no plain lower-case protocol"
    if scheme == "file":
        if not rest.startswith("/"):
            return "is not an absolute file:// path"
        rest = rest[1:]
    segments = rest.split("/")
    if not rest or any(s in ("", ".", "..") for s in segments):
        return "has an empty, '.' or '..' segment, or ends with '/'"
    if any(c in root for c in ("\\", "\0", "?", "#")) or "://" in rest:
        return "holds a backslash, NUL, '?', '#' or another URL"
    return None


def covers(allowed: str, root: str) -> bool:
    """Whether the reader's ``allowed`` location holds ``root`` (the same folder, or one above it)."""
    allowed = allowed.rstrip("/")
    return root == allowed or root.startswith(allowed + "/")


class RoutedStore(Store):
    """``home`` (the dataset's folder) and, by full-URL root, the other stores its shards are in."""

    def __init__(self, home: Store, others: dict[str, Store]):  # no Store.__init__: home's
        self.home, self.others = home, dict(others)
        self.url, self.storage_options, self.retry = home.url, home.storage_options, home.retry
        self.protocol, self.read_only, self.root = home.protocol, home.read_only, home.root
        self.roots = home.roots
        self.local = home.local and all(s.local for s in self.others.values())

    def __repr__(self) -> str:
        return f"RoutedStore({self.home.url!r}, {sorted(self.others)!r})"

    def _route(self, name: str) -> tuple[Store, str]:
        """The store of ``name`` and its name there."""
        if "://" in name:
            for root, store in self.others.items():
                if name.startswith(root + "/"):
                    return store, name[len(root) + 1 :]
        return self.home, name

    def is_local(self, name: str) -> bool:
        store, _ = self._route(name)
        return store.local

    # -- names -------------------------------------------------------------------------------------
    def path(self, name: str) -> str:
        store, inner = self._route(name)
        return store.path(inner)

    def url_of(self, name: str) -> str:
        store, inner = self._route(name)
        return store.url_of(inner)

    # -- reading -----------------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        return self.home.fs

    def exists(self, name: str) -> bool:
        store, inner = self._route(name)
        return store.exists(inner)

    def size(self, name: str) -> int:
        store, inner = self._route(name)
        return store.size(inner)

    def read_bytes(
        self, name: str, nbytes: int = 0, check: Check | None = None, advice: str = ""
    ) -> bytes | mmap.mmap:
        store, inner = self._route(name)
        return store.read_bytes(inner, nbytes, check, advice)

    def map_local(self, name: str) -> tuple[bytes | mmap.mmap, os.stat_result]:
        store, inner = self._route(name)
        return store.map_local(inner)

    def read_many(
        self, names: list[str], check: PartCheck | None = None, advice: str = ""
    ) -> list[bytes]:
        return self._grouped(
            names, lambda store, at, inner: store.read_many(inner, _part(check, at), advice)
        )

    def read_ranges(
        self,
        names: list[str],
        starts: list[int],
        ends: list[int],
        check: PartCheck | None = None,
        advice: str = "",
    ) -> list[bytes]:
        return self._grouped(
            names,
            lambda store, at, inner: store.read_ranges(
                inner, [starts[i] for i in at], [ends[i] for i in at], _part(check, at), advice
            ),
        )

    def _grouped(
        self, names: list[str], read: Callable[[Store, list[int], list[str]], list[bytes]]
    ) -> list[bytes]:
        """``read`` once per store, with the positions and inner names of its names; in ``names``' order."""
        groups: dict[int, tuple[Store, list[int], list[str]]] = {}
        for i, name in enumerate(names):
            store, inner = self._route(name)
            group = groups.setdefault(id(store), (store, [], []))
            group[1].append(i)
            group[2].append(inner)
        out: list[Any] = [None] * len(names)
        for store, at, inner in groups.values():
            for i, data in zip(at, read(store, at, inner)):
                out[i] = data
        return out

    # -- writing: the dataset's own folder only ----------------------------------------------------
    def open_write(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        return self.home.open_write(name)

    def remove(self, name: str) -> None:
        self.home.remove(name)

    def makedirs(self) -> None:
        self.home.makedirs()

    def is_dir(self) -> bool:
        return self.home.is_dir()

    def list_files(self, recursive: bool = False) -> list[str]:
        return self.home.list_files(recursive)

    def read_tagged(self, name: str) -> tuple[bytes, str] | None:
        return self.home.read_tagged(name)


def _part(check: PartCheck | None, at: list[int]) -> PartCheck | None:
    """``check`` of the whole call, for a group of its names (positions ``at`` in it)."""
    if check is None:
        return None
    return lambda j, data: check(at[j], data)


def open_roots(
    home: Store,
    roots: list[str],
    trusted: dict[str, dict[str, Any]],
    make: Callable[[str, dict[str, Any]], Store],
) -> RoutedStore | None:
    """``home`` with a store for each of ``roots`` (full URLs a manifest declares), each opened with the
    options of the ``trusted`` location that holds it (``make(url, options)``); None when it has none of
    them. A root no trusted location holds is a :class:`StorageError` naming it and the fix."""
    from ..errors import StorageError

    full = [r for r in roots if "://" in r]
    if not full:
        return None
    others = {}
    for root in full:
        allowed = [a for a in trusted if covers(normalize_root(a), root)]
        if not allowed:
            raise StorageError(
                f"{home.url} names shards at {root!r:.120}, outside its folder; a dataset reads shards "
                "elsewhere only where you allow it: StorageSettings(trusted_roots={"
                f"{root!r:.120}: {{...fsspec options}}}}), or --trust-root on the command line"
            )
        best = max(allowed, key=len)
        others[root] = make(root, dict(trusted[best] or {}))
    return RoutedStore(home, others)


def normalize_root(url: str) -> str:
    """A location as the reader wrote it, in the form manifests name roots (``file:///abs`` for paths)."""
    url = os.fspath(url)
    if "://" not in url or url.startswith(_SCHEMES):
        return "file://" + os.path.abspath(normalize(url))
    return url.rstrip("/")


__all__ = ["RoutedStore", "covers", "normalize_root", "open_roots", "root_url", "url_root_problem"]
