"""Read samples back from the demo datasets with the tools users already have.

The tar shards are plain WebDataset shards, so ``webdataset`` (when installed) reads
them as they are; Arrow shards open with ``pyarrow`` directly.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pyarrow.feather as feather
from PIL import Image


def read_with_shardstream(image_dataset: str, table_dataset: str) -> None:
    import shardstream as ss

    ds = ss.ShardDataset(image_dataset, shuffle=True, seed=17, decode="torch")
    loader = ds.loader(batch_size=16, num_workers=2)
    for i, batch in enumerate(loader):
        if i == 1:
            state = loader.state_dict()
            print(
                f"ShardDataset: batch of {tuple(batch['jpg'].shape)} {batch['jpg'].dtype} images, "
                f"labels {batch['cls'][:6].tolist()}...; resume state after 2 batches: {state}"
            )
            break
    table = ss.ShardDataset(table_dataset, shuffle=False, decode=None, batch_size=256)
    first = next(iter(table))
    columns = ", ".join(
        f"{name} {tuple(value.shape)}" for name, value in first.items() if hasattr(value, "shape")
    )
    print(f"ShardDataset (Arrow batch mode): {columns}")


def main(image_dataset: str, table_dataset: str) -> None:
    read_with_shardstream(image_dataset, table_dataset)
    manifest = json.loads((Path(image_dataset) / "_manifest.json").read_text())
    shards = [str(Path(image_dataset) / p) for p in manifest["shards"]["path"]]
    try:
        import webdataset as wds
    except ImportError:
        wds = None
    if wds is not None:
        for i, sample in enumerate(wds.WebDataset(shards, shardshuffle=False)):
            image = Image.open(io.BytesIO(sample["jpg"]))
            label = manifest["classes"][int(sample["cls"])]
            print(
                f"webdataset read {sample['__key__']}: {image.size[0]}x{image.size[1]} {image.mode}, class {label}"
            )
            if i == 2:
                break
    table_manifest = json.loads((Path(table_dataset) / "_manifest.json").read_text())
    first = Path(table_dataset) / table_manifest["shards"]["path"][0]
    table = feather.read_table(first)
    print(f"pyarrow read {first.name}: {table.num_rows} rows, columns {table.column_names}")
    print(table.slice(0, 3).to_pandas() if _has_pandas() else table.slice(0, 3).to_pylist())


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
