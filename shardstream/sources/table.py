"""Table sources: Parquet, CSV, JSON Lines and Arrow files, read with ``pyarrow.dataset``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import SourceError

if TYPE_CHECKING:
    import pyarrow as pa

TABLE_SUFFIXES = {
    ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json",
    ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc",
}

BATCH_ROWS = 65536


@dataclass
class TableSource:
    root: str
    format: str  # pyarrow.dataset format name
    files: list[str] = field(default_factory=list)

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
                file_schema = pads.dataset(path, format=self.format).schema
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise SourceError(f"cannot read table {path}: {one_line(exc)}") from exc
            try:
                schema = file_schema if schema is None else pa.unify_schemas(
                    [schema, file_schema], promote_options="permissive")
            except (pa.ArrowException, TypeError) as exc:
                raise SourceError(
                    f"table {path} has columns whose types differ from the files before it: {one_line(exc)}"
                ) from exc
        return pads.dataset(self.files, format=self.format, schema=schema)


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
