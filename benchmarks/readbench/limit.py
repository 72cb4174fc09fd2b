"""The decode limit (``limit`` mode): Pillow's and simplejpeg's decode rate of the same JPEGs in one process.

The JPEGs are decoded in a loop from bytes in memory; the limit is the rate of the same loop in one
process per core at once (what the cores really give together; one process's rate x the cores is shown
too). simplejpeg is measured both ways a reader could call it, allocating each image and decoding into a
reused batch of 64 rows (``buffer=``, as shardstream does), and the faster way is the limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from _data import ImageSet

from .decoding import pil_chw, simplejpeg_chw
from .procfs import cores

LIMIT_IMAGES = 4000


def decode_loop(decode: Callable[[bytes], Any], blobs: list[bytes]) -> float:
    """Seconds to decode every blob, one after the other."""
    started = time.perf_counter()
    for blob in blobs:
        decode(blob)
    return time.perf_counter() - started


class IntoBatch:
    """simplejpeg decoding into the rows of a reused 64-image buffer (no allocation per image)."""

    def __init__(self) -> None:
        self.rows: Any = None
        self.i = 0

    def __call__(self, data: bytes) -> Any:
        import numpy as np
        import simplejpeg

        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        if self.rows is None or self.rows.shape[1:3] != (height, width):
            self.rows = np.empty((64, height, width, 3), np.uint8)
        self.i = (self.i + 1) % 64
        return simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=self.rows[self.i])


def _rates(decode: Callable[[bytes], Any], blobs: list[bytes], n: int) -> tuple[float, float]:
    """(one process's rate, ``n`` processes' rate together) of ``decode`` over ``blobs``."""
    import multiprocessing

    decode(blobs[0])  # imports, outside the timed loop
    seconds = decode_loop(decode, blobs)
    with multiprocessing.get_context("fork").Pool(n) as pool:
        pool.starmap(decode_loop, [(decode, blobs[:8])] * n)  # started and warm before the clock
        started = time.perf_counter()
        pool.starmap(decode_loop, [(decode, blobs)] * n)
        parallel = time.perf_counter() - started
    return len(blobs) / seconds, n * len(blobs) / parallel


def run_limit(tool: str, images: ImageSet, count: int) -> dict[str, Any]:
    """Decode ``count`` of the JPEGs (spread over the set) in a loop in this one process.

    Also measured, for comparison with the limit (cores x this rate): the same loop in one
    process per core at once (forked), which shows what the cores really give together.
    """
    files = images.files()
    step = max(len(files) // count, 1)
    blobs = [p.read_bytes() for p in files[::step][:count]]
    n = cores()
    ways = [pil_chw] if tool == "pillow" else [simplejpeg_chw, IntoBatch()]
    rates = [_rates(decode, blobs, n) for decode in ways]
    one, together = max(r[0] for r in rates), max(r[1] for r in rates)
    return {
        "rate": one,
        "samples": len(blobs),
        "seconds": len(blobs) / one,
        "ttfb": None,
        "decoder": tool,
        "parallel_processes": n,
        "parallel_rate": together,
    }
