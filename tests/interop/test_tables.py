"""pyarrow and pandas read exactly the rows of an Arrow pack (file by file and the whole folder) and of a
Hub-like Parquet folder indexed in place (the folder, the snapshot above it, pyarrow.dataset); shardstream
still reads each after. Folder reads skip ``_``- and ``.``-prefixed names: the manifest, and everything
else shardstream keeps beside the data files."""

from __future__ import annotations

import pandas as pd
import pyarrow.dataset as pads
import pyarrow.feather as feather
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from tests.interop.clients import check_ours, check_samples, shards_of
from tests.interop.conftest import PARQUET_FIELDS


def rows(table) -> list[dict]:
    return table.to_pylist()


@pytest.mark.parametrize("pack", ["arrow_pack", "arrow_shards"])
def test_pyarrow_and_pandas_read_an_arrow_pack(pack, images, request):
    folder = request.getfixturevalue(pack)
    paths = shards_of(folder)
    check_samples([r for p in paths for r in rows(pyarrow.ipc.open_file(p).read_all())], images[1])
    check_samples([r for p in paths for r in rows(feather.read_table(p))], images[1])
    check_samples([r for p in paths for r in pd.read_feather(p).to_dict("records")], images[1])
    check_samples(rows(pads.dataset(str(folder), format="ipc").to_table()), images[1])
    check_ours(folder, images[1])


@pytest.mark.parametrize("where", ["data", "snapshot"])
def test_pyarrow_and_pandas_read_the_parquet_folder_after_index(where, parquet_hub, images):
    folder = parquet_hub / "data" if where == "data" else parquet_hub
    check_samples(rows(pq.read_table(str(folder))), images[1], **PARQUET_FIELDS)
    check_samples(pd.read_parquet(str(folder)).to_dict("records"), images[1], **PARQUET_FIELDS)
    table = pads.dataset(str(folder), format="parquet").to_table()
    check_samples(rows(table), images[1], **PARQUET_FIELDS)
    check_ours(parquet_hub / "data", images[1], **PARQUET_FIELDS)
