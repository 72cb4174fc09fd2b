"""``DeviceLoader``: batches onto the GPU while the previous ones compute.

A blocking ``batch.to("cuda")`` from pageable memory stalls the training loop for the
whole copy. ``DeviceLoader`` wraps any iterable of batches (a :class:`ShardLoader`, a
torch ``DataLoader``, a generator): it pins each batch's tensors unless they are pinned
already, copies them on a CUDA stream of its own ``prefetch`` batches ahead, makes the
training loop's stream wait for exactly that batch's copy, and tells the caching
allocator (``record_stream``) that the training loop's stream uses the copies, so their
memory is not handed out again while kernels still read it. Host tensors stay
referenced until their copy has finished.

Optional conversions run on the device after the copy: uint8 images cross PCIe at a
quarter of the bytes of float32 and become float (``dtype``; uint8 scaled to [0, 1]),
normalized (``normalize=(mean, std)``) and channels-last there.

Without CUDA (or for a CPU device) the same API moves batches with ``.to(device)`` and
applies the same conversions on the CPU, so training scripts run unchanged anywhere.
"""

from __future__ import annotations

import collections
import logging
import warnings
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from time import perf_counter_ns
from typing import Any

import torch

from .errors import UsageError
from .loader.stats import Callback, DeviceStats, LoaderStats, StepClock, report

log = logging.getLogger("shardstream")

Fields = Collection[str | int] | Callable[[torch.Tensor], bool] | None


def _is_image_batch(t: torch.Tensor) -> bool:
    return t.dtype == torch.uint8 and t.dim() == 4


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to every tensor in nested dicts, lists, tuples and
    namedtuples; everything else (strings, numbers, ``RaggedBytes``, ``MappedBytes``) as is."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):  # dicts, and mappings such as a tokenizer's BatchEncoding
        return _like(batch, {k: map_tensors(fn, v) for k, v in batch.items()})
    if isinstance(batch, (list, tuple)):
        if not any(isinstance(v, (torch.Tensor, dict, list, tuple)) for v in batch):
            return batch  # a list of strings or numbers: nothing to do, and no copy of it
        return _like(batch, [map_tensors(fn, v) for v in batch])
    return batch


def _like(original: Any, items: Any) -> Any:
    """``items`` (a dict or a list) as a container of ``original``'s type where it can be built."""
    kind = type(original)
    if kind is dict or kind is list:
        return items
    if isinstance(original, tuple):
        return kind(*items) if hasattr(original, "_fields") else kind(items)  # namedtuple or tuple
    try:
        return kind(items)
    except TypeError:  # a container type that cannot be built from its items (defaultdict)
        return items


def _tensors(batch: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    map_tensors(keep, batch)
    return found


class _Converter:
    """dtype, scaling, normalization and memory format for the selected tensors of a batch."""

    def __init__(
        self,
        dtype: torch.dtype | None,
        scale: bool,
        normalize: Any,
        channels_last: bool,
        fields: Fields,
    ):
        if normalize is not None and dtype is None:
            dtype = torch.float32
        if normalize is not None and not dtype.is_floating_point:
            raise UsageError(f"normalize needs a floating dtype, not {dtype}")
        self.dtype, self.scale, self.channels_last = dtype, scale, channels_last
        self.mean = self.std = None
        if normalize is not None:
            mean, std = normalize
            # channel dim of ...xCxHxW
            self.mean = torch.as_tensor(mean, dtype=dtype).reshape(-1, 1, 1)
            self.std = torch.as_tensor(std, dtype=dtype).reshape(-1, 1, 1)
            if (self.std == 0).any():
                raise UsageError("normalize: std must not be 0")
        self.keys = None if fields is None or callable(fields) else set(fields)
        self.predicate: Callable[[torch.Tensor], bool] = (
            fields if callable(fields) else _is_image_batch
        )
        self.active = dtype is not None or channels_last
        self._consts: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: Any) -> Any:
        """The batch with its selected tensors converted (top-level entries named in ``fields``,
        else every tensor the predicate accepts: by default uint8 N x C x H x W image batches)."""
        if not self.active:
            return batch
        if self.keys is None:
            return map_tensors(lambda t: self.convert(t) if self.predicate(t) else t, batch)
        if isinstance(batch, dict):
            return _like(
                batch,
                {
                    k: map_tensors(self.convert, v) if k in self.keys else v
                    for k, v in batch.items()
                },
            )
        if isinstance(batch, (list, tuple)):
            return _like(
                batch,
                [
                    map_tensors(self.convert, v) if i in self.keys else v
                    for i, v in enumerate(batch)
                ],
            )
        return batch

    def convert(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` converted; never changes ``t`` itself (in-place steps only on new tensors)."""
        own = False
        if self.dtype is not None and t.dtype != self.dtype:
            source = t.dtype
            t, own = t.to(self.dtype), True
            if self.scale and source == torch.uint8 and self.dtype.is_floating_point:
                t.div_(255)
        if self.mean is not None:
            mean, std = self._on(t.device)
            t = t.sub_(mean) if own else t.sub(mean)
            t.div_(std)
        if self.channels_last and t.dim() == 4:
            t = t.contiguous(memory_format=torch.channels_last)
        return t

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        found = self._consts.get(device)
        if found is None:
            found = self._consts[device] = (self.mean.to(device), self.std.to(device))
        return found


class DeviceLoader:
    """Iterate ``loader``'s batches on ``device``: pinned, copied ahead on a side CUDA stream.

    Args:
        loader: any iterable of batches: tensors, or dicts/lists/tuples/namedtuples of
            them, nested. Other values (strings, numbers, ``RaggedBytes``) stay as they are.
        device: the target (``"cuda"``, ``"cuda:1"``, an index, ``"cpu"``). ``"cuda"``
            without CUDA falls back to the CPU: batches pass through (``self.device`` says
            where they are), with the same conversions.
        prefetch: batches copied ahead of the one the training loop holds (CUDA only).
        non_blocking: asynchronous copies from pinned memory (CUDA only).
        pin: pin tensors that are not pinned yet (a host copy), so copies can overlap.
        dtype: convert the selected tensors to this dtype after the copy; uint8 is scaled
            to [0, 1] when the dtype is floating and ``scale`` is true.
        scale: divide uint8 by 255 when converting it to a floating dtype.
        normalize: ``(mean, std)``, per channel (dim -3) or scalars: ``(x - mean) / std``
            after the dtype conversion (implies ``dtype=torch.float32`` when none is given).
        channels_last: make the selected 4-d tensors channels-last.
        fields: what to convert: top-level dict keys or tuple positions, or a predicate on
            the tensor; default: uint8 tensors of 4 dims (image batches).
    """

    def __init__(  # noqa: PLR0913 - keyword settings with defaults
        self,
        loader: Iterable[Any],
        device: str | int | torch.device = "cuda",
        prefetch: int = 2,
        non_blocking: bool = True,
        *,
        pin: bool = True,
        dtype: torch.dtype | None = None,
        scale: bool = True,
        normalize: tuple[Sequence[float] | float, Sequence[float] | float] | None = None,
        channels_last: bool = False,
        fields: Fields = None,
    ):
        if prefetch < 1:
            raise UsageError(f"prefetch must be at least 1, not {prefetch}")
        self.loader = loader
        self.prefetch, self.non_blocking, self.pin = prefetch, non_blocking, pin
        self.device = _resolve(device)
        self.cuda = self.device.type == "cuda"
        self._convert = _Converter(dtype, scale, normalize, channels_last, fields)
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._in_flight = 0  # batches taken from ``loader`` that the training loop has not received
        self._warned_state = False
        self._steps = StepClock()

    def __len__(self) -> int:
        # TypeError when the wrapped iterable has no length, as for any iterable
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        steps = self._steps
        steps.begin()
        batches = self._iter_cuda() if self.cuda else self._iter_plain()
        try:
            for batch in batches:
                steps.handed()
                yield batch
                steps.asked()
        finally:
            batches.close()  # its own clean-up (copies in flight) before anyone asks for the state

    def stats(self) -> DeviceStats:
        """The wrapped :class:`ShardLoader`'s stats, the host-to-device copies, and how much of the training
        loop's step time went to waiting for a batch (``data_wait_fraction``, with a one-line ``verdict``)."""
        inner = self.loader.stats() if callable(getattr(self.loader, "stats", None)) else None
        s = self._steps
        return DeviceStats(
            loader=inner if isinstance(inner, LoaderStats) else None,
            steps=s.steps,
            wait_s=s.wait_ns / 1e9,
            compute_s=s.compute_ns / 1e9,
            copy_s=s.copy_ns / 1e9,
            h2d_bytes=s.h2d_bytes,
            history=[(w / 1e9, c / 1e9) for w, c in s.history],
        )

    def report_stats(self, every: int = 100, callback: Callback | None = None) -> None:
        """Every ``every`` batches, pass ``stats().scalars()`` to ``callback`` (``wandb.log``, Lightning's
        ``log_dict``), or without one log a line at INFO with the verdict; ``every=0`` stops."""
        if every < 0:
            raise UsageError(f"every must be 0 (off) or more, not {every}")
        self._steps.every, self._steps.report = every, (lambda: report(self.stats(), callback))

    # -- without CUDA streams ----------------------------------------------------------
    def _iter_plain(self) -> Iterator[Any]:
        device, non_blocking = self.device, self.non_blocking and self.device.type != "cpu"
        self._in_flight = 0
        steps = self._steps

        def move(t: torch.Tensor) -> torch.Tensor:
            if t.device != device:
                steps.h2d_bytes += t.nbytes
            return t.to(device, non_blocking=non_blocking)

        for batch in self.loader:
            started = perf_counter_ns()
            moved = self._convert(map_tensors(move, batch))
            steps.copy_ns += perf_counter_ns() - started
            yield moved

    # -- CUDA --------------------------------------------------------------------------
    def _iter_cuda(self) -> Iterator[Any]:
        queue: collections.deque[_InFlight] = collections.deque()
        # handed out; host memory kept until copied
        done: collections.deque[_InFlight] = collections.deque()
        source = iter(self.loader)
        failure: BaseException | None = None
        self._in_flight = 0

        def fill() -> None:
            nonlocal failure
            while failure is None and len(queue) < self.prefetch:
                try:
                    batch = next(source)
                except StopIteration:
                    failure = StopIteration()
                    return
                except Exception as exc:  # raised after the batches before it are handed out
                    failure = exc
                    return
                queue.append(self._send(batch))
                self._in_flight = len(queue)

        try:
            fill()
            while queue:
                item = queue.popleft()
                fill()  # the next copies are queued before this batch is handed out
                self._in_flight = len(queue)
                done.append(item)
                while done and done[0].event.query():
                    self._copied(done.popleft())
                yield self._hand_over(item)  # not kept here: the training loop decides when it goes
            if failure is not None and not isinstance(failure, StopIteration):
                raise failure
        finally:
            for item in (*done, *queue):
                item.event.synchronize()  # no host memory is let go while a copy may still read it
                self._copied(item)
            # after a break: copied ahead, never handed out, so not consumed
            self._in_flight = len(queue)

    def _hand_over(self, item: _InFlight) -> Any:
        """The batch for the training loop's current stream, which waits for its copy; its tensors
        are marked as used by that stream, so their memory is not reused before its work is done."""
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(item.event)
        for t in item.outputs:
            t.record_stream(stream)
        batch, item.batch, item.outputs = item.batch, None, []
        return batch

    def _copied(self, item: _InFlight) -> None:
        """Count a finished copy's time (CUDA events on the side stream)."""
        self._steps.copy_ns += int(item.start.elapsed_time(item.event) * 1e6)

    def _send(self, batch: Any) -> _InFlight:
        """Pin, copy and convert ``batch`` on the side stream; returns it with its event."""
        stream = self._stream
        hosts: list[torch.Tensor] = []
        device, non_blocking = self.device, self.non_blocking
        if any(t.is_cuda for t in _tensors(batch)):
            # made by the training loop's stream
            stream.wait_stream(torch.cuda.current_stream(device))

        def copy(t: torch.Tensor) -> torch.Tensor:
            if t.device == device:
                t.record_stream(stream)  # read on the side stream, made on another
            else:
                self._steps.h2d_bytes += t.nbytes
            if t.device != device and non_blocking and t.device.type == "cpu":
                if self.pin and not t.is_pinned():
                    t = t.pin_memory()
                hosts.append(t)
            return t.to(device, non_blocking=non_blocking)

        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            moved = self._convert(map_tensors(copy, batch))
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
        outputs = [t for t in _tensors(moved) if t.is_cuda]
        return _InFlight(moved, outputs, hosts, event, start)

    # -- resume ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state, counting the batches copied ahead as not consumed."""
        from .loader import ShardLoader

        if isinstance(self.loader, ShardLoader):
            return self.loader.state_dict(pending=self._in_flight)
        if self._in_flight and not self._warned_state:
            self._warned_state = True
            warnings.warn(
                f"{type(self.loader).__name__}.state_dict() counts the {self._in_flight} batches "
                f"DeviceLoader copied ahead as consumed; a resume from it skips them",
                RuntimeWarning,
                stacklevel=2,
            )
        return self.loader.state_dict()  # AttributeError when it has none

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Pass ``state`` to the wrapped loader (applies from the next iteration)."""
        self.loader.load_state_dict(state)
        self._in_flight = 0


class _InFlight:
    __slots__ = ("batch", "outputs", "hosts", "event", "start")

    def __init__(
        self,
        batch: Any,
        outputs: list[torch.Tensor],
        hosts: list[torch.Tensor],
        event: Any,
        start: Any,
    ):
        self.batch, self.outputs, self.hosts, self.event, self.start = (
            batch,
            outputs,
            hosts,
            event,
            start,
        )


_warned_cpu_fallback = False


def _warn_cpu_fallback(device: torch.device) -> None:
    """Say once per process that a CUDA device was asked for and the CPU is used instead."""
    global _warned_cpu_fallback
    if _warned_cpu_fallback:
        return
    _warned_cpu_fallback = True
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    warnings.warn(
        f"DeviceLoader: device {str(device)!r} asked for, but CUDA is not available (torch "
        f"{torch.__version__}, {built}): batches stay on the CPU, so training runs there; "
        "fix the CUDA install (nvidia-smi, a CUDA build of torch), or pass device='cpu' to mean it",
        RuntimeWarning,
        stacklevel=4,
    )


def _resolve(device: str | int | torch.device) -> torch.device:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            _warn_cpu_fallback(device)
            return torch.device("cpu")
        if device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
    return device
