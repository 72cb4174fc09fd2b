"""The decode limit (``limit`` mode): Pillow's and simplejpeg's decode rate of the same JPEGs in one process.

The JPEGs are decoded in a loop from bytes in memory; the limit is that rate x the number of cores.
The same loop in one process per core at once is reported too: what the cores really give together.
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


def run_limit(tool: str, images: ImageSet, count: int) -> dict[str, Any]:
    """Decode ``count`` of the JPEGs (spread over the set) in a loop in this one process.

    Also measured, for comparison with the limit (cores x this rate): the same loop in one
    process per core at once (forked), which shows what the cores really give together.
    """
    import multiprocessing

    files = images.files()
    step = max(len(files) // count, 1)
    blobs = [p.read_bytes() for p in files[::step][:count]]
    decode = {"pillow": pil_chw, "simplejpeg": simplejpeg_chw}[tool]
    decode(blobs[0])  # imports, outside the timed loop
    seconds = decode_loop(decode, blobs)
    n = cores()
    with multiprocessing.get_context("fork").Pool(n) as pool:
        pool.starmap(decode_loop, [(decode, blobs[:8])] * n)  # started and warm before the clock
        started = time.perf_counter()
        pool.starmap(decode_loop, [(decode, blobs)] * n)
        parallel = time.perf_counter() - started
    return {"rate": len(blobs) / seconds, "samples": len(blobs), "seconds": seconds, "ttfb": None,
            "decoder": tool, "parallel_processes": n, "parallel_rate": n * len(blobs) / parallel}
