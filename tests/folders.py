"""What a dataset's folder holds, listed the same way by every test: recursively (shardstream keeps its own
files in ``.shardstream/`` beside the data, see :mod:`shardstream.manifest.side_names`), as relative POSIX
paths, sorted."""

from __future__ import annotations

import os
from pathlib import Path

from shardstream.manifest.files import IN_PROGRESS
from shardstream.manifest.side_names import index_name


def folder_files(root: str | os.PathLike[str], claim: bool = True) -> list[str]:
    """Every file under ``root`` (its subfolders' too, ``.shardstream/`` included), as paths relative to it
    with ``/`` separators, sorted; ``claim=False`` leaves out the claim marker (``.shardstream-writing``)
    a run holds while it writes. ``[]`` if ``root`` does not exist."""
    root = Path(root)
    out = []
    for dirpath, _, files in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        out += [(rel / name).as_posix() for name in files]
    return sorted(n for n in out if claim or n != IN_PROGRESS)


def folder_bytes(root: str | os.PathLike[str], claim: bool = True) -> dict[str, bytes]:
    """``{path: content}`` of :func:`folder_files` (to check that a folder is unchanged, file by file)."""
    return {name: (Path(root) / name).read_bytes() for name in folder_files(root, claim)}


def indexed(*paths: str) -> list[str]:
    """``paths`` (shards) and, for each, its sample index in ``.shardstream/`` beside it, sorted."""
    return sorted([*paths, *(index_name(p) for p in paths)])


__all__ = ["folder_bytes", "folder_files", "indexed"]
