"""Table sources (Parquet, CSV, JSON Lines, Arrow) into Arrow or tar shards.

Record batches are cut into shards by rows (``samples_per_shard``) and by their
in-memory size (``shard_size``), in order, so the shards do not depend on the number
of writer threads; the threads only compress and write.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from ..errors import EncodeError
from ..formats import arrow as arrow_format
from ..manifest import shard_name
from ..manifest.files import sync_file
from ..sources.table import TableSource, record_batches, table_batches
from ..storage import Store
from .destination import Claim
from .engine import Execution
from .folder import ShardResult
from .rules import ShardSpec
from .writer import ShardWriter


def _cut(
    batches: Iterator[pa.RecordBatch], shard_size: int, per_shard: int | None
) -> Iterator[list[pa.RecordBatch]]:
    """Group (sliced) batches into shards: at most ``per_shard`` rows, about ``shard_size`` bytes."""
    current: list[pa.RecordBatch] = []
    rows = 0
    nbytes = 0.0
    for batch in batches:
        per_row = max(batch.nbytes / batch.num_rows, 1.0)
        start = 0
        while start < batch.num_rows:
            room = batch.num_rows - start
            if per_shard is not None:
                room = min(room, per_shard - rows)
            room = min(room, max(int((shard_size - nbytes) // per_row), 0 if rows else 1))
            if room <= 0:
                yield current
                current, rows, nbytes = [], 0, 0.0
                continue
            current.append(batch.slice(start, room))
            start += room
            rows += room
            nbytes += room * per_row
            if (per_shard is not None and rows >= per_shard) or nbytes >= shard_size:
                yield current
                current, rows, nbytes = [], 0, 0.0
    if current:
        yield current


def _write_arrow_shard(
    store: Store,
    index: int,
    batches: list[pa.RecordBatch],
    compression: str | None,
    fsync: bool,
    run: str | None = None,
) -> ShardResult:
    name = shard_name(index, "arrow", run)
    with store.open_write(name) as sink:
        writer = arrow_format.ArrowShardWriter(sink, batches[0].schema, compression)
        writer.add_batch(pa.Table.from_batches(batches).combine_chunks())
        nbytes, digest = writer.close()
        if fsync:
            sync_file(store, sink, name)
    return ShardResult(index, name, writer.samples, nbytes, digest)


def pack_table_arrow(
    source: TableSource,
    claim: Claim,
    spec: ShardSpec,
    run: Execution,
    on_shard: Callable[[ShardResult], None],
    seed: int | None = None,
) -> pa.Schema:
    """Write Arrow shards from the table into ``claim``'s destination, named with its run's token; returns the
    table's schema. ``on_shard`` sees each result in order. With ``seed``, the rows are written in a random
    order drawn from it. On the Ray engine the shards are encoded and written by Ray tasks (this process
    reads the table and sends them its rows)."""
    store, compression, workers = claim.store, spec.compression, run.workers
    schema = source.dataset().schema
    pending: deque[Future[ShardResult]] = deque()
    pool: Any = ThreadPoolExecutor(max_workers=max(workers, 1))
    if run.engine == "ray":
        from .ray_engine import RayPool

        pool = RayPool(run.ray_address)
    with pool:
        try:
            batches_in = (
                (b for b, _ in table_batches(source, seed))
                if seed is not None
                else record_batches(source)
            )
            for index, batches in enumerate(_cut(batches_in, spec.limit, spec.per_shard)):
                pending.append(
                    pool.submit(
                        _write_arrow_shard,
                        store,
                        index,
                        batches,
                        compression,
                        claim.fsync,
                        claim.token,
                    )
                )
                while len(pending) > workers or (pending and pending[0].done()):
                    on_shard(pending.popleft().result())
            while pending:
                on_shard(pending.popleft().result())
        finally:
            for f in pending:
                f.cancel()
    return schema


_MAGIC = (
    (b"\x89PNG", "png"),
    (b"\xff\xd8\xff", "jpg"),
    (b"GIF8", "gif"),
    (b"RIFF", "webp"),
    (b"BM", "bmp"),
    (b"fLaC", "flac"),
    (b"OggS", "ogg"),
    (b"ID3", "mp3"),
)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise EncodeError(
            "it holds bytes inside a nested value, which JSON cannot store; "
            "put the bytes in a column of their own (or as {'bytes', 'path'}, like an HF Image)"
        )
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _media(column: str, value: dict[str, Any]) -> tuple[str, bytes] | None:
    """A Hugging Face Image/Audio value ({"bytes", "path"}) as (``column.ext``, its bytes), or None."""
    if set(value) != {"bytes", "path"} or not isinstance(value["bytes"], (bytes, bytearray)):
        return None
    data = bytes(value["bytes"])
    path = value["path"] or ""
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if not suffix.isalnum():
        suffix = next((ext for magic, ext in _MAGIC if data.startswith(magic)), "bin")
    return f"{column}.{suffix}", data


def _fields(column: str, value: Any) -> tuple[str, Any]:
    """The (field, value) a table cell is stored as in a tar shard: bytes as they are, strings and numbers
    as text, a Hugging Face Image/Audio as ``column.<its suffix>`` holding its bytes, other nested values
    as JSON (in ``column.json``)."""
    if isinstance(value, (bytes, str, int, float, bool)):
        return column, value
    if isinstance(value, dict):
        media = _media(column, value)
        if media is not None:
            return media
    if isinstance(value, (dict, list, tuple)):
        name = column if column.rsplit(".", 1)[-1].lower() == "json" else f"{column}.json"
        try:
            return name, json.dumps(value, default=_json_default, ensure_ascii=False)
        except EncodeError as exc:
            raise EncodeError(f"column {column!r}: {exc}") from None
    return column, _json_default(value)  # dates, times, decimals: as text


def pack_table_tar(
    source: TableSource,
    writer: ShardWriter,
    on_rows: Callable[[int], None],
    seed: int | None = None,
) -> None:
    """Write each row as a sample (column = field; ``__key__`` column, else the row number in the
    table); with ``seed``, in a random order drawn from it."""
    for batch, rows in table_batches(source, seed):
        columns = batch.to_pydict()
        names = [n for n in columns if n != "__key__"]
        keys = columns.get("__key__")
        for i in range(batch.num_rows):
            row = int(rows[i])
            sample: dict[str, Any] = {"__key__": str(keys[i]) if keys else f"{row:09d}"}
            try:
                for n in names:
                    if columns[n][i] is not None:
                        field, value = _fields(n, columns[n][i])
                        sample[field] = value
                writer.write(sample)
            except EncodeError as exc:
                raise EncodeError(f"table {source.root}, row {row}: {exc}") from exc
        on_rows(batch.num_rows)
