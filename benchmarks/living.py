"""Living datasets: appending 10% more data against packing everything again (``pack.py --living``).

The 20,000-JPEG set is packed once (untimed); 10% more images (every tenth image of the set again, hard-linked
under new names, so new keys with real JPEG bytes) are then appended to it (timed), against a full re-pack
of the set with the new images (timed). Both write 256 MB tar shards with the same workers and fsync, in
this process; each round packs a fresh base first. Then the appended dataset is split into train=0.98 and
val=0.02 (no copy), and opening each part (``ShardDataset``, and its first sample) is timed against
opening the whole. Timings are reported, never asserted; run it on a quiet machine and read the ratios.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from pathlib import Path

import shardstream as ss


def _link_tree(train: Path, dest: Path, files: list[Path], prefix: str) -> None:
    for f in files:
        target = dest / f.parent.name / f"{prefix}{f.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            os.link(f, target)


def prepare(train: Path, root: Path) -> tuple[Path, Path, int]:
    """(the extra 10% folder, the whole set with it, the number of extra images)."""
    files = sorted(p for p in train.rglob("*.jpg"))
    extra = files[::10]  # every class
    _link_tree(train, root / "extra", extra, "x-")
    _link_tree(train, root / "all", files, "")
    _link_tree(train, root / "all", extra, "x-")
    return root / "extra", root / "all", len(extra)


def run(train: Path, root: Path, repeat: int, workers: int, shard_size: str) -> dict[str, float]:
    extra, whole, n_extra = prepare(train, root)
    kw = {"workers": workers, "shard_size": shard_size, "progress": False}
    full, append = [], []
    for _ in range(repeat):
        out = root / "out"
        shutil.rmtree(out, ignore_errors=True)
        ss.pack(str(train), str(out), **kw)  # the dataset as it was (untimed)
        started = time.perf_counter()
        result = ss.pack(str(extra), str(out), append=True, **kw)
        append.append(time.perf_counter() - started)
        assert result.manifest.version == 2
        shutil.rmtree(root / "full", ignore_errors=True)
        started = time.perf_counter()
        again = ss.pack(str(whole), str(root / "full"), **kw)
        full.append(time.perf_counter() - started)
        assert again.manifest.num_samples == result.manifest.num_samples
    best_full, best_append = min(full), min(append)
    print(
        f"append {n_extra:,} images to {result.manifest.num_samples - n_extra:,}: best "
        f"{best_append:.2f} s (median {statistics.median(append):.2f}); full re-pack of "
        f"{again.manifest.num_samples:,}: best {best_full:.2f} s (median {statistics.median(full):.2f}); "
        f"full / append = {best_full / best_append:.1f}x",
        flush=True,
    )
    opened = open_split(root, root / "out", repeat)
    return {
        "append_s": best_append,
        "full_repack_s": best_full,
        "ratio": best_full / best_append,
        **opened,
    }


def _open_seconds(url: str, repeat: int) -> tuple[float, float]:
    """(best seconds to make a ShardDataset, best seconds to its first sample) of ``url``."""
    opens, firsts = [], []
    for _ in range(max(repeat, 3)):
        started = time.perf_counter()
        ds = ss.ShardDataset(url, decode=None)
        opened = time.perf_counter()
        next(iter(ds))
        opens.append(opened - started)
        firsts.append(time.perf_counter() - started)
    return min(opens), min(firsts)


def open_split(root: Path, source: Path, repeat: int) -> dict[str, float]:
    """Split ``source`` into train=0.98 and val=0.02 (timed), then open each part and the whole."""
    shutil.rmtree(root / "parts", ignore_errors=True)
    started = time.perf_counter()
    ss.split(str(source), str(root / "parts"), {"train": 0.98, "val": 0.02}, seed=0)
    took = time.perf_counter() - started
    whole = _open_seconds(str(source), repeat)
    train = _open_seconds(str(root / "parts" / "train"), repeat)
    val = _open_seconds(str(root / "parts" / "val"), repeat)
    print(
        f"split into train=0.98 val=0.02 (reads every shard's keys once): {took:.2f} s; open / first "
        f"sample, best: whole {whole[0] * 1e3:.1f} / {whole[1] * 1e3:.1f} ms, train "
        f"{train[0] * 1e3:.1f} / {train[1] * 1e3:.1f} ms, val {val[0] * 1e3:.1f} / {val[1] * 1e3:.1f} ms; "
        f"train open / whole open = {train[0] / whole[0]:.2f}x",
        flush=True,
    )
    return {
        "split_s": took,
        "open_whole_s": whole[0],
        "open_train_s": train[0],
        "open_val_s": val[0],
        "first_whole_s": whole[1],
        "first_train_s": train[1],
    }
