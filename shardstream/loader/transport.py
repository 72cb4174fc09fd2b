"""How batches cross from DataLoader workers to the main process: through reused shared memory.

By default PyTorch puts every tensor a worker returns into a new shared-memory segment and
hands its file descriptor to the main process. For a batch of decoded images that is
about 12 MB of new pages, faulted in page by page, plus a descriptor hand-over and a fresh
mapping in the main process: on a small machine it costs as much as decoding.

Here each worker keeps a small ring of arenas (shared memory allocated once and sent
once). It collates each batch into the next free arena and sends only where the tensors
are. The main process hands out tensors that view the arena, with no copy; when the last
of a batch's tensors (and any view of them) is gone, a finalizer marks its arena free in
a shared table. A worker reuses an arena only once its batch is marked free; if none is
free within a few milliseconds (the consumer keeps batches, or stopped early), it takes
a new one. So nothing blocks, and no arena is overwritten while anyone can still read it.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..dataset.batches.collate import RaggedBytes, allocating
from ..dataset.batches.shared_memory import shared_empty

_ALIGN = 64
_WAIT_S = 0.005  # longest wait for a free arena before taking a new one


@dataclass(frozen=True)
class ArenaRef:
    """Where one tensor of a shipped batch lies in its worker's arena."""

    arena: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Shipment:
    """A batch in flight: tensors replaced by :class:`ArenaRef`, arenas sent the first time."""

    worker: int
    seq: int
    slot: int
    batch: Any
    new_arenas: dict[int, torch.Tensor] = field(default_factory=dict)
    # the worker's arenas now; the main process forgets others
    live: list[int] = field(default_factory=list)


class _Arena:
    def __init__(self, ident: int, nbytes: int):
        self.ident = ident
        self.tensor = shared_empty((max(nbytes, 1),), torch.uint8)
        self.sent = False


class Ring:
    """The worker's side: arenas to collate into, and what to send.

    ``released[worker, slot]`` (shared) is the newest sequence number of this worker whose
    batch in that slot the main process has let go of; the worker remembers which sequence
    number each slot holds, and reuses the slot only when the two agree.
    """

    def __init__(self, released: torch.Tensor, worker: int, slots: int):
        self.released, self.worker, self.slots = released, worker, slots
        # read through numpy: indexing a tensor costs microseconds
        self._released = released.numpy()
        self.arenas: list[_Arena | None] = [None] * slots
        self.holds = [-1] * slots  # sequence number of the batch each slot holds
        self.seq = 0
        self._next_id = 0
        self._want = 1 << 20

    def _new_arena(self, nbytes: int) -> _Arena:
        self._next_id += 1
        return _Arena(self._next_id, nbytes)

    def _free(self, slot: int) -> bool:
        return self.holds[slot] < 0 or int(self._released[self.worker, slot]) >= self.holds[slot]

    @contextlib.contextmanager
    def batch(self) -> Iterator[Callable[[Any], Shipment]]:
        """Collate inside the block (allocations land in the arena); call the yielded function
        on the collated batch to get what to send."""
        slot = self.seq % self.slots
        arena = self.arenas[slot]
        if arena is not None and not self._free(slot):
            deadline, pause = time.monotonic() + _WAIT_S, 0.0002
            while not self._free(slot) and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
            if not self._free(slot):  # its batch is still held: never reuse this arena
                arena = None
        if arena is None or arena.tensor.numel() < self._want:
            arena = self.arenas[slot] = self._new_arena(self._want)
        used = 0
        overflow = 0

        def allocate(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
            nonlocal used, overflow
            itemsize = torch.empty((), dtype=dtype).element_size()
            nbytes = itemsize
            for n in shape:
                nbytes *= n
            start = -(-used // _ALIGN) * _ALIGN
            if start + nbytes > arena.tensor.numel():
                overflow += nbytes + _ALIGN
                return None  # a plain tensor instead; the next batch gets a bigger arena
            used = start + nbytes
            return arena.tensor[start : start + nbytes].view(dtype).view(shape)

        def ship(batch: Any) -> Shipment:
            ptr = arena.tensor.untyped_storage().data_ptr()
            live = [a.ident for a in self.arenas if a is not None]
            shipment = Shipment(
                self.worker, self.seq, slot, _to_refs(batch, arena.ident, ptr), live=live
            )
            self.holds[slot] = self.seq
            if not arena.sent:
                shipment.new_arenas[arena.ident] = arena.tensor
                arena.sent = True
            self.seq += 1
            return shipment

        try:
            with allocating(allocate):
                yield ship
        finally:
            self._want = max(self._want, int((used + overflow) * 1.25))


def _to_refs(value: Any, arena: int, ptr: int) -> Any:
    if isinstance(value, torch.Tensor):
        if value.untyped_storage().data_ptr() != ptr:
            return value  # did not fit: PyTorch's own (slower) path
        return ArenaRef(
            arena,
            value.storage_offset() * value.element_size(),
            tuple(value.shape),
            tuple(value.stride()),
            value.dtype,
        )
    if isinstance(value, RaggedBytes):
        return RaggedBytes(_to_refs(value.data, arena, ptr), _to_refs(value.offsets, arena, ptr))
    if isinstance(value, dict):
        return {k: _to_refs(v, arena, ptr) for k, v in value.items()}
    if (
        isinstance(value, (list, tuple))
        and value
        and any(isinstance(v, torch.Tensor) for v in value)
    ):
        return type(value)(_to_refs(v, arena, ptr) for v in value)
    return value


class Receiver:
    """The main process's side: arenas by worker; batches as views of them; frees arenas."""

    def __init__(self, released: torch.Tensor):
        self.released = released
        self._released = released.numpy()
        self.arenas: dict[tuple[int, int], np.ndarray] = {}

    def reset(self, released: torch.Tensor) -> None:
        """New worker processes: forget their predecessors' arenas, and use a new table (a batch
        of theirs the user still holds must not free a slot of the new workers when it goes)."""
        self.arenas.clear()
        self.released = released
        self._released = released.numpy()

    def receive(self, item: Any) -> Any:
        if not isinstance(item, Shipment):
            return item
        live = set(item.live)
        for key in [k for k in self.arenas if k[0] == item.worker and k[1] not in live]:
            del self.arenas[key]  # views handed out keep their memory alive
        for ident, tensor in item.new_arenas.items():
            self.arenas[(item.worker, ident)] = tensor.numpy()
        owner = _Owner()
        batch = self._views(item.batch, item.worker, owner)
        if owner.views:
            weakref.finalize(owner, _let_go, self._released, item.worker, item.slot, item.seq)
        else:
            _let_go(self._released, item.worker, item.slot, item.seq)
        return batch

    def _views(self, value: Any, worker: int, owner: _Owner) -> Any:
        if isinstance(value, ArenaRef):
            itemsize = _itemsize(value.dtype)
            span = (
                0
                if 0 in value.shape
                else 1 + sum((n - 1) * s for n, s in zip(value.shape, value.stride))
            )
            raw = self.arenas[(worker, value.arena)][value.offset : value.offset + span * itemsize]
            base = owner.adopt(raw)
            as_numpy = _NUMPY.get(value.dtype)
            # the usual case: no torch views
            if as_numpy is not None and value.stride == _contiguous(value.shape):
                return torch.from_numpy(base.view(as_numpy).reshape(value.shape))
            return torch.from_numpy(base).view(value.dtype).as_strided(value.shape, value.stride)
        if isinstance(value, RaggedBytes):
            data, offsets = (
                self._views(value.data, worker, owner),
                self._views(value.offsets, worker, owner),
            )
            return RaggedBytes(data, offsets)
        if isinstance(value, dict):
            return {k: self._views(v, worker, owner) for k, v in value.items()}
        if (
            isinstance(value, (list, tuple))
            and value
            and any(isinstance(v, ArenaRef) for v in value)
        ):
            return type(value)(self._views(v, worker, owner) for v in value)
        return value


class _Owner:
    """Lives exactly as long as some tensor of one batch does (each tensor's numpy base holds it)."""

    def __init__(self) -> None:
        self.views = 0  # only counted: holding the views here would keep them alive forever

    def adopt(self, raw: np.ndarray) -> np.ndarray:
        base = _OwnedArray(raw)
        base.owner = self
        self.views += 1
        return base


class _OwnedArray(np.ndarray):
    """A view of arena memory that keeps its batch's :class:`_Owner` alive."""

    owner: _Owner | None = None

    def __new__(cls, raw: np.ndarray) -> _OwnedArray:
        return raw.view(cls)

    def __array_finalize__(self, obj: Any) -> None:
        self.owner = getattr(obj, "owner", None)


def _let_go(released: np.ndarray, worker: int, slot: int, seq: int) -> None:
    if released[worker, slot] < seq:
        released[worker, slot] = seq


# The dtypes numpy has, for views made without torch's own (slower) view and as_strided calls.
_NUMPY = {
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.bool: np.bool_,
}
_ITEMSIZE: dict[torch.dtype, int] = {}


def _itemsize(dtype: torch.dtype) -> int:
    found = _ITEMSIZE.get(dtype)
    if found is None:
        found = _ITEMSIZE[dtype] = torch.empty((), dtype=dtype).element_size()
    return found


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))
