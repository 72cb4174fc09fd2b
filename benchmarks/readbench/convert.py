"""Each tool's converted copy of the data, under ``<set>/read/<name>/``: written once (untimed), then reused.

A copy is reused while its marker ``<set>/read/<name>.json`` matches (the image count, the Arrow rows
and :data:`READ_DATA_VERSION`). shardstream's tars and the Arrow shards are written by ``shardstream
pack``; mosaic's and litdata's by their own libraries in a child process (``read.py --convert NAME``);
the Parquet table of ``arrow`` mode likewise. webdataset reads shardstream's tars. A tool that cannot
be imported or fails to convert is reported and left out; the others still run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from _data import ImageSet

from .arrow import write_table
from .config import SCRIPT, child_env
from .tools import WRITERS
from .tools.shardstream import pack_argv

READ_DATA_VERSION = 3  # bump when a conversion changes, so old conversions are redone


@dataclass
class Conversion:
    """One tool's converted copy of the data, under ``<set>/read/<name>/``."""

    name: str
    path: Path
    seconds: float = 0.0
    nbytes: int = 0
    files: int = 0
    reused: bool = False
    problem: str | None = None


def folder_size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def conversion_argv(
    name: str, images: ImageSet, read_root: Path, args: argparse.Namespace
) -> list[str]:
    out = read_root / name
    if name == "shardstream":
        return pack_argv(images.train, out)
    if name == "arrow":
        return pack_argv(read_root / "table" / "table.parquet", out)
    return [
        sys.executable,
        str(SCRIPT),
        "--convert",
        name,
        "--data",
        str(args.data),
        "--count",
        str(images.count),
        "--arrow-rows",
        str(args.arrow_rows),
    ]


def convert(name: str, images: ImageSet, read_root: Path, args: argparse.Namespace) -> Conversion:
    """The tool's copy of the data: reused when its marker matches, else written now (untimed)."""
    out = read_root / name
    marker = read_root / f"{name}.json"
    expected = {
        "count": images.count,
        "version": READ_DATA_VERSION,
        "rows": args.arrow_rows if name in ("table", "arrow") else None,
    }
    try:
        doc = json.loads(marker.read_text())
        if {k: doc.get(k) for k in expected} == expected and out.is_dir():
            return Conversion(name, out, doc["seconds"], doc["bytes"], doc["files"], reused=True)
    except (OSError, ValueError, KeyError):
        pass
    marker.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    read_root.mkdir(parents=True, exist_ok=True)
    print(f"converting for {name} into {out} ...", flush=True)
    started = time.perf_counter()
    proc = subprocess.run(
        conversion_argv(name, images, read_root, args),
        capture_output=True,
        text=True,
        env=child_env(),
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0 or not out.is_dir():
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        return Conversion(
            name, out, seconds, problem=f"conversion failed (exit {proc.returncode}): {tail}"
        )
    nbytes, files = folder_size(out)
    marker.write_text(
        json.dumps({**expected, "seconds": round(seconds, 2), "bytes": nbytes, "files": files})
        + "\n"
    )
    return Conversion(name, out, seconds, nbytes, files)


def child_convert(name: str, images: ImageSet, read_root: Path, rows: int) -> None:
    """In the ``--convert NAME`` child: write the copy with the tool's own library."""
    out = read_root / name
    if name in WRITERS:
        WRITERS[name](images, out)
    elif name == "table":
        write_table(out, rows)
    else:
        raise SystemExit(f"no conversion named {name!r}")


def conversion_lines(conversions: list[Conversion]) -> list[str]:
    lines = []
    for c in conversions:
        if c.problem:
            lines.append(f"{c.name}: {c.problem}")
        else:
            how = "reused" if c.reused else "written"
            lines.append(
                f"{c.name}: {c.files} files, {c.nbytes / 1e6:,.1f} MB in {c.path} ({how}; conversion took "
                f"{c.seconds:.1f} s)"
            )
    return lines
