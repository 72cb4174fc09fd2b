"""Arrow IPC (Feather v2) shards: record batches with zstd buffer compression.

Readable by ``pyarrow.ipc.open_file`` / ``pyarrow.feather.read_table`` directly; a folder's images are
stored as Hugging Face ``Image`` structs, which :mod:`.hf_features` gives back as bytes on reading.
Rows can be fetched by index through the file's record-batch directory. What is read is
validated in full (offsets, lengths, UTF-8), so a damaged shard is an error, not a crash;
the buffers carry no checksum, so a changed value can pass: the manifest's sha256 is the check.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.ipc

from ..errors import CorruptShardError
from .hashing import HashingWriter
from .hf_features import unwrap, unwrapped_schema

DEFAULT_COMPRESSION = "zstd"


def schema_to_text(schema: pa.Schema) -> str:
    """The schema as base64 IPC bytes, for the manifest."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def describe_schema(schema: pa.Schema) -> list[dict[str, Any]]:
    """The manifest's human-readable field list: each column as readers return it (images stored in
    Hugging Face ``Image`` structs as the binary they are read as)."""
    return [
        {"name": f.name, "type": str(f.type), "nullable": f.nullable}
        for f in unwrapped_schema(schema)
    ]


class ArrowShardWriter:
    """Writes one Arrow IPC file shard to ``sink``; ``close()`` gives (bytes, sha256 hex)."""

    def __init__(
        self, sink: IO[bytes], schema: pa.Schema, compression: str | None = DEFAULT_COMPRESSION
    ):
        self._out = HashingWriter(sink)
        self.schema = schema
        options = pa.ipc.IpcWriteOptions(compression=compression)
        self._writer = pa.ipc.new_file(self._out, schema, options=options)
        self.samples = 0

    def add_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        if isinstance(batch, pa.Table):
            self._writer.write_table(batch)
        else:
            self._writer.write_batch(batch)
        self.samples += batch.num_rows

    def close(self) -> tuple[int, str]:
        self._writer.close()
        self._out.flush()
        return self._out.nbytes, self._out.hexdigest()


# ArrowInvalid and UnicodeDecodeError are ValueErrors
_DAMAGE = (
    pa.ArrowException,
    OSError,
    ValueError,
)


def open_shard(buf, name: str = "shard") -> pa.ipc.RecordBatchFileReader:
    """The IPC file reader over ``buf`` (bytes or a memory map; no copy), its schema's names checked."""
    try:
        reader = pa.ipc.open_file(pa.py_buffer(buf))
        str(reader.schema)  # decodes every field name and type of the footer's schema
    except _DAMAGE as exc:
        raise CorruptShardError(
            f"{name}: not a readable Arrow IPC file ({exc}); re-create or re-download it"
        ) from exc
    return reader


def read_table(buf, name: str = "shard") -> pa.Table:
    """The whole shard as a table (images stored in ``Image`` structs as their bytes); decompresses and
    fully validates every batch."""
    reader = open_shard(buf, name)
    try:
        table = reader.read_all()
        table.validate(full=True)
    except _DAMAGE as exc:
        raise CorruptShardError(
            f"{name}: damaged record batch ({exc}); re-create or re-download it"
        ) from exc
    return unwrap(table, name)


def iter_rows(buf, name: str = "shard") -> Iterator[dict[str, Any]]:
    """Each row of the shard as a dict of Python values."""
    reader = open_shard(buf, name)
    for i in range(reader.num_record_batches):
        try:
            batch = reader.get_batch(i)
            batch.validate(full=True)
            rows = unwrap(pa.Table.from_batches([batch]), name).to_pylist()
        except _DAMAGE as exc:
            raise CorruptShardError(
                f"{name}: damaged record batch {i} ({exc}); re-create or re-download it"
            ) from exc
        yield from rows
