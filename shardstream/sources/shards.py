"""Existing shards to reshard: WebDataset tars (a ``.tar``/``.tar.gz``/``.tar.zst`` file or a folder of
them) or a shardstream dataset (a folder with ``_manifest.json``), into another shard size, format or
compression.

Resharding streams: each worker reads one source shard whole and hands back its samples, which are
written in the source's order (a pack's ``shuffle`` does not apply: the source was shuffled when it was
packed). Keys, field values and class names are kept; fields the manifest records as numbers or text
stay numbers or text. A shardstream dataset's shards are checked against its manifest's sha256 as they
are read. A dataset of Arrow shards is read as a table (Arrow IPC files), so it reshards like one.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardstreamError, SourceError
from ..formats import iter_shard_samples, shard_format_of
from ..manifest import MANIFEST_NAME, open_dataset
from .table import TableSource

_PARSE: dict[str, Callable[[bytes], Any]] = {
    "int": int,
    "float": float,
    "str": lambda b: b.decode("utf-8"),
    "bool": lambda b: b == b"True",
}


@dataclass
class ShardsSource:
    """Tar shards in order: (path, shard format, sha256 or None) each; the fields' written types."""

    root: str
    shards: list[tuple[str, str, str | None]]
    types: dict[str, str] = field(default_factory=dict)
    classes: list[str] | None = None
    num_samples: int | None = None
    layout: str = "shards"
    keeps_order: bool = True

    def sample_jobs(
        self, shuffle_seed: int | None
    ) -> tuple[Callable[[Any], list[dict[str, Any]]], list[Any]]:
        return functools.partial(read_shard, self.types), list(self.shards)


@dataclass
class ShardsTableSource(TableSource):
    """A shardstream dataset of Arrow shards, read as a table of Arrow IPC files, in manifest order."""

    layout: str = "shards"
    keeps_order: bool = True
    classes: list[str] | None = None


def read_shard(types: Mapping[str, str], job: tuple[str, str, str | None]) -> list[dict[str, Any]]:
    """The samples of one tar shard (runs in a worker): fields as bytes, or as the type the manifest records."""
    path, fmt, sha256 = job
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SourceError(f"cannot read shard {path}: {exc.strerror or exc}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise SourceError(
            f"shard {path} does not match the sha256 in its manifest (damaged or replaced); run "
            "shardstream verify, and re-create or re-download it"
        )
    samples = []
    try:
        for sample in iter_shard_samples(fmt, data, path):
            for name, kind in types.items():
                value = sample.get(name)
                if value is not None:
                    sample[name] = _PARSE[kind](value)
            samples.append(sample)
    except ShardstreamError as exc:
        raise SourceError(" ".join(str(exc).split())) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SourceError(
            f"shard {path}: a field does not hold the type its manifest records ({exc}); "
            "run shardstream verify"
        ) from None
    return samples


def _bare_tars(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    names = sorted(
        n
        for n in os.listdir(path)
        if not n.startswith(".") and shard_format_of(n) not in (None, "arrow")
    )
    return [os.path.join(path, n) for n in names]


def _refuse_read_time_views(path: str, manifest: Any) -> None:
    """A merge that relabels classes, or a split's selection, is applied by readers as they read: its
    shards' bytes alone would give other labels or other samples, so they are not resharded."""
    what = (
        "maps its sources' labels to one class list as they are read (a merge of other class lists)"
        if manifest.relabel is not None
        else "selects some samples of its shards (a split)"
        if manifest.selection is not None
        else None
    )
    if what is not None:
        raise SourceError(
            f"{path} {what}; resharding its shards would lose that: reshard its sources and merge "
            "or split again, or read it with ShardDataset"
        )


def open_shards_source(path: str) -> ShardsSource | ShardsTableSource:
    """List the shards of a shardstream dataset, or WebDataset tars, to reshard them."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, MANIFEST_NAME)):
        try:
            store, manifest = open_dataset(path)
        except ShardstreamError as exc:
            raise SourceError(" ".join(str(exc).split())) from None
        _refuse_read_time_views(path, manifest)
        files = [store.path(p) for p in manifest.paths]
        if manifest.shard_format == "arrow":
            return ShardsTableSource(path, "ipc", files, classes=manifest.classes)
        if not manifest.shard_format.startswith("tar"):
            raise SourceError(
                f"{path} holds {manifest.shard_format} shards, which cannot be resharded; pack "
                "the text again with --format tokens"
            )
        types = {f["name"]: f["type"] for f in manifest.fields if f.get("type") in _PARSE}
        shards = [(file, manifest.shard_format, sha) for file, sha in zip(files, manifest.sha256)]
        return ShardsSource(path, shards, types, manifest.classes, manifest.num_samples)
    tars = _bare_tars(path)
    if not tars:
        raise SourceError(
            f"{path} holds no tar shards (.tar, .tar.gz, .tar.zst) and no {MANIFEST_NAME}; "
            "nothing to reshard"
        )
    shards = []
    for tar in tars:
        fmt = shard_format_of(tar)
        if fmt in (None, "arrow"):
            raise SourceError(
                f"{tar} is not a tar shard (.tar, .tar.gz, .tar.zst); give WebDataset tars"
            )
        shards.append((tar, fmt, None))
    return ShardsSource(path, shards)
