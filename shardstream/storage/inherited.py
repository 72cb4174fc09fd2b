"""Object-storage clients a forked process inherited from its parent are left alone there, never closed.

An fsspec filesystem such as s3fs's holds an aiohttp session whose pooled connections belong to the
event loop of the process that made it, which runs in a thread that a forked child (a DataLoader worker)
does not have. Closing such a client from the child goes wrong either way: from the child's own fsspec
loop thread (where the garbage collector may well run its close-at-collection finalizer) the close awaits
the parent's loop's futures, and asyncio prints "Task exception was never retrieved ... attached to a
different loop", once per worker; from any other thread it waits a second for a loop that never answers,
then unregisters the sockets from the epoll instance the child shares with its parent. So, in the child,
every inherited filesystem (each store's, and those in fsspec's instance caches, which fsspec drops in a
child) is kept referenced for the child's whole life with its finalizer detached, and the child makes
clients of its own (:attr:`FsspecStore.fs <shardstream.storage.fsspec_store.FsspecStore.fs>`).
DataLoader workers leave through ``os._exit``, so nothing of the parent's is ever closed there.
"""

from __future__ import annotations

import os
import sys
import weakref
from typing import Any

_INHERITED: list[Any] = []  # in a forked child: the parent's filesystems, kept, never closed here
_OWNERS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def track(owner: Any) -> None:
    """Remember ``owner``, whose ``_fs`` attribute holds a filesystem made in this process."""
    _OWNERS[id(owner)] = owner


def _filesystems() -> list[Any]:
    """The filesystems this process holds: the tracked owners', and those in fsspec's instance caches."""
    found = [fs for owner in list(_OWNERS.values()) if (fs := getattr(owner, "_fs", None))]
    spec = sys.modules.get("fsspec.spec")
    if spec is not None:
        classes, seen = [spec.AbstractFileSystem], set()
        while classes:
            cls = classes.pop()
            if cls in seen:
                continue
            seen.add(cls)
            classes.extend(cls.__subclasses__())
            found.extend(list(vars(cls).get("_cache", {}).values()))
    return found


def _keep_inherited() -> None:
    """In a forked child: keep the parent's filesystems, their close-at-collection finalizers detached."""
    inherited = _filesystems()
    if not inherited:
        return
    ids = {id(fs) for fs in inherited}
    for finalizer in list(getattr(weakref.finalize, "_registry", ())):
        target = finalizer.peek()
        if target is not None and id(target[0]) in ids:
            finalizer.detach()
    _INHERITED.extend(inherited)


os.register_at_fork(after_in_child=_keep_inherited)

__all__ = ["track"]
