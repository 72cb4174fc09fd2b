"""Hugging Face datasets saved with ``Dataset.save_to_disk`` (extra ``hf``): Arrow tables, packed as tables.

The folder's ``state.json`` lists its Arrow files (IPC streams), which are memory-mapped and read in
order without importing ``datasets``; they go straight to Arrow shards with their schema (the
``huggingface`` features metadata included). Image and audio columns stay as their bytes
(``{"bytes", "path"}`` structs); ``--format tar`` stores them as ``column.<suffix>`` files.
A ``DatasetDict`` folder is refused, naming its splits: pack one split's folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..errors import SourceError
from .table import TableSource, one_line


def _read_arrow(path: str) -> Any:
    """A memory-mapped Arrow file (stream or file format) as a table; its buffers stay on disk."""
    import pyarrow as pa

    try:
        source = pa.memory_map(path)
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(pa.memory_map(path)).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise SourceError(
            f"cannot read Arrow file {path}: {one_line(exc)}; save the dataset again with "
            "save_to_disk"
        ) from None


@dataclass
class HFSource(TableSource):
    """A saved Hugging Face ``Dataset``: its Arrow files in order (``format`` is ``"hf"``)."""

    layout: str = "hf"

    def dataset(self) -> Any:
        import pyarrow.dataset as pads

        tables = [_read_arrow(path) for path in self.files]
        schema = tables[0].schema
        for path, table in zip(self.files, tables):
            if not table.schema.equals(schema, check_metadata=False):
                raise SourceError(
                    f"{path} has other columns or types than {self.files[0]}; save the dataset "
                    "again with save_to_disk"
                )
        return pads.InMemoryDataset([t.cast(schema) for t in tables], schema=schema)


def open_hf_source(path: str) -> HFSource:
    """List a folder written by ``Dataset.save_to_disk``."""
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n)))
        raise SourceError(
            f"{path} is a DatasetDict with splits {', '.join(splits) or '(none)'}; pack one split, "
            f"e.g. {os.path.join(path, splits[0] if splits else 'train')}"
        )
    state = os.path.join(path, "state.json")
    try:
        with open(state, "rb") as f:
            doc = json.load(f)
        names = [entry["filename"] for entry in doc["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SourceError(
            f"cannot read {state}: {one_line(exc)}; is {path} a folder written by "
            "Dataset.save_to_disk?"
        ) from None
    files = []
    for name in names:
        file = os.path.join(path, name)
        if not isinstance(name, str) or "/" in name or not os.path.isfile(file):
            raise SourceError(
                f"{state} names the Arrow file {name!r}, which {path} does not hold; save the "
                "dataset again with save_to_disk"
            )
        files.append(file)
    if not files:
        raise SourceError(f"{path} holds no Arrow files; nothing to pack")
    return HFSource(path, "hf", files)
