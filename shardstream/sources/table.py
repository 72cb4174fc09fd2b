"""Table sources: Parquet, CSV, JSON Lines and Arrow files, read with ``pyarrow.dataset``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import SourceError

if TYPE_CHECKING:
    import pyarrow as pa

TABLE_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "json",
    ".ndjson": "json",
    ".arrow": "ipc",
    ".feather": "ipc",
    ".ipc": "ipc",
}

BATCH_ROWS = 65536


@dataclass
class TableSource:
    root: str
    format: str  # pyarrow.dataset format name
    files: list[str] = field(default_factory=list)
    filesystem: Any = None  # a pyarrow file system for files in object storage (None: local files)

    def dataset(self):
        """A ``pyarrow.dataset`` over the files, with the union of their columns.

        Columns that only some files have are kept (null elsewhere); types that cannot be
        reconciled stop the pack naming the odd file.
        """
        import pyarrow as pa
        import pyarrow.dataset as pads

        schema = None
        for path in self.files:
            try:
                file_schema = pads.dataset(
                    path, format=self.format, filesystem=self.filesystem
                ).schema
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise SourceError(f"cannot read table {path}: {one_line(exc)}") from exc
            try:
                schema = (
                    file_schema
                    if schema is None
                    else pa.unify_schemas([schema, file_schema], promote_options="permissive")
                )
            except (pa.ArrowException, TypeError) as exc:
                raise SourceError(
                    f"table {path} has columns whose types differ from the files before it: {one_line(exc)}"
                ) from exc
        return pads.dataset(
            self.files, format=self.format, schema=schema, filesystem=self.filesystem
        )


def one_line(exc: BaseException) -> str:
    """An exception's message on one printable line (pyarrow's span several)."""
    text = " ".join(str(exc).split())
    return "".join(ch for ch in text if ch.isprintable()) or type(exc).__name__


def record_batches(source: TableSource) -> Iterator[pa.RecordBatch]:
    """The table's rows in file order, as batches; errors name the file."""
    import pyarrow as pa

    dataset = source.dataset()
    rows = 0
    for fragment in dataset.get_fragments():
        it = iter(fragment.to_batches(schema=dataset.schema, batch_size=BATCH_ROWS))
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise SourceError(f"cannot read table {fragment.path}: {one_line(exc)}") from exc
            if batch.num_rows:
                rows += batch.num_rows
                yield batch
    if rows == 0:
        raise SourceError(f"table {source.root} has no rows; nothing to pack")


def table_batches(
    source: TableSource, seed: int | None = None
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """(batch, row number of each of its rows in the table): in file order, or with ``seed``, in a
    random order drawn from it (the whole table is read into memory first)."""
    import pyarrow as pa

    if seed is None:
        start = 0
        for batch in record_batches(source):
            yield batch, np.arange(start, start + batch.num_rows, dtype=np.int64)
            start += batch.num_rows
        return
    table = pa.Table.from_batches(list(record_batches(source))).combine_chunks()
    order = sample_permutation(table.num_rows, seed)
    for start in range(0, table.num_rows, BATCH_ROWS):
        rows = order[start : start + BATCH_ROWS]
        offset = 0
        for batch in table.take(pa.array(rows)).combine_chunks().to_batches():
            yield batch, rows[offset : offset + batch.num_rows]
            offset += batch.num_rows


def sample_permutation(n: int, seed: int) -> np.ndarray:
    """The order in which a pack writes ``n`` samples: a permutation drawn from ``seed`` alone."""
    key = int(seed) % (1 << 64)
    return np.random.default_rng(
        np.random.SeedSequence([key & 0xFFFFFFFF, key >> 32, 0x5A4D])
    ).permutation(n)
