"""Make a small demo source: an ImageFolder tree of JPEGs and a Parquet table.

python examples/make_demo_data.py demo
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

CLASSES = ("cat", "dog", "fox")


def make_images(root: Path, per_class: int = 20, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for c, name in enumerate(CLASSES):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            y, x = np.mgrid[0:64, 0:64]
            rgb = np.stack(
                [(x * 4 + c * 80) % 256, (y * 4 + i * 9) % 256, (x + y) * 2 % 256], axis=-1
            )
            rgb = np.clip(rgb + rng.normal(0, 12, rgb.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(rgb).save(buf, format="JPEG", quality=85)
            (folder / f"{name}_{i:03d}.jpg").write_bytes(buf.getvalue())


def make_table(path: Path, rows: int = 1000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    table = pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "text": [f"sentence number {i}" for i in range(rows)],
            "features": list(rng.normal(size=(rows, 4)).astype(np.float32)),
            "label": rng.integers(0, 10, rows),
        }
    )
    pq.write_table(table, path, row_group_size=250)


def main(out: str) -> None:
    root = Path(out)
    make_images(root / "images")
    make_table(root / "table.parquet")
    print(f"demo data in {root}/: images/ ({len(CLASSES)} classes), table.parquet")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo")
