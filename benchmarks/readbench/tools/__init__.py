"""The tools compared, one module each: its conversion (``write`` or shardstream's ``pack``) and its ``loader``.

Every module has ``DATA`` (the name of the converted copy it reads, under ``<set>/read/``), ``SHUFFLE``
(how its own shuffle is set up, for the report) and ``loader(data, mode, remote)``, which builds the
loader inside the measured child process. Each tool's library is imported there, not here, so a tool
that cannot be imported fails only its own runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from _data import ImageSet

from . import litdata, mosaic, shardstream, webdataset
from .base import RemoteSource

_MODULES = {
    "shardstream": shardstream,
    "webdataset": webdataset,
    "mosaic": mosaic,
    "litdata": litdata,
}

# shardstream's non-default rows read its conversion with other loader settings
_VARIANTS = {
    name: getattr(shardstream, fn)
    for name, fn in shardstream.VARIANTS.items()
    if name != "shardstream"
}
TOOLS = (*_MODULES, *_VARIANTS)
LOADERS: dict[str, Callable[[Path, str, RemoteSource | None], Any]] = {
    **{n: m.loader for n, m in _MODULES.items()},
    **_VARIANTS,
}
DATA_OF = {
    **{name: module.DATA for name, module in _MODULES.items()},
    **dict.fromkeys(_VARIANTS, shardstream.DATA),
}
SHUFFLES = {
    **{name: module.SHUFFLE for name, module in _MODULES.items()},
    **dict.fromkeys(_VARIANTS, shardstream.SHUFFLE),
}
# conversions written by the tool's own library in a child process (``read.py --convert NAME``)
WRITERS: dict[str, Callable[[ImageSet, Path], None]] = {
    "mosaic": mosaic.write,
    "litdata": litdata.write,
}
# known limitations of a tool with a remote endpoint: a failed run whose output shows one is not a failure
REMOTE_LIMITATIONS: dict[str, Callable[[str], str | None]] = {"litdata": litdata.remote_limitation}

__all__ = [
    "DATA_OF",
    "LOADERS",
    "REMOTE_LIMITATIONS",
    "SHUFFLES",
    "TOOLS",
    "WRITERS",
    "RemoteSource",
]
