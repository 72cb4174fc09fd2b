"""Small source folders, and datasets with exactly the shard sizes a test asks for (uneven on purpose)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardstream.manifest import shard_name, write_manifest
from shardstream.manifest.side_names import index_name
from shardstream.packing.writer import ShardWriter
from shardstream.storage import Store


def key_of(i: int) -> str:
    return f"s{i:04d}"


def text_sample(i: int) -> dict[str, Any]:
    return {"__key__": key_of(i), "txt": f"text {i}", "cls": i}


def write_dataset(
    root: Path,
    counts,
    fmt: str = "tar",
    compression: str | None = None,
    make: Callable[[int], dict[str, Any]] = text_sample,
    name: str = "ds",
) -> str:
    """A dataset whose shards hold exactly ``counts`` samples; keys ``key_of(0..N-1)`` in manifest order.

    Each shard is written by its own ShardWriter, then the shards are gathered under one manifest.
    """
    url = root / name
    url.mkdir(parents=True)
    paths, samples, nbytes, sha256, index_sha256 = [], [], [], [], []
    first = None
    index = 0
    for s, count in enumerate(counts):
        part = root / f"{name}-part{s}"
        with ShardWriter(str(part), format=fmt, compression=compression) as writer:
            for _ in range(count):
                writer.write(make(index))
                index += 1
        m = writer.manifest
        first = first or m
        target = shard_name(s, m.shard_format)
        os.replace(part / m.paths[0], url / target)
        if m.index_sha256 is not None:  # the shard's sample index goes with it
            (url / index_name(target)).parent.mkdir(exist_ok=True)
            os.replace(part / index_name(m.paths[0]), url / index_name(target))
            index_sha256 += list(m.index_sha256)
        shutil.rmtree(part)
        paths.append(target)
        samples += m.stored_counts.tolist()
        nbytes += m.nbytes.tolist()
        sha256 += m.sha256
    manifest = dataclasses.replace(
        first,
        paths=paths,
        stored_counts=samples,
        nbytes=nbytes,
        sha256=sha256,
        index_sha256=index_sha256 or None,
        image_sizes=None,  # recorded per part: not gathered (readers find sizes as they read)
    )
    write_manifest(Store(str(url)), manifest)
    return str(url)


def make_files(root: Path, files: dict[str, bytes]) -> Path:
    """Create ``files`` (relative path -> content) under ``root``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


_RUN_IN_NAME = re.compile(r"(^|/)(shard-[0-9]{6,})-[0-9a-f]{16}(?=\.)")
RUN = "-[0-9a-f]{16}"  # a run's token in a shard name, as a regular expression: rf"shard-000002{RUN}\.tar"


def without_run(name: str) -> str:
    """A file name (or path, or key) without the token of the pack run that wrote it:
    ``shard-000000-<token>.tar`` -> ``shard-000000.tar`` (two packs of the same source compare equal by these)."""
    return _RUN_IN_NAME.sub(r"\1\2", name)


def doc_without_runs(doc: dict[str, Any]) -> dict[str, Any]:
    """A manifest's JSON with its shard paths :func:`without_run`, and its side files' names without
    their run's part (``.shardstream/image_sizes-<digest>-<run>.npy`` as
    ``.shardstream/image_sizes-<digest>.npy``; ``_image_sizes-…`` of older formats likewise)."""
    shards = doc.get("shards")
    if isinstance(shards, dict) and "path" in shards:
        doc = {**doc, "shards": {**shards, "path": [without_run(p) for p in shards["path"]]}}
    for side in ("selection", "image_sizes"):
        ref = doc.get(side)
        if isinstance(ref, dict) and isinstance(ref.get("file"), str):
            file = re.sub(
                r"^((?:\.shardstream/|_)\w+-[0-9a-f]{16})-[0-9a-f]{16}(\.npy)$",
                r"\1\2",
                ref["file"],
            )
            doc = {**doc, side: {**ref, "file": file}}
    return doc


def shard_path(root: str | os.PathLike[str], i: int) -> Path:
    """Shard ``i`` of the local dataset at ``root``, as its manifest names it (a pack names its shards with its
    run's token: ``shard-000000-<token>.tar``)."""
    import json

    doc = json.loads((Path(root) / "_manifest.json").read_bytes())
    return Path(root) / doc["shards"]["path"][i]
