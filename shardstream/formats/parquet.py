"""Parquet files read in place as shards: their footer, their row groups, and a small row-group index.

A Parquet shard is the user's own file, unchanged. Its row groups are the unit a reader fetches
from object storage: one ranged GET per row group (all its column chunks lie in one span), plus
the footer. Its row-group index (``.shardstream/<file>.idx``), written by ``shardstream index``, says where the footer and each row
group lie and gives each span's sha256, so a ranged read is checked as a whole file is checked
against the manifest's sha256 (the index's own sha256 is in the manifest). The index is untrusted
input: :func:`parse_row_index` checks every number against the file's size and the manifest's row
count. Nothing here does I/O: readers hand in bytes (a memory map, a download, or ranged reads).

Version 2 of the index (written by ``shardstream index`` since 0.6.0) also holds, per row group, the
checksums of its columns and rows as :mod:`.arrow_checksums` computes them for an Arrow record batch, of
the row group's values as pyarrow reads them: a reader checks every row group it reads against them, and
a changed value is found by its row and its field. Version 1 indexes are read as before (without them).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CorruptShardError
from .arrow_checksums import KEY as _CHECKSUMS_KEY
from .arrow_checksums import batch_metadata

MAGIC = b"PAR1"
INDEX_VERSION = 2  # what `index` writes; version 1 (no value checksums) is read too
_VERSIONS = (1, 2)
_FIX = "re-create the manifest and its row-group indexes with 'shardstream index'"
_DAMAGE = (pa.ArrowException, OSError, ValueError)


def footer_span(data: Any, name: str) -> tuple[int, int]:
    """Where the footer (its metadata, length and magic) lies in a whole Parquet file ``data``."""
    size = len(data)
    if size < 12 or bytes(data[:4]) != MAGIC or bytes(data[-4:]) != MAGIC:
        raise CorruptShardError(f"{name}: not a Parquet file (no PAR1 magic at both ends)")
    (length,) = struct.unpack("<I", bytes(data[-8:-4]))
    if length + 12 > size:
        raise CorruptShardError(f"{name}: its footer length ({length}) exceeds the file")
    return size - 8 - length, size


def metadata_of(footer: bytes, name: str) -> pq.FileMetaData:
    """The file's metadata from its footer bytes alone (no other byte of the file is needed)."""
    try:
        return pq.read_metadata(pa.BufferReader(MAGIC + bytes(footer)))
    except _DAMAGE as exc:
        raise CorruptShardError(f"{name}: its Parquet footer does not parse ({exc})") from exc


def row_group_spans(metadata: pq.FileMetaData) -> list[tuple[int, int, int]]:
    """(start, end, rows) of each row group: the byte span holding all its column chunks."""
    spans = []
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        starts, ends = [], []
        for c in range(group.num_columns):
            chunk = group.column(c)
            start = (
                chunk.dictionary_page_offset
                if chunk.has_dictionary_page and chunk.dictionary_page_offset
                else chunk.data_page_offset
            )
            starts.append(int(start))
            ends.append(int(start) + int(chunk.total_compressed_size))
        first = min(starts) if starts else 4
        spans.append((first, max(ends) if ends else first, int(group.num_rows)))
    return spans


@dataclass(frozen=True)
class RowIndex:
    """A Parquet shard's row groups: the footer's span and sha256, each group's span, rows and sha256, and
    (version 2) each group's value checksums (:mod:`.arrow_checksums`' document of a batch, as a dict)."""

    footer: tuple[int, int]
    footer_sha256: str
    spans: list[tuple[int, int]]
    rows: list[int]
    sha256: list[str]
    checksums: list[dict[str, Any]] | None = None

    def to_bytes(self) -> bytes:
        groups: dict[str, Any] = {
            "spans": [list(s) for s in self.spans],
            "rows": self.rows,
            "sha256": self.sha256,
        }
        if self.checksums is not None:
            groups["checksums"] = self.checksums
        doc = {
            "shardstream_parquet_index": 1 if self.checksums is None else INDEX_VERSION,
            "footer": list(self.footer),
            "footer_sha256": self.footer_sha256,
            "row_groups": groups,
        }
        return (json.dumps(doc, separators=(",", ":")) + "\n").encode()

    def first_rows(self) -> list[int]:
        """The first row of each group, and the row count last."""
        out = [0]
        for rows in self.rows:
            out.append(out[-1] + rows)
        return out


def build_row_index(
    data: Any, name: str, checksums: bool = False
) -> tuple[RowIndex, pq.FileMetaData]:
    """The row-group index of a whole Parquet file ``data`` (bytes or a memory map), and its metadata;
    ``checksums``: version 2, with each row group's value checksums (every row group read and decoded)."""
    view = memoryview(data)
    start, end = footer_span(view, name)
    metadata = metadata_of(view[start:end], name)
    spans = row_group_spans(metadata)
    for first, last, _ in spans:
        if not 4 <= first <= last <= start:
            raise CorruptShardError(f"{name}: a row group's column chunks lie outside the file")
    sums = None
    if checksums:
        file = open_file(data, name, metadata)
        sums = [
            json.loads(batch_metadata(read_group(file, g, name))[_CHECKSUMS_KEY])
            for g in range(metadata.num_row_groups)
        ]
    index = RowIndex(
        (start, end),
        hashlib.sha256(view[start:end]).hexdigest(),
        [(a, b) for a, b, _ in spans],
        [rows for _, _, rows in spans],
        [hashlib.sha256(view[a:b]).hexdigest() for a, b, _ in spans],
        sums,
    )
    return index, metadata


def parse_row_index(data: bytes, name: str, rows: int, size: int) -> RowIndex:
    """Check and parse the row-group index ``data`` of a Parquet file of ``size`` bytes holding ``rows``
    rows (both from the manifest); :class:`CorruptShardError` naming ``name`` for anything else."""

    def bad(what: str) -> CorruptShardError:
        return CorruptShardError(f"{name}: {what}; {_FIX}")

    try:
        doc = json.loads(data)
        groups = doc["row_groups"]
        spans = [(int(a), int(b)) for a, b in groups["spans"]]
        counts = [int(n) for n in groups["rows"]]
        digests = [str(d) for d in groups["sha256"]]
        footer = (int(doc["footer"][0]), int(doc["footer"][1]))
        footer_sha = str(doc["footer_sha256"])
        version = doc["shardstream_parquet_index"]
        sums = groups.get("checksums") if version == 2 else None
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise bad(f"not a shardstream row-group index ({exc})") from None
    if version not in _VERSIONS:
        raise bad(f"row-group index version {version!r}, this shardstream reads {_VERSIONS}")
    if not len(spans) == len(counts) == len(digests) or (
        version == 2 and (not isinstance(sums, list) or len(sums) != len(spans))
    ):
        raise bad("its row-group columns have different lengths")
    if footer[1] != size or not 4 <= footer[0] < footer[1]:
        raise bad(f"its footer span {footer} is not the end of a {size}-byte file")
    if any(not 4 <= a <= b <= footer[0] for a, b in spans) or any(n < 0 for n in counts):
        raise bad("a row group's span lies outside the file's data")
    if sum(counts) != rows:
        raise bad(f"its row groups hold {sum(counts)} rows, the manifest says {rows}")
    return RowIndex(footer, footer_sha, spans, counts, digests, sums)


def check_span(data: Any, digest: str, name: str, what: str) -> None:
    """Raise unless ``data`` (a span read by a ranged GET) has the sha256 ``digest`` from the index."""
    if hashlib.sha256(data).hexdigest() != digest:
        raise CorruptShardError(
            f"{name}: {what} differs from its sha256 in the row-group index; the file was replaced "
            f"or damaged: {_FIX}"
        )


class SpansFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some spans are here (``pieces``: start -> bytes);
    reading anything else is an error (so a reader never sees bytes that were not checked)."""

    def __init__(self, size: int, pieces: dict[int, Any], name: str):
        self.size, self.pieces, self.name, self.pos = size, pieces, name, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (
            offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        )
        return self.pos

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else n
        for start, piece in self.pieces.items():
            if start <= self.pos and self.pos + n <= start + len(piece):
                out = bytes(piece[self.pos - start : self.pos - start + n])
                self.pos += n
                return out
        raise CorruptShardError(
            f"{self.name}: the reader asked for bytes {self.pos}-{self.pos + n} outside the row group's "
            f"span in the row-group index; {_FIX}"
        )

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def open_file(
    source: Any, name: str, metadata: pq.FileMetaData | None = None, page_checksums: bool = True
) -> pq.ParquetFile:
    """A ``ParquetFile`` over a whole file's bytes (a memory map: no copy) or a :class:`SpansFile`;
    ``page_checksums``: each page's CRC is checked as it is read, where the writer recorded one
    (``write_page_checksum``; pyarrow writes none by default), so a damaged page is an error."""
    try:
        handle = (
            pa.PythonFile(source, mode="r")
            if isinstance(source, SpansFile)
            else pa.BufferReader(pa.py_buffer(source))
        )
        return pq.ParquetFile(handle, metadata=metadata, page_checksum_verification=page_checksums)
    except _DAMAGE as exc:
        raise CorruptShardError(f"{name}: not a readable Parquet file ({exc})") from exc


def read_group(file: pq.ParquetFile, group: int, name: str) -> pa.Table:
    """Row group ``group`` as a table, fully validated (a damaged page is an error, never a crash)."""
    try:
        table = file.read_row_group(group)
        table.validate(full=True)
    except CorruptShardError:
        raise
    except _DAMAGE as exc:
        raise CorruptShardError(f"{name}: damaged row group {group} ({exc})") from exc
    return table


def read_table(data: Any, name: str = "shard") -> pa.Table:
    """A whole Parquet file's rows (bytes or a memory map)."""
    file = open_file(data, name)
    tables = [read_group(file, g, name) for g in range(file.metadata.num_row_groups)]
    return pa.concat_tables(tables) if tables else file.schema_arrow.empty_table()


__all__ = [
    "RowIndex",
    "SpansFile",
    "build_row_index",
    "check_span",
    "footer_span",
    "metadata_of",
    "open_file",
    "parse_row_index",
    "read_group",
    "read_table",
    "row_group_spans",
]
