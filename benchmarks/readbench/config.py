"""Settings every part of the read benchmark shares: the modes, the loaders' settings, the child protocol."""

from __future__ import annotations

import os
from pathlib import Path

# the entry point; children run it again
SCRIPT = Path(__file__).resolve().parent.parent / "read.py"
LOADER_MODES = ("raw", "pillow", "fast")
MODES = (*LOADER_MODES, "limit", "memory", "arrow")
BATCH_SIZE = 64
WORKERS = 2
SHARD_SIZE = "64MB"
SHARD_BYTES = 64_000_000
MEMORY_EPOCHS = 3
LOCAL = "local"  # where a job reads: converted data on local disk, or a place of _remote.RemoteS3
RESULT_PREFIX = "RESULT="  # a child prints its result as one line: RESULT=<json>


def child_env() -> dict[str, str]:
    """The environment of every child process (conversions and measured runs)."""
    env = dict(os.environ)
    env.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.pop("WDS_SEED", None)
    return env
