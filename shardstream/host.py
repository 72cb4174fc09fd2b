"""Facts about this machine that several stages need: the cores this process may use, the training
processes that share the machine, and the shared-memory file system's free space.

One home for them, so that packing, the loader, ``bench`` and ``doctor`` count the same way.
"""

from __future__ import annotations

import os

SHM_PATH = "/dev/shm"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; every core where that is not known)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def local_ranks() -> int:
    """Training processes on this machine (``LOCAL_WORLD_SIZE``, set by torchrun): they share its cores
    and /dev/shm."""
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def loader_workers() -> int:
    """DataLoader workers when none are asked for: min(4 x GPUs, CPU cores - 1), shared among the
    training processes of this machine, at least 1."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    # torchrun's processes on this machine share its cores (each sees every GPU)
    return max(min(4 * gpus, usable_cores() - 1) // local_ranks(), 1)


def shm_free_bytes(path: str = SHM_PATH) -> int | None:
    """Free bytes in the shared-memory file system, or None where there is none (not Linux)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


__all__ = ["SHM_PATH", "loader_workers", "local_ranks", "shm_free_bytes", "usable_cores"]
