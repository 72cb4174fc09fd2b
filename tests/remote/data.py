"""Small sources for the endpoint tests, different in every test.

The content is random per call (a fresh seed), so no two tests, and no two runs, pack
byte-identical shards: a shard cache keyed by content can never serve one test's
shards to another.
"""

from __future__ import annotations

import io
import random
import tarfile
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

CLASSES = ("cat", "dog")
PER_CLASS = 7  # 14 samples; with samples_per_shard=4: shards of 4, 4, 4, 2


def fresh_seed() -> int:
    return uuid.uuid4().int & 0xFFFFFFFF


def jpeg(rng: random.Random, size: tuple[int, int] = (24, 32)) -> bytes:
    """A small smooth RGB JPEG (4:4:4, so decoders agree closely) with random parameters."""
    h, w = size
    ys, xs = np.mgrid[0:h, 0:w]
    a, b, c = (rng.randrange(1, 9) for _ in range(3))
    rgb = np.stack(
        [
            (xs * a + rng.randrange(256)) % 256,
            (ys * b + rng.randrange(256)) % 256,
            (xs * ys * c) % 256,
        ],
        axis=-1,
    ).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(out, "JPEG", quality=92, subsampling=0)
    return out.getvalue()


def image_folder(root: Path, seed: int | None = None) -> dict[str, bytes]:
    """An ImageFolder tree ``root/<class>/<i>.jpg``; returns {sample key: JPEG bytes} in dataset order."""
    rng = random.Random(fresh_seed() if seed is None else seed)
    files: dict[str, bytes] = {}
    for cls in CLASSES:
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(PER_CLASS):
            data = jpeg(rng)
            (root / cls / f"{i}.jpg").write_bytes(data)
            files[f"{cls}/{i}"] = data
    return files


def class_of(key: str) -> int:
    return CLASSES.index(key.split("/", 1)[0])


def parquet_table(path: Path, rows: int = 40, seed: int | None = None) -> pa.Table:
    """A Parquet file of ``rows`` rows (id, text, score, blob); returns the table."""
    rng = random.Random(fresh_seed() if seed is None else seed)
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "text": [f"row {i} {rng.random():.6f}" for i in range(rows)],
            "score": pa.array([rng.random() for _ in range(rows)], pa.float64()),
            "blob": [rng.randbytes(rng.randrange(10, 200)) for _ in range(rows)],
        }
    )
    pq.write_table(table, path)
    return table


def wds_tars(
    folder: Path, shards: int = 3, per_shard: int = 5, seed: int | None = None
) -> tuple[list[Path], dict[str, dict[str, bytes]]]:
    """WebDataset tars written with ``tarfile`` (as any other tool would): ``part-000.tar``...;
    returns the paths and {key: {ext: bytes}}."""
    rng = random.Random(fresh_seed() if seed is None else seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths, samples = [], {}
    for s in range(shards):
        path = folder / f"part-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(per_shard):
                key = f"k{s:02d}{i:03d}"
                fields = {
                    "txt": f"sample {key} {rng.random()}".encode(),
                    "bin": rng.randbytes(rng.randrange(1, 3000)),
                }
                samples[key] = fields
                for ext, data in fields.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths, samples
