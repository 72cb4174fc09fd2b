"""Per-batch seeds for ``random``, ``numpy`` and ``torch`` in DataLoader workers.

Random augmentations in workers must differ between workers, ranks and epochs (or every
worker crops the same way), yet a run must be reproducible from its seed. A worker
reseeds the three generators before each batch that runs the user's code, from (seed, epoch, position of
the batch's first sample in the epoch's order). So the draws of a batch depend on
which samples it holds, not on which worker or rank makes it: they are the same with
any ``num_workers`` or world size, and after a mid-epoch resume. The main process's
generators are never touched.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def batch_seed(seed: int, epoch: int, position: int) -> int:
    """A 64-bit seed that differs for every (seed, epoch, position) and is stable across runs."""
    seed &= (1 << 64) - 1  # negative seeds too (SeedSequence takes non-negative words)
    words = np.random.SeedSequence(
        [seed & 0xFFFFFFFF, seed >> 32, epoch, position & 0xFFFFFFFF, position >> 32]
    ).generate_state(2)
    return int(words[0]) | (int(words[1]) << 32)


def seed_batch(seed: int, epoch: int, position: int) -> int:
    """Seed ``random``, ``numpy``'s global generator and ``torch`` for one batch; returns the seed."""
    value = batch_seed(seed, epoch, position)
    random.seed(value)
    np.random.seed(value & 0xFFFFFFFF)
    torch.manual_seed(value)
    return value
