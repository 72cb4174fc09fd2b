"""A sample image folder to pack: COUNT JPEGs of SIZE x SIZE pixels in class folders (ImageFolder layout).

    python sample_images.py /tmp/images --count 240 --classes 3 --size 224

Deterministic (seeded), standard library + numpy + Pillow: what the shardstream image has.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np
from PIL import Image


def make_images(root: Path, count: int, classes: int, size: int, seed: int = 0) -> int:
    """Write ``count`` JPEGs under ``root/class_<c>/``; returns how many."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    for i in range(count):
        c = i % classes
        folder = root / f"class_{c}"
        folder.mkdir(parents=True, exist_ok=True)
        rgb = np.stack([(x + 40 * c) % 256, (y + 7 * i) % 256, (x + y) // 2 % 256], axis=-1).astype(
            np.float32
        )
        rgb = np.clip(rgb + rng.normal(0, 8, rgb.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(rgb).save(buf, format="JPEG", quality=85)
        (folder / f"img_{i:05d}.jpg").write_bytes(buf.getvalue())
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--count", type=int, default=240)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    n = make_images(args.root, args.count, args.classes, args.size)
    print(f"wrote {n} images of {args.size}x{args.size} in {args.classes} classes to {args.root}")


if __name__ == "__main__":
    main()
