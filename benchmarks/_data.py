"""Benchmark data shared by the pack (and later read) benchmarks: a synthetic ImageFolder of JPEGs.

``ensure_image_folder(data_dir, count)`` makes ``count`` deterministic 256x256 RGB JPEGs of
about 25 KB each (smooth colour gradients plus Gaussian noise, which compress like photos
rather than like pure noise), laid out ``<set>/train/<class>/<name>.jpg`` over 10 classes.
A finished set is marked by ``<set>/COMPLETE.json``; a later call with the same parameters
reuses it, anything else (an interrupted run, other parameters) is regenerated.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np
from PIL import Image

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO_ROOT / "bench-data"
FULL_COUNT = 20_000
NUM_CLASSES = 10
IMAGE_SIZE = 256
JPEG_QUALITY = 90
SEED = 20_240_601
# Bump when the images change, so old sets on disk are regenerated instead of reused.
GENERATOR_VERSION = 1
MARKER = "COMPLETE.json"


@dataclass(frozen=True)
class ImageSet:
    """A generated ImageFolder set: ``train`` is the folder to pack."""

    root: Path
    count: int
    classes: list[str]
    total_bytes: int
    generation_seconds: float
    reused: bool

    @property
    def train(self) -> Path:
        return self.root / "train"

    @property
    def mean_bytes(self) -> float:
        return self.total_bytes / self.count if self.count else 0.0

    def files(self) -> list[Path]:
        """Every image, in sorted (class, name) order."""
        return [
            self.train / c / name
            for c in self.classes
            for name in sorted(os.listdir(self.train / c))
        ]


def set_root(data_dir: Path, count: int) -> Path:
    """Where the set of ``count`` images lives: ``DATA`` itself for the full set, ``DATA/count-N`` otherwise."""
    return data_dir if count == FULL_COUNT else data_dir / f"count-{count}"


def class_names() -> list[str]:
    return [f"class_{c:02d}" for c in range(NUM_CLASSES)]


def image_path(train: Path, index: int) -> Path:
    """Image ``index`` goes to class ``index % NUM_CLASSES``."""
    return train / f"class_{index % NUM_CLASSES:02d}" / f"img_{index:06d}.jpg"


def make_jpeg(index: int, seed: int = SEED) -> bytes:
    """The JPEG bytes of image ``index``: the same for the same (index, seed) on every machine."""
    rng = np.random.default_rng([seed, index])
    grid = int(rng.integers(3, 12))
    sigma = float(rng.uniform(8.0, 14.0))
    small = rng.integers(0, 256, (grid, grid, 3), dtype=np.uint8)
    base = Image.fromarray(small).resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
    noise = rng.standard_normal((IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.float32) * sigma
    pixels = np.clip(np.asarray(base, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def _write_chunk(args: tuple[str, int, int]) -> int:
    train, start, stop = args
    total = 0
    for index in range(start, stop):
        data = make_jpeg(index)
        image_path(Path(train), index).write_bytes(data)
        total += len(data)
    return total


def _marker_doc(count: int) -> dict[str, int]:
    return {
        "count": count,
        "classes": NUM_CLASSES,
        "size": IMAGE_SIZE,
        "quality": JPEG_QUALITY,
        "seed": SEED,
        "version": GENERATOR_VERSION,
    }


def _reuse(root: Path, count: int) -> ImageSet | None:
    try:
        doc = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if {k: doc.get(k) for k in _marker_doc(count)} != _marker_doc(count):
        return None
    classes = class_names()
    try:
        on_disk = sum(len(os.listdir(root / "train" / c)) for c in classes)
    except OSError:
        return None
    if on_disk != count:
        return None
    return ImageSet(
        root, count, classes, int(doc["total_bytes"]), float(doc["generation_seconds"]), reused=True
    )


def ensure_image_folder(
    data_dir: Path, count: int = FULL_COUNT, processes: int | None = None
) -> ImageSet:
    """The set of ``count`` images under ``data_dir``: reused when complete, generated otherwise."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    root = set_root(data_dir, count)
    found = _reuse(root, count)
    if found is not None:
        return found
    started = time.perf_counter()
    (root / MARKER).unlink(missing_ok=True)
    train = root / "train"
    if train.exists():
        shutil.rmtree(train)
    classes = class_names()
    for c in classes:
        (train / c).mkdir(parents=True)
    step = 250
    chunks = [(str(train), start, min(start + step, count)) for start in range(0, count, step)]
    with Pool(processes or os.cpu_count() or 1) as pool:
        total = sum(pool.imap_unordered(_write_chunk, chunks))
    seconds = time.perf_counter() - started
    doc = {**_marker_doc(count), "total_bytes": total, "generation_seconds": round(seconds, 3)}
    (root / MARKER).write_text(json.dumps(doc, indent=2) + "\n")
    return ImageSet(root, count, classes, total, seconds, reused=False)


def warm_page_cache(files: list[Path]) -> tuple[int, float]:
    """Read every file once so that timed runs start from a warm page cache; (bytes, seconds)."""
    started = time.perf_counter()
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total, time.perf_counter() - started
