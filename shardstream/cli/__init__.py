"""The ``shardstream`` command, one module per command group: ``pack``; ``show`` (info, ls,
cat); ``check`` (verify, index); ``doctor``; ``bench``. ``common`` holds the group, the storage flags,
the one-line errors and the terminal-safe printing (``safe``) they all share. A command's module is
imported when the command runs (``common.COMMANDS``), so ``shardstream pack`` does not pay for the
others' imports (``bench`` needs torch).
"""

from __future__ import annotations

from typing import Any

from .common import COMMANDS, cli, load_commands, storage_option

__all__ = [
    "bench",
    "cat",
    "cli",
    "doctor",
    "index_",
    "info",
    "ls_",
    "main",
    "pack",
    "storage_option",
    "verify",
]

_ATTRIBUTES = {
    "index_": "check",
    "ls_": "show",
    **{name: module for name, module in COMMANDS.items() if name not in ("index", "ls")},
}


def __getattr__(name: str) -> Any:
    module = _ATTRIBUTES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(load_commands(module), name)


def main() -> None:
    cli(prog_name="shardstream")
