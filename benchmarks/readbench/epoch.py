"""One timed epoch of a tool's loader, inside the measured child process.

Samples/s over the epoch runs from creating the loader's iterator to its last batch; TTFB from
creating the iterator to the first batch. In raw mode the main process takes every ``jpg`` value
as a bytes-like object (so a batch of mere locations pays for reading them), and the parent checks
the total against the JPEG bytes on disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import MEMORY_EPOCHS
from .procfs import descendants, tree_memory
from .tools import DATA_OF, LOADERS, RemoteSource


def batch_length(batch: Any) -> int:
    """Samples in a batch: a dict (its first field not named ``__...``) or a tuple (its last field)."""
    if isinstance(batch, dict):
        values = [v for k, v in batch.items() if not str(k).startswith("__")]
        return len(values[0])
    return len(batch[-1])


def describe_batch(batch: Any) -> str:
    """What a batch holds, e.g. ``jpg: torch.uint8[64, 3, 256, 256], cls: list[bytes] x64``."""
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    parts = []
    for name, value in items:
        if str(name).startswith("__"):
            continue
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            parts.append(f"{name}: {value.dtype}{list(value.shape)}")
        elif isinstance(value, (list, tuple)) and value:
            parts.append(f"{name}: list[{type(value[0]).__name__}] x{len(value)}")
        elif hasattr(value, "__len__"):
            parts.append(f"{name}: {type(value).__name__} x{len(value)}")
        else:
            parts.append(f"{name}: {type(value).__name__}")
    return ", ".join(parts)


def payload_bytes(batch: Any) -> int:
    """Bytes of the batch's undecoded ``jpg`` values, each taken as a bytes-like object (0 once decoded).

    Raw mode counts this inside the epoch, so every tool hands over usable bytes in the main
    process (a batch that holds only locations pays for reading them here), and the total is
    checked against the JPEG bytes on disk.
    """
    values = batch.get("jpg") if isinstance(batch, dict) else batch[0]
    if values is None or hasattr(values, "dtype"):
        return 0
    return sum(memoryview(v).nbytes for v in values)


def timed_epoch(loader: Iterable[Any]) -> dict[str, Any]:
    """One pass: seconds, samples, payload bytes, TTFB (from creating the iterator) and the first batch's shape."""
    started = time.perf_counter()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - started
    samples = first_samples = batch_length(first)
    payload = payload_bytes(first)
    described = describe_batch(first)
    del first
    for batch in it:
        samples += batch_length(batch)
        payload += payload_bytes(batch)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "samples": samples,
        "payload_bytes": payload,
        "ttfb": ttfb,
        "first_samples": first_samples,
        "first_batch": described,
    }


def run_loader(
    tool: str, mode: str, read_root: Path, remote: RemoteSource | None = None
) -> dict[str, Any]:
    """The loader modes (raw, pillow, fast; memory: 3 epochs with RSS after each) for one tool, in this process."""
    started = time.perf_counter()
    loader = LOADERS[tool](read_root / DATA_OF[tool], mode, remote)
    setup = time.perf_counter() - started
    epochs = []
    # remote shardstream: a second epoch from the local cache the first one filled (reported apart)
    count = (
        MEMORY_EPOCHS
        if mode == "memory"
        else 2
        if remote is not None and tool == "shardstream"
        else 1
    )
    for epoch in range(count):
        if mode == "memory" or epoch > 0:
            loader.dataset.set_epoch(epoch)
        result = timed_epoch(loader)
        rss, anon, processes = tree_memory(descendants(os.getpid()))
        epochs.append({**result, "rss": rss, "anon": anon, "processes": processes})
    first = epochs[0]
    # In pillow mode `import simplejpeg` fails in this process and its workers (see cli.child_run), so
    # shardstream cannot take its simplejpeg path there.
    decoder = {"raw": "none", "pillow": "Pillow", "fast": "simplejpeg", "memory": "simplejpeg"}[
        mode
    ]
    keep = ("samples", "seconds", "payload_bytes", "first_samples", "ttfb", "first_batch")
    return {
        "rate": first["samples"] / first["seconds"],
        **{k: first[k] for k in keep},
        "setup": setup,
        "decoder": decoder,
        "epochs": epochs,
        "warm_rate": epochs[1]["samples"] / epochs[1]["seconds"] if count == 2 else None,
    }
