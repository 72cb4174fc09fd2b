"""What a dataset's folder holds, listed the same way by every test: recursively (shardstream keeps its own
files in ``.shardstream/`` beside the data, see :mod:`shardstream.manifest.side_names`), as relative POSIX
paths, sorted."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardstream.manifest.files import IN_PROGRESS
from shardstream.manifest.side_names import NAMESPACE, index_name


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


def as_format_3(root: str | os.PathLike[str]) -> None:
    """Rewrite the dataset at ``root`` (written now, format 4) as shardstream wrote it up to manifest format 3:
    each index beside its shard (``x.tar.idx``, ``data/x.parquet.idx``), version files in ``_versions/``,
    the shard table and side files beside the manifest with a leading ``_``; every head says format 3.
    The content of every file but the heads is unchanged (so every sha256 a head records still holds)."""
    root = Path(root)
    renamed: dict[str, str] = {}
    for name in folder_files(root):
        folder, _, base = name.rpartition("/")
        if folder == NAMESPACE or folder.endswith(f"/{NAMESPACE}"):
            if base.endswith(".idx"):  # an index: beside its shard
                outer = folder[: -len(NAMESPACE)]
                renamed[name] = f"{outer}{base}"
            elif folder == NAMESPACE:  # a shard table or a side file: beside the head, "_"-prefixed
                renamed[name] = f"_{base}"
        elif folder == f"{NAMESPACE}/versions":
            renamed[name] = f"_versions/{base}"
    for old, new in renamed.items():
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        os.replace(root / old, root / new)
    for dirpath, _, names in os.walk(root, topdown=False):  # the emptied .shardstream folders
        if Path(dirpath).name in (NAMESPACE, "versions") and not names and not os.listdir(dirpath):
            os.rmdir(dirpath)
    heads = ["_manifest.json", *(n for n in folder_files(root) if n.startswith("_versions/"))]
    for name in heads:
        doc = json.loads((root / name).read_text())
        doc["shardstream_manifest"] = 3
        shards = doc.get("shards")
        if isinstance(shards, dict) and isinstance(shards.get("table"), str):
            shards["table"] = renamed.get(shards["table"], shards["table"])
        for side in ("selection", "image_sizes"):
            if isinstance(doc.get(side), dict):
                doc[side]["file"] = renamed.get(doc[side]["file"], doc[side]["file"])
        (root / name).write_text(json.dumps(doc))


__all__ = ["as_format_3", "folder_bytes", "folder_files", "indexed"]
