"""Loading a manifest of many shards: the old one-file JSON against the JSON head + Arrow shard table.

Builds a synthetic manifest (``--shards``, default 10^6, real sha256 hex per shard, optionally a
sample-index checksum column), writes it both ways, and times ``load_manifest`` (best and median
of ``--repeat``), from a local folder and (``--s3``) from a moto S3 server on 127.0.0.1. Bytes
transferred are the sizes of the files a load reads. Run: ``python benchmarks/manifest.py --s3``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from shardstream.manifest import Manifest, load_manifest, write_manifest  # noqa: E402
from shardstream.storage import Store  # noqa: E402


def synthetic(n: int, index: bool) -> Manifest:
    """``n`` shards as a pack writes them: sorted paths, counts, sizes, sha256 hex."""
    rng = np.random.default_rng(0)
    digest = rng.integers(0, 256, (n, 32), np.uint8).tobytes().hex()
    sha = [digest[64 * i : 64 * i + 64] for i in range(n)]
    idx = [hashlib.sha256(s.encode()).hexdigest() for s in sha] if index else None
    return Manifest(
        "tar",
        [f"shard-{i:07d}.tar" for i in range(n)],
        rng.integers(900, 1100, n),
        rng.integers(60_000_000, 70_000_000, n),
        sha,
        index_sha256=idx,
    )


def folder_files(folder: Path) -> list[Path]:
    """Every file of a manifest folder, those under ``.shardstream/`` (the shard table) included."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder_files(folder))


def timed(store: Store, repeat: int) -> tuple[float, float, str]:
    times, fingerprint = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        m = load_manifest(store)
        times.append(time.perf_counter() - start)
        fingerprint = m.fingerprint
    return min(times), statistics.median(times), fingerprint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--index", action="store_true", help="also an index_sha256 column")
    parser.add_argument("--s3", action="store_true", help="also load from a moto S3 server")
    args = parser.parse_args()
    m = synthetic(args.shards, args.index)
    with tempfile.TemporaryDirectory() as tmp:
        folders = {"json": Path(tmp, "json"), "table": Path(tmp, "table")}
        for form, folder in folders.items():
            folder.mkdir()
            start = time.perf_counter()
            write_manifest(
                Store(str(folder)),
                m,
                fsync=False,
                table_threshold=(1 << 62) if form == "json" else 1,
            )
            print(
                f"write {form:5}: {time.perf_counter() - start:.2f} s, {folder_bytes(folder) / 1e6:.1f} MB"
            )
        rows = []
        for form, folder in folders.items():
            best, median, fp = timed(Store(str(folder)), args.repeat)
            rows.append(("local", form, best, median, folder_bytes(folder), fp))
        if args.s3:
            rows += remote(folders, args.repeat)
    print(
        f"\n{args.shards} shards{' + index_sha256' if args.index else ''}, best/median of {args.repeat}\n"
    )
    print("| where | form | load best s | load median s | MB transferred |")
    print("|---|---|---|---|---|")
    base = {where: best for where, form, best, *_ in rows if form == "json"}
    for where, form, best, median, size, _ in rows:
        print(
            f"| {where} | {form} | {best:.3f} ({best / base[where]:.2f}x) | {median:.3f} | {size / 1e6:.1f} |"
        )
    assert len({fp for *_, fp in rows}) == 1, "the fingerprint differs between forms"
    print("\nfingerprint: the same in every form")


def remote(folders: dict[str, Path], repeat: int) -> list[tuple]:
    from tests.remote.endpoints import DUMMY_AWS_ENV, MotoS3

    os.environ.update(DUMMY_AWS_ENV)
    rows = []
    with MotoS3() as s3:
        bucket = s3.new_bucket()
        for form, folder in folders.items():
            store = Store(bucket.url(form), bucket.storage_options)
            for path in folder_files(folder):
                with store.open_write(path.relative_to(folder).as_posix()) as f:
                    f.write(path.read_bytes())
            best, median, fp = timed(Store(bucket.url(form), bucket.storage_options), repeat)
            rows.append(("moto S3", form, best, median, folder_bytes(folder), fp))
    return rows


if __name__ == "__main__":
    main()
