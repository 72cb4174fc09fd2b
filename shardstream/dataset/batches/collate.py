"""Batches from sample dicts, built for the trip from a worker to the main process.

Tensors cross process boundaries as shared memory (a file descriptor, no copy) while
anything else is pickled through a pipe. So a batch is made of as few, as large tensors
as possible: images are stacked into one uint8 tensor (N×C×H×W, stored channels-last,
which is what decoders produce and what GPUs prefer), and bytes fields become one
:class:`RaggedBytes` (a uint8 tensor plus offsets) instead of a list of bytes objects.

For fields of varying length, :func:`pad_sequences` pads them into one tensor with
their lengths and a mask, and :class:`FieldCollate` is a ``collate_fn`` that pads some
fields, keeps others as lists (detection boxes) and collates the rest as above;
:class:`AudioCollate` pads decoded recordings of varying length to the longest of a batch, or crops
them to the shortest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ...errors import ShardstreamError, UsageError
from ..samples.decode import PendingJpeg
from ..shards.mapped import (
    MappedBytes as MappedBytes,  # its home is mapped; re-exported, batches use it
)
from .shared_memory import shared_empty

Allocator = Callable[[tuple[int, ...], torch.dtype], "torch.Tensor | None"]
_ALLOCATOR: ContextVar[Allocator | None] = ContextVar("shardstream_batch_allocator", default=None)


@contextlib.contextmanager
def allocating(allocate: Allocator) -> Iterator[None]:
    """Inside the block, batches made in this thread take their tensors from ``allocate(shape,
    dtype)`` where it gives one (a transport's reused arena), instead of new shared memory."""
    token = _ALLOCATOR.set(allocate)
    try:
        yield
    finally:
        _ALLOCATOR.reset(token)


def empty_batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor for a batch: from the active allocator (see :func:`allocating`) when there is
    one, else in shared memory already in a worker, so sending it copies nothing."""
    allocate = _ALLOCATOR.get()
    if allocate is not None:
        found = allocate(tuple(shape), dtype)
        return found if found is not None else torch.empty(shape, dtype=dtype)
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    return shared_empty(shape, dtype)


class RaggedBytes(Sequence):
    """A batch of byte strings in one uint8 tensor: ``batch[i]`` is the i-th value's bytes."""

    def __init__(self, data: torch.Tensor, offsets: torch.Tensor):
        self.data = data  # uint8, all values end to end
        self.offsets = offsets  # int64, len(batch) + 1

    def slice(self, start: int, stop: int) -> RaggedBytes:
        """Values ``start:stop`` as views of the same memory (offsets kept absolute)."""
        return RaggedBytes(self.data, self.offsets[start : stop + 1])

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
            return list(self) == list(other)
        if isinstance(other, (list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"RaggedBytes({len(self)} values, {self.data.numel():,} bytes)"

    def __reduce__(self):
        return (RaggedBytes, (self.data, self.offsets))

    def pin_memory(self, device: Any = None) -> RaggedBytes:
        """What the DataLoader's pin-memory thread calls (else it would turn the batch into a list)."""
        pin = (lambda t: t.pin_memory()) if device is None else (lambda t: t.pin_memory(device))
        return RaggedBytes(pin(self.data), pin(self.offsets))


def ragged_fields(fields: list[Sequence[bytes | bytearray | memoryview]]) -> list[RaggedBytes]:
    """Several bytes fields of a batch in ONE shared-memory arena: one storage crosses to the
    main process instead of one per field (each costs a file-descriptor hand-over)."""
    counts = [len(values) for values in fields]
    sizes = [
        np.fromiter((memoryview(v).nbytes for v in values), dtype=np.int64, count=len(values))
        for values in fields
    ]
    index_bytes = 8 * sum(n + 1 for n in counts)  # every field's offsets, int64, first in the arena
    arena = empty_batch_tensor((index_bytes + int(sum(int(z.sum()) for z in sizes)),), torch.uint8)
    index = arena[:index_bytes].view(torch.int64)
    flat = memoryview(arena.numpy()).cast("B")
    out = []
    at, pos = 0, index_bytes
    for values, size in zip(fields, sizes):
        offsets = index[at : at + len(values) + 1]
        bounds = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(size, out=bounds[1:])
        offsets.copy_(torch.from_numpy(bounds))
        for value, start, stop in zip(values, bounds[:-1].tolist(), bounds[1:].tolist()):
            # one copy, from the shard's memory into the batch's
            flat[pos + start : pos + stop] = value
        out.append(RaggedBytes(arena[pos : pos + int(bounds[-1])], offsets))
        at += len(values) + 1
        pos += int(bounds[-1])
    return out


def cut_batch(batch: dict[str, Any], size: int) -> list[dict[str, Any]]:
    """A collated batch cut into batches of ``size`` (views, no copies)."""
    n = len(batch["__key__"]) if "__key__" in batch else len(next(iter(batch.values())))
    out = []
    for start in range(0, n, size):
        stop = min(start + size, n)
        part: dict[str, Any] = {}
        for name, value in batch.items():
            part[name] = value.slice(start, stop) if hasattr(value, "slice") else value[start:stop]
        out.append(part)
    return out


def _stack_images(values: list[torch.Tensor]) -> torch.Tensor | None:
    """C×H×W views of H×W×C arrays (what decoders give) stacked with contiguous copies, or None."""
    first = values[0]
    if first.dim() != 3 or not all(
        v.shape == first.shape and v.dtype == first.dtype for v in values
    ):
        return None
    hwc = [v.permute(1, 2, 0) for v in values]
    if not all(h.is_contiguous() for h in hwc):
        return None
    out = empty_batch_tensor((len(values), *hwc[0].shape), first.dtype)
    _copy_rows(out, hwc)
    return out.permute(0, 3, 1, 2)  # N×C×H×W, channels-last in memory


def _copy_rows(out: torch.Tensor, rows: list[torch.Tensor]) -> None:
    """``out[i] = rows[i]``, as plain single-threaded memory copies where numpy can view the dtype.

    torch's ``copy_`` splits each image over its intra-op threads; outside DataLoader workers (which
    run one thread) those threads contend with the loader's own on a busy machine, and a batch of
    images took 16x longer to collate in the main process (num_workers=0) on 2 cores.
    """
    try:
        target = out.numpy()
        for i, row in enumerate(rows):
            target[i] = row.numpy()
    except TypeError:  # a dtype numpy cannot view (bfloat16): torch's own copy
        for i, row in enumerate(rows):
            out[i].copy_(row)


def _decoded_jpegs(values: list[Any]) -> Any:
    """JPEGs decoded straight into the batch (N x C x H x W, channels-last in memory, as other images);
    of different sizes, or mixed with decoded images: each decoded, then stacked as usual."""
    shape = values[0].shape
    if not all(type(v) is PendingJpeg and v.shape == shape for v in values):
        return _stack([v.decode() if type(v) is PendingJpeg else v for v in values])
    out = empty_batch_tensor((len(values), *shape), torch.uint8)
    target = out.numpy()
    for i, value in enumerate(values):
        value.decode_into(target[i])
    return out.permute(0, 3, 1, 2)


def _numbers(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
    out = empty_batch_tensor((len(values),), dtype)
    out.copy_(torch.tensor(values, dtype=dtype))
    return out


def _stack(values: list[Any]) -> Any:
    first = values[0]
    if type(first) is PendingJpeg:
        return _decoded_jpegs(values)
    if isinstance(first, np.ndarray):
        values = [torch.from_numpy(v) for v in values]
        first = values[0]
    if isinstance(first, torch.Tensor):
        if not all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return None
        images = _stack_images(values)
        if images is not None:
            return images
        out = empty_batch_tensor((len(values), *first.shape), first.dtype)
        _copy_rows(out, values)
        return out
    if isinstance(first, bool):
        return _numbers(values, torch.bool) if all(isinstance(v, bool) for v in values) else None
    if isinstance(first, (int, np.integer)) and all(
        isinstance(v, (int, np.integer)) for v in values
    ):
        return _numbers(values, torch.int64)
    if isinstance(first, (float, np.floating)) and all(
        isinstance(v, (int, float, np.number)) for v in values
    ):
        return _numbers(values, torch.float64)
    return None


def _is_bytes(values: list[Any]) -> bool:
    return all(isinstance(v, (bytes, bytearray, memoryview)) for v in values)


def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch from sample dicts: equal-shaped tensors and arrays stacked, numbers as tensors,
    bytes as :class:`RaggedBytes` (all bytes fields in one shared arena), anything else
    (strings, ragged shapes, PIL images) in lists."""
    batch: dict[str, Any] = {}
    raw: dict[str, list[Any]] = {}
    # every field, in first-seen order
    for name in dict.fromkeys(name for s in samples for name in s):
        values = [s.get(name) for s in samples]
        if _is_bytes(values):
            raw[name] = values
            batch[name] = None  # keeps the field order
            continue
        stacked = None if any(v is None for v in values) else _stack(values)
        if stacked is None:  # a list: shard memory (memoryview) cannot leave the worker; bytes can
            values = [
                bytes(v)
                if isinstance(v, memoryview)
                else v.decode()
                if type(v) is PendingJpeg
                else v
                for v in values
            ]
        batch[name] = stacked if stacked is not None else values
    if raw:
        batch.update(zip(raw, ragged_fields(list(raw.values()))))
    return batch


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    return torch.as_tensor(value)


def pad_sequences(
    values: Sequence[Any], padding_value: float = 0, *, max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences of varying length as one batch: ``(padded, lengths, mask)``.

    ``values`` are tensors, numpy arrays or lists, each ``L_i x ...`` with the same
    trailing shape; ``padded`` is ``N x L x ...`` (``L`` the longest, or ``max_length``
    when that is shorter: longer sequences are cut), filled with ``padding_value`` after
    each sequence; ``lengths`` is int64 ``N``; ``mask`` is bool ``N x L``, True on real
    items. Mixed dtypes are promoted as torch would. In a DataLoader worker the tensors
    are made in shared memory, so sending them copies nothing.

    Args:
        values: the sequences, one per sample.
        padding_value: what fills each row after its sequence.
        max_length: the most items a row keeps (default: the longest sequence).

    Returns:
        ``(padded, lengths, mask)``.
    """
    if len(values) == 0:
        raise UsageError("pad_sequences needs at least one sequence")
    tensors = [_as_tensor(v) for v in values]
    first = tensors[0]
    if any(t.dim() == 0 for t in tensors):
        raise UsageError(
            "pad_sequences needs sequences (tensors of at least one dimension), not scalars"
        )
    if any(t.shape[1:] != first.shape[1:] for t in tensors):
        shapes = sorted({tuple(t.shape[1:]) for t in tensors})
        raise UsageError(f"pad_sequences needs one trailing shape after the length, not {shapes}")
    untyped = [len(t) == 0 and isinstance(v, (list, tuple)) for t, v in zip(tensors, values)]
    if any(untyped):  # an empty list says nothing of the dtype (torch would make it float32)
        typed = [t for t, u in zip(tensors, untyped) if not u]
        like = typed[0].dtype if typed else torch.int64
        tensors = [t.to(like) if u else t for t, u in zip(tensors, untyped)]
    first = tensors[0]
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if max_length is not None and max_length < 0:
        raise UsageError(f"max_length must not be negative, not {max_length}")
    counts = [len(t) if max_length is None else min(len(t), max_length) for t in tensors]
    longest = max(counts)
    padded = empty_batch_tensor((len(tensors), longest, *first.shape[1:]), dtype)
    padded.fill_(padding_value)
    for row, t, n in zip(padded, tensors, counts):
        row[:n].copy_(t[:n])
    lengths = empty_batch_tensor((len(tensors),), torch.int64)
    lengths.copy_(torch.tensor(counts, dtype=torch.int64))
    mask = empty_batch_tensor((len(tensors), longest), torch.bool)
    torch.lt(torch.arange(longest).unsqueeze(0), lengths.unsqueeze(1), out=mask)
    return padded, lengths, mask


def _list_item(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    # shard memory cannot leave the worker
    return bytes(value) if isinstance(value, memoryview) else value


class FieldCollate:
    """A ``collate_fn`` for sample dicts with fields of varying size.

    Fields in ``pad`` become :func:`pad_sequences` batches: ``batch[name]`` padded,
    ``batch[name + "_lengths"]`` and ``batch[name + "_mask"]``; ``pad`` is a list of names
    (padded with ``padding_value``) or a mapping from name to its padding value. Fields in
    ``lists`` stay lists of the samples' values, numpy arrays as tensors (detection boxes:
    one ``K_i x 4`` tensor per image). Every other field is collated by :func:`collate`.

    Works as ``ShardDataset(..., collate_fn=FieldCollate(...))`` and for a torch
    ``DataLoader``; it pickles, so ``spawn`` workers can use it. (A ``collate_fn`` other
    than the default sends batches by PyTorch's own shared-memory path instead of
    shardstream's reused arenas: see :mod:`shardstream.loader.transport`.)

    Args:
        pad: fields to pad: names, or a mapping from name to its padding value.
        lists: fields kept as one value per sample.
        padding_value: the padding of fields named in a list ``pad``.
        max_length: cut padded fields to this length (default: the longest in the batch).
    """

    def __init__(
        self,
        pad: Mapping[str, float] | Iterable[str] = (),
        lists: Iterable[str] = (),
        *,
        padding_value: float = 0,
        max_length: int | None = None,
    ):
        self.pad = dict(pad) if isinstance(pad, Mapping) else dict.fromkeys(pad, padding_value)
        self.lists = list(lists)
        both = set(self.pad) & set(self.lists)
        if both:
            raise UsageError(f"fields {sorted(both)} cannot be both padded and kept as lists")
        self.max_length = max_length
        self._checked = False

    def _check_names(self, samples: list[dict[str, Any]]) -> None:
        """Named fields that no sample of the first batch has are a typo, refused once."""
        have = dict.fromkeys(name for s in samples for name in s)
        for kind, names in (("pad", self.pad), ("lists", self.lists)):
            unknown = [name for name in names if name not in have]
            if unknown:
                raise ShardstreamError(
                    f"FieldCollate({kind}=...) names {unknown}, which the samples do not have; "
                    f"their fields are {list(have)}"
                )
        self._checked = True

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        if not self._checked and samples:
            self._check_names(samples)
        special = set(self.pad) | set(self.lists)
        rest = collate([{k: v for k, v in s.items() if k not in special} for s in samples])
        batch: dict[str, Any] = {}
        # every field, in first-seen order
        for name in dict.fromkeys(name for s in samples for name in s):
            if name in self.pad:
                values = [s.get(name) for s in samples]
                if any(v is None for v in values):
                    raise UsageError(
                        f"field {name!r} is missing from some samples, so it cannot be padded"
                    )
                padded, lengths, mask = pad_sequences(
                    values, self.pad[name], max_length=self.max_length
                )
                batch[name], batch[f"{name}_lengths"], batch[f"{name}_mask"] = padded, lengths, mask
            elif name in self.lists:
                batch[name] = [_list_item(s.get(name)) for s in samples]
            else:
                batch[name] = rest[name]
        return batch

    def __repr__(self) -> str:
        return (
            f"FieldCollate(pad={self.pad!r}, lists={self.lists!r}, max_length={self.max_length!r})"
        )


class AudioCollate:
    """A ``collate_fn`` for decoded recordings of varying length (``AudioClip`` without ``seconds``).

    Each field in ``fields`` holds a (channels, samples) tensor per sample; the batch holds it as one
    (N, channels, L) tensor with ``batch[name + "_lengths"]`` (int64 N: the samples of each row that are
    its recording's) and ``batch[name + "_mask"]`` (bool N x L, True on them). ``mode="pad"`` (the
    default): L is the longest recording, the others followed by ``padding_value``; ``mode="crop"``: L
    is the shortest, each recording's first L samples kept (the mask all True). Every other field is
    collated by :func:`collate`. It pickles, so ``spawn`` workers can use it.

    Args:
        fields: the audio fields: a name or names.
        mode: ``"pad"`` to the longest of the batch or ``"crop"`` to the shortest.
        padding_value: what follows a shorter recording when padding (default 0.0, silence).
    """

    def __init__(
        self, fields: str | Iterable[str], *, mode: str = "pad", padding_value: float = 0.0
    ):
        if mode not in ("pad", "crop"):
            raise UsageError(f'AudioCollate(mode={mode!r}) must be "pad" or "crop"')
        self.fields = [fields] if isinstance(fields, str) else list(fields)
        if not self.fields:
            raise UsageError("AudioCollate needs at least one field")
        self.mode, self.padding_value = mode, float(padding_value)

    def _batch(self, name: str, samples: list[dict[str, Any]]) -> tuple[torch.Tensor, ...]:
        values = [s.get(name) for s in samples]
        for s, v in zip(samples, values):
            if not (isinstance(v, torch.Tensor) and v.dim() == 2):
                what = "no value" if v is None else f"a {type(v).__name__}"
                raise UsageError(
                    f"AudioCollate: field {name!r} of sample {s.get('__key__')!r} holds {what}, not "
                    f"a (channels, samples) tensor; decode it with decode={{{name!r}: ss.AudioClip()}}"
                )
        channels = {int(v.shape[0]) for v in values}
        if len(channels) > 1:
            raise UsageError(
                f"AudioCollate: field {name!r} holds {sorted(channels)} channels in one batch; "
                "decode it with ss.AudioClip(mono=True) or to one channel count"
            )
        lengths = [int(v.shape[1]) for v in values]
        size = max(lengths) if self.mode == "pad" else min(lengths)
        dtype = values[0].dtype
        for v in values[1:]:
            dtype = torch.promote_types(dtype, v.dtype)
        out = empty_batch_tensor((len(values), channels.pop(), size), dtype)
        if self.mode == "pad" and min(lengths) < size:
            out.fill_(self.padding_value)
        kept = [min(n, size) for n in lengths]
        for row, v, n in zip(out, values, kept):
            row[:, :n].copy_(v[:, :n])
        counts = empty_batch_tensor((len(values),), torch.int64)
        counts.copy_(torch.tensor(kept, dtype=torch.int64))
        mask = empty_batch_tensor((len(values), size), torch.bool)
        torch.lt(torch.arange(size).unsqueeze(0), counts.unsqueeze(1), out=mask)
        return out, counts, mask

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        special = set(self.fields)
        rest = collate([{k: v for k, v in s.items() if k not in special} for s in samples])
        batch: dict[str, Any] = {}
        for name in dict.fromkeys([*(n for s in samples for n in s), *self.fields]):
            if name in special:
                audio, lengths, mask = self._batch(name, samples)
                batch[name], batch[f"{name}_lengths"], batch[f"{name}_mask"] = audio, lengths, mask
            else:
                batch[name] = rest[name]
        return batch

    def __repr__(self) -> str:
        return (
            f"AudioCollate(fields={self.fields!r}, mode={self.mode!r}, "
            f"padding_value={self.padding_value!r})"
        )
