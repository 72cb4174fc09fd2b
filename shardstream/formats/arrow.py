"""Arrow IPC (Feather v2) shards: record batches with zstd buffer compression.

Readable by ``pyarrow.ipc.open_file`` / ``pyarrow.feather.read_table`` directly; a folder's images are
stored as Hugging Face ``Image`` structs, which :mod:`.hf_features` gives back as bytes on reading.
Rows can be fetched by index through the file's record-batch directory. What is read is
validated in full (offsets, lengths, UTF-8), so a damaged shard is an error, not a crash;
each record batch carries the checksums of its columns and rows in its custom metadata
(:mod:`.arrow_checksums`, invisible to other readers), so a changed value that stays valid is
found too, by its row and field.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.ipc

from ..errors import CorruptShardError
from . import checksums
from .arrow_checksums import KEY, batch_metadata, damaged_rows, parse_checksums
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
    """Writes one Arrow IPC file shard to ``sink``, each record batch with its checksums in its custom
    metadata (:mod:`.arrow_checksums`); ``close()`` gives (bytes, sha256 hex)."""

    def __init__(
        self, sink: IO[bytes], schema: pa.Schema, compression: str | None = DEFAULT_COMPRESSION
    ):
        self._out = HashingWriter(sink)
        self.schema = schema
        options = pa.ipc.IpcWriteOptions(compression=compression)
        self._writer = pa.ipc.new_file(self._out, schema, options=options)
        self.samples = 0

    def add_batch(self, batch: pa.RecordBatch | pa.Table) -> None:
        batches = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        for one in batches:
            metadata = batch_metadata(one) if checksums.WRITE_ON_PACK else None
            self._writer.write_batch(one, custom_metadata=metadata)
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


Damage = dict[int, list[str]]  # row -> the fields whose values differ from their checksums


def read_checked(buf, name: str = "shard", check: bool = True) -> tuple[pa.Table, Damage | None]:
    """The whole shard as a table (every batch decompressed and fully validated; images stored in ``Image``
    structs as their bytes) and, with ``check``, the
    rows whose values differ from their record batch's checksums, with the fields that differ (``{}``: none;
    ``None``: the shard has no checksums, or ``check`` is off). A batch that does not read, or whose
    checksums do not, is a :class:`CorruptShardError` for the shard."""
    reader = open_shard(buf, name)
    batches, damaged, start, unchecked = [], {}, 0, not check
    for i in range(reader.num_record_batches):
        try:
            batch, metadata = reader.get_batch_with_custom_metadata(i)
            batch.validate(full=True)
        except _DAMAGE as exc:
            raise CorruptShardError(
                f"{name}: damaged record batch {i} ({exc}); re-create or re-download it"
            ) from exc
        doc = None if metadata is None or not check else metadata.get(KEY)
        if doc is None:
            unchecked = True
        else:
            where = f"{name} (record batch {i})"
            sums, rows = parse_checksums(doc, batch.num_columns, batch.num_rows, where)
            for row, fields in damaged_rows(batch, sums, rows).items():
                damaged[start + row] = fields
        batches.append(batch)
        start += batch.num_rows
    # checked as stored; handed out with images stored in Image structs as their bytes
    table = unwrap(pa.Table.from_batches(batches, schema=reader.schema), name)
    return table, None if unchecked else damaged


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
