"""What the machine is, and which shardstream the children import (a ``PYTHONPATH`` snapshot, or the install)."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from _data import REPO_ROOT
from pack import machine as pack_machine


def machine() -> dict[str, Any]:
    info = pack_machine()
    versions: dict[str, str | None] = {}
    for package in (
        "shardstream",
        "torch",
        "webdataset",
        "mosaicml-streaming",
        "litdata",
        "simplejpeg",
        "pillow",
        "pyarrow",
    ):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    info.pop("shardstream", None)
    info.pop("webdataset", None)
    return {**info, "versions": versions, "commit": commit(), **shardstream_source()}


def shardstream_source() -> dict[str, str | None]:
    """Where the children import shardstream from (``PYTHONPATH`` may point at a snapshot) and a digest of it."""
    import hashlib
    from importlib.util import find_spec

    spec = find_spec("shardstream")
    if spec is None or spec.origin is None:
        return {"shardstream_path": None, "shardstream_digest": None}
    package = Path(spec.origin).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return {"shardstream_path": str(package), "shardstream_digest": digest.hexdigest()[:12]}


def commit() -> str | None:
    """The repository's commit, with ``+dirty`` when shardstream/ has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "shardstream"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")
