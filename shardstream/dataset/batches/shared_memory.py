"""Tensors in shared memory, made in one place.

Batches, the position shared with the workers, the stage counters, the skip count and the
transport's arenas all live in shared memory. They are made here, without a torch kernel: fresh
shared memory is zero-filled by the kernel, and a torch op may start an OpenMP pool, after which a
process forked from this one (a ``fork`` pool of a process that has a dataset) hangs in its first
OpenMP loop.
"""

from __future__ import annotations

import math

import torch


def shared_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A C-contiguous tensor of ``shape`` in new shared memory (zero-filled)."""
    shape = tuple(int(n) for n in shape)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(max(math.prod(shape) * itemsize, 1))
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, tuple(reversed(strides)))


def shared_zeros(n: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """``n`` zeros in new shared memory."""
    return shared_empty((n,), dtype)


__all__ = ["shared_empty", "shared_zeros"]
