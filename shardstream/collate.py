"""Batches from sample dicts, built for the trip from a worker to the main process.

Tensors cross process boundaries as shared memory (a file descriptor, no copy) while
anything else is pickled through a pipe. So a batch is made of as few, as large tensors
as possible: images are stacked into one uint8 tensor (N×C×H×W, stored channels-last,
which is what decoders produce and what GPUs prefer), and bytes fields become one
:class:`RaggedBytes` (a uint8 tensor plus offsets) instead of a list of bytes objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor for a batch; in a worker, in shared memory already, so sending it copies nothing."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    proto = torch.empty(0, dtype=dtype)
    storage = proto._typed_storage()._new_shared(int(np.prod(shape)), device="cpu")
    return proto.new(storage).resize_(shape)


class RaggedBytes(Sequence):
    """A batch of byte strings in one uint8 tensor: ``batch[i]`` is the i-th value's bytes."""

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor):
        self.data = data  # uint8, all values end to end
        self.offsets = offsets  # int64, len(batch) + 1

    @classmethod
    def from_values(cls, values: Sequence[bytes | bytearray | memoryview]) -> RaggedBytes:
        sizes = np.fromiter((memoryview(v).nbytes for v in values), dtype=np.int64, count=len(values))
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = _empty((int(offsets[-1]),), torch.uint8)
        if len(data):
            flat = memoryview(data.numpy()).cast("B")
            for value, start, stop in zip(values, offsets[:-1].tolist(), offsets[1:].tolist()):
                flat[start:stop] = value  # one copy, from the shard's memory into the batch's
        return cls(data, torch.from_numpy(offsets))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # int -> bytes, slice -> list of bytes
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for a batch of {n}")
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.data[start:stop].numpy().tobytes()

    def __iter__(self) -> Iterator[bytes]:
        flat = self.data.numpy()
        bounds = self.offsets.tolist()
        for start, stop in zip(bounds[:-1], bounds[1:]):
            yield flat[start:stop].tobytes()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RaggedBytes):
            return torch.equal(self.offsets, other.offsets) and torch.equal(self.data, other.data)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RaggedBytes({len(self)} values, {self.data.numel():,} bytes)"

    def __reduce__(self):
        return (RaggedBytes, (self.data, self.offsets))


def _stack_images(values: list[torch.Tensor]) -> torch.Tensor | None:
    """C×H×W views of H×W×C arrays (what decoders give) stacked with contiguous copies, or None."""
    first = values[0]
    if first.dim() != 3 or not all(v.shape == first.shape and v.dtype == first.dtype for v in values):
        return None
    hwc = [v.permute(1, 2, 0) for v in values]
    if not all(h.is_contiguous() for h in hwc):
        return None
    out = _empty((len(values), *hwc[0].shape), first.dtype)
    for i, h in enumerate(hwc):
        out[i].copy_(h)
    return out.permute(0, 3, 1, 2)  # N×C×H×W, channels-last in memory


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, np.ndarray):
        values = [torch.from_numpy(v) for v in values]
        first = values[0]
    if isinstance(first, torch.Tensor):
        if not all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return None
        images = _stack_images(values)
        if images is not None:
            return images
        out = _empty((len(values), *first.shape), first.dtype)
        return torch.stack(values, out=out)
    if isinstance(first, bool):
        return torch.tensor(values, dtype=torch.bool) if all(isinstance(v, bool) for v in values) else None
    if isinstance(first, (int, np.integer)) and all(isinstance(v, (int, np.integer)) for v in values):
        return torch.tensor(values, dtype=torch.int64)
    if isinstance(first, (float, np.floating)) and all(isinstance(v, (int, float, np.number)) for v in values):
        return torch.tensor(values, dtype=torch.float64)
    if isinstance(first, (bytes, bytearray, memoryview)) and all(
        isinstance(v, (bytes, bytearray, memoryview)) for v in values
    ):
        return RaggedBytes.from_values(values)
    return None


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch from sample dicts: equal-shaped tensors and arrays stacked, numbers as tensors,
    bytes as :class:`RaggedBytes`, anything else (strings, ragged shapes, PIL images) in lists."""
    batch: dict[str, Any] = {}
    for name in dict.fromkeys(name for s in samples for name in s):  # every field, in first-seen order
        values = [s.get(name) for s in samples]
        stacked = None if any(v is None for v in values) else _stack(values)
        batch[name] = stacked if stacked is not None else values
    return batch
