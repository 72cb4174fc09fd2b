"""A labels file: one dataset per label under a folder, listed in ``_labels.json``.

``pack --split-by cls`` writes it after every label's dataset (each with its own manifest), so a
class-balanced mix opens each label as a source without reading a single sample. The file is
read as untrusted input: each entry must name a sub-folder of the index's folder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import ManifestError
from ..storage import RetryPolicy, Store
from .files import write_durably

LABELS_NAME = "_labels.json"
LABELS_VERSION = 1
_FOLDER = re.compile(r"^[^/\\]+$")


@dataclass(frozen=True)
class LabelEntry:
    """One label: its name, its value in the ``split_by`` field, its sub-folder and sample count."""

    name: str
    value: int
    path: str
    samples: int


@dataclass(frozen=True)
class LabelIndex:
    """The labels of a split pack: which field was split, and one entry per label in value order."""

    split_by: str
    labels: tuple[LabelEntry, ...]

    def to_json(self) -> bytes:
        body = {
            "version": LABELS_VERSION,
            "split_by": self.split_by,
            "labels": [
                {"name": e.name, "value": e.value, "path": e.path, "samples": e.samples}
                for e in self.labels
            ],
        }
        return json.dumps(body, indent=1).encode()


def write_labels(store: Store, index: LabelIndex, fsync: bool = True) -> None:
    """Publish the labels file (last, atomically, durably with ``fsync``)."""
    write_durably(store, LABELS_NAME, index.to_json(), fsync)


def read_labels(
    url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
) -> tuple[Store, LabelIndex]:
    """The labels file of the split pack at ``url``; a :class:`ManifestError` naming the file and the
    fix when it is missing or malformed."""
    store = Store(url, storage_options, retry) if retry is not None else Store(url, storage_options)
    where = store.url_of(LABELS_NAME)
    if not store.exists(LABELS_NAME):
        raise ManifestError(
            f"{where} does not exist: {store.url} is no split pack; make one with "
            "'shardstream pack SRC DEST --split-by cls', or give a {{label: url}} mapping"
        )
    try:
        body = json.loads(bytes(store.read_bytes(LABELS_NAME)))
        if body.get("version") != LABELS_VERSION:
            raise ValueError(
                f"version {body.get('version')!r}, this shardstream reads {LABELS_VERSION}"
            )
        entries = []
        for raw in body["labels"]:
            entry = LabelEntry(
                str(raw["name"]), int(raw["value"]), str(raw["path"]), int(raw["samples"])
            )
            if not _FOLDER.match(entry.path) or entry.path in (".", "..") or entry.samples < 0:
                raise ValueError(
                    f"label {entry.name!r} names {entry.path!r}, not a sub-folder of the index"
                )
            entries.append(entry)
        index = LabelIndex(str(body["split_by"]), tuple(entries))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{where} is malformed ({exc}); pack the split again") from exc
    if not index.labels:
        raise ManifestError(f"{where} lists no labels; pack the split again")
    return store, index


__all__ = ["LABELS_NAME", "LabelEntry", "LabelIndex", "read_labels", "write_labels"]
