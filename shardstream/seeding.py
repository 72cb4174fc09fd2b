"""Per-worker, per-epoch seeds for ``random``, ``numpy`` and ``torch``.

Random augmentations in DataLoader workers must differ between workers, ranks and
epochs (or every worker crops the same way), yet a run must be reproducible from its
seed. Each worker reseeds the three generators at the start of every pass from
(seed, epoch, rank, worker id); the main process's generators are never touched.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def worker_seed(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """A 64-bit seed that differs for every (seed, epoch, rank, worker) and is stable across runs."""
    words = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, epoch, rank, worker_id]).generate_state(2)
    return int(words[0]) | (int(words[1]) << 32)


def seed_worker(seed: int, epoch: int, rank: int, worker_id: int) -> int:
    """Seed ``random``, ``numpy``'s global generator and ``torch`` in this worker; returns the seed."""
    value = worker_seed(seed, epoch, rank, worker_id)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    torch.manual_seed(value)
    return value
