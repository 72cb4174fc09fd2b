"""Numeric batches (``arrow`` mode): a table packed into Arrow shards, read by pyarrow itself and by shardstream.

The table: 2,000,000 rows (``--arrow-rows``) x 8 float32 columns and an int64 label, as one Parquet
file, packed by ``shardstream pack`` into Arrow shards. pyarrow's own read of those shard files into
numpy vs. iterating ``ShardDataset(decode=None, shuffle=False, batch_size=4096)`` in-process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .epoch import timed_epoch

ARROW_ROWS = 2_000_000
ARROW_FLOAT_COLUMNS = 8
ARROW_BATCH = 4096
ARROW_SEED = 7


def write_table(out: Path, rows: int) -> None:
    """``rows`` x ``ARROW_FLOAT_COLUMNS`` float32 columns and an int64 label, as one Parquet file."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(ARROW_SEED)
    columns: dict[str, Any] = {
        f"x{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(ARROW_FLOAT_COLUMNS)
    }
    columns["label"] = rng.integers(0, 1000, rows, dtype=np.int64)
    out.mkdir(parents=True)
    pq.write_table(pa.table(columns), out / "table.parquet")


def run_arrow(tool: str, read_root: Path) -> dict[str, Any]:
    data = read_root / "arrow"
    if tool == "pyarrow":
        import pyarrow as pa
        import pyarrow.ipc

        files = sorted(data.glob("*.arrow"))
        started = time.perf_counter()
        rows = 0
        first_batch = ""
        for path in files:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
                arrays = [column.to_numpy() for column in table.columns]
                rows += table.num_rows
                first_batch = first_batch or ", ".join(
                    f"{n}: {a.dtype}[{len(a)}]" for n, a in zip(table.column_names, arrays)
                )
        seconds = time.perf_counter() - started
        return {
            "rate": rows / seconds,
            "samples": rows,
            "seconds": seconds,
            "ttfb": None,
            "setup": 0.0,
            "first_batch": first_batch,
            "shards": len(files),
        }
    from shardstream import ShardDataset

    started = time.perf_counter()
    dataset = ShardDataset(str(data), decode=None, shuffle=False, batch_size=ARROW_BATCH)
    setup = time.perf_counter() - started
    result = timed_epoch(dataset)
    return {"rate": result["samples"] / result["seconds"], "setup": setup, **result}
