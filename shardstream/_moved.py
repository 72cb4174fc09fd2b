"""Module paths of release 0.1 that moved when the package was split into one folder per stage.

They keep working for one more release, with a ``DeprecationWarning`` naming the new path:
importing ``shardstream.collate`` gives the module ``shardstream.dataset.batches.collate`` itself (the
same object, so patches and ``isinstance`` agree); a module whose contents went to several new
ones (``shardstream.writer``) gives a stand-in that finds each name in them. CHANGELOG.md lists
the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str | tuple[str, ...]] = {
    "shardstream.cache": "shardstream.storage.cache",
    "shardstream.collate": "shardstream.dataset.batches.collate",
    "shardstream.decode": "shardstream.dataset.samples.decode",
    "shardstream.fetch": "shardstream.storage.fetch",
    "shardstream.guards": "shardstream.loader.guards",
    "shardstream.packing.sources": (
        "shardstream.sources",
        "shardstream.sources.folder",
        "shardstream.sources.table",
    ),
    "shardstream.prefetch": "shardstream.storage.prefetch",
    "shardstream.reader": "shardstream.dataset.shards.readers",
    "shardstream.seeding": "shardstream.dataset.seeding",
    "shardstream.transport": "shardstream.loader.transport",
    "shardstream.verify": "shardstream.manifest.verify",
    "shardstream.writer": (
        "shardstream.packing.writer",
        "shardstream.packing.fields",
        "shardstream.packing.rules",
        "shardstream.packing.destination",
    ),
}


class _Split(ModuleType):
    """An old module whose names now live in several modules: each name from the first that has it."""

    def __init__(self, name: str, homes: tuple[str, ...]):
        super().__init__(name)
        self._homes = [importlib.import_module(home) for home in homes]
        # star imports, as in 0.1
        self.__all__ = sorted({n for home in self._homes for n in _public(home)})

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__all__))

    def __getattr__(self, attr: str):
        for home in self._homes:
            if hasattr(home, attr):
                return getattr(home, attr)
        raise AttributeError(
            f"{self.__name__} has no {attr!r} (it moved to {', '.join(MOVED[self.__name__])})"
        )


def _public(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    return list(names) if names is not None else [n for n in vars(module) if not n.startswith("_")]


def resolve(old: str) -> ModuleType:
    """The module that ``old`` names now, with a warning that says so."""
    new = MOVED[old]
    where = new if isinstance(new, str) else " and ".join(new)
    warnings.warn(
        f"{old} moved to {where}; the old name goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    if isinstance(new, str):
        return importlib.import_module(new)
    return sys.modules.get(old) or _Split(old, new)


class _Alias(importlib.abc.Loader):
    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = resolve(spec.name)
        if not isinstance(module, _Split):
            self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the alias's spec on the real module; give it back its own
        own = self._specs.pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__ = own


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path, target=None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _LOADER)


_LOADER = _Alias()
if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
