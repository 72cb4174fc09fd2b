"""Checks that turn the classic DataLoader traps into one clear error that says the fix.

- **Small /dev/shm.** Batches travel from workers to the main process in shared memory,
  which lives in ``/dev/shm``: 64 MB in a default Docker container. When the batches in
  flight do not fit, a worker dies with "Bus error" or the loader hangs for ever.
  :func:`check_shm` compares an estimate of what the loader keeps in flight with the free
  space and raises (the default) or warns. Switching torch to the ``file_system``
  sharing strategy does not help: it keeps tensors in ``/dev/shm`` too.
- **Unpicklable parts.** Workers started with ``spawn`` or ``forkserver`` (the default on
  macOS and Windows, and on Linux from Python 3.14) receive the dataset, transform and
  collate function pickled; a lambda, a nested function or an open file fails inside
  the worker with an obscure traceback. :func:`check_picklable` tries first and names
  the object.
- **Tensors that are not on the CPU from a worker.** :func:`check_worker_batch` refuses
  them: move batches to the GPU in the main process (``DeviceLoader``).
- **Images of different sizes.** The default collate stacks a field only when all its tensors have one
  shape; images of different sizes become a list of tensors, which a model expecting ``N×C×H×W`` fails
  on far from the cause. :func:`ragged_images` says which field, and the fix, for a warning.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import sys
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..errors import ShardstreamError, UsageError
from ..host import SHM_PATH, local_ranks, shm_free_bytes
from ..sizes import format_size


class SharedMemoryError(ShardstreamError):
    """/dev/shm is too small for the batches a loader keeps in flight."""


class WorkerPickleError(ShardstreamError):
    """Something the workers need cannot be pickled for their start method."""


class WorkerDeviceError(ShardstreamError):
    """A worker returned tensors that are not in CPU memory."""


class WorkerBatchError(ShardstreamError):
    """A worker returned a batch that cannot be sent to the main process."""


# -- shared memory --------------------------------------------------------------------------------


def batch_nbytes(batch: Any) -> int:
    """Bytes of the tensors in a (nested) batch: what a batch takes in shared memory.

    Strings, numbers and other Python objects travel through a pipe, not shared memory,
    and ``MappedBytes`` are only locations, so none of them count.
    """
    return sum(t.numel() * t.element_size() for _, t in _tensors(batch))


def check_shm(
    batch_bytes: int,
    num_workers: int,
    batches_per_worker: float,
    *,
    extra_batches: int = 0,
    basis: str = "measured on the first batch",
    action: str = "raise",
    free: int | None = None,
    path: str = SHM_PATH,
) -> int:
    """Refuse (``action="raise"``) or warn (``"warn"``) when the batches in flight exceed free shared memory.

    The estimate is ``local ranks x (num_workers x batches_per_worker + extra_batches) x
    batch_bytes``; ``free`` is measured now unless given. Returns the estimate in bytes.
    """
    if action not in ("raise", "warn", "off"):
        raise UsageError(f"shm_check must be 'raise', 'warn' or 'off', not {action!r}")
    ranks = local_ranks()
    needed = int(ranks * (num_workers * batches_per_worker + extra_batches) * batch_bytes)
    free = shm_free_bytes(path) if free is None else free
    if action == "off" or free is None or num_workers == 0 or needed <= free:
        return needed
    per = f"{num_workers} workers x {batches_per_worker:g} batches in flight each"
    if extra_batches:
        per += f" + {extra_batches} in the main process"
    if ranks > 1:
        per = f"{ranks} local ranks x ({per})"
    suggest = max(1, -(-int(needed * 1.5) // 10**9))
    message = (
        f"{path} has {format_size(free)} free, but this loader keeps about {format_size(needed)} of batches in shared "
        f"memory there: {per} x {format_size(batch_bytes)} per batch ({basis}); workers would die with 'Bus error' "
        f"or the loader would hang. Give the container more shared memory (docker run --shm-size={suggest}g, "
        f"or --ipc=host; on Kubernetes mount an emptyDir with medium: Memory at /dev/shm), or lower num_workers, "
        f"prefetch_factor or batch_size. torch's 'file_system' sharing strategy would not help: it keeps "
        f"tensors in {path} too. Pass shm_check='warn' or 'off' to go on regardless."
    )
    if action == "raise":
        raise SharedMemoryError(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return needed


# -- pickling for spawn / forkserver workers --------------------------------------------------------


def start_method(context: Any = None) -> str:
    """The start method DataLoader workers will use: ``multiprocessing_context`` or the default.

    Never fixes the process-wide default as a side effect (``get_start_method()`` would).
    """
    if context is None:
        return (
            multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_all_start_methods()[0]
        )
    if isinstance(context, str):
        return context
    return context.get_start_method()


def describe(obj: Any) -> str:
    """A function by name and where it is defined; anything else by its type (and file name for files)."""
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        fn = obj.__func__ if isinstance(obj, types.MethodType) else obj
        code = fn.__code__
        where = code.co_filename
        if where.startswith(os.getcwd() + os.sep):
            where = os.path.relpath(where)
        return f"{fn.__qualname__} defined at {where}:{code.co_firstlineno}"
    if isinstance(obj, io.IOBase):
        return f"an open file {getattr(obj, 'name', '?')!r}"
    return f"{type(obj).__qualname__} object"


def _picklable(obj: Any) -> Exception | None:
    try:
        pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except RuntimeError as exc:
        if "through inheritance" in str(exc):
            return (
                None  # multiprocessing's locks, queues and values: a spawned worker receives them
            )
        return exc
    except Exception as exc:  # pickle raises PicklingError, TypeError, AttributeError...
        return exc
    return None


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            yield f"[{k!r}]", v
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for i, v in enumerate(obj):
            yield f"[{i}]", v
    # functools.partial
    elif hasattr(obj, "func") and hasattr(obj, "args") and hasattr(obj, "keywords"):
        yield ".func", obj.func
        yield from ((f".args[{i}]", v) for i, v in enumerate(obj.args))
        yield from ((f".keywords[{k!r}]", v) for k, v in obj.keywords.items())
    elif not isinstance(obj, (types.FunctionType, type, types.ModuleType)) and hasattr(
        obj, "__dict__"
    ):
        yield from ((f".{k}", v) for k, v in vars(obj).items())


def _culprit(obj: Any, path: str = "", depth: int = 0) -> tuple[str, Any]:
    """The innermost part of ``obj`` that does not pickle, with its path (``.transforms[1].log``)."""
    if depth < 4:
        for name, child in _children(obj):
            if _picklable(child) is not None:
                return _culprit(child, path + name, depth + 1)
    return path, obj


def _interactive_main(obj: Any) -> bool:
    """Defined in ``__main__`` of an interactive session (a notebook): spawn workers cannot import it."""
    module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
    return module == "__main__" and not hasattr(sys.modules.get("__main__"), "__file__")


def _advice(part: Any, exc: Exception) -> str:
    if isinstance(part, types.FunctionType) and part.__name__ == "<lambda>":
        return "a lambda cannot be pickled; define the function with def at module level"
    if isinstance(part, types.FunctionType) and "<locals>" in part.__qualname__:
        return "a function defined inside another one cannot be pickled; define it at module level"
    if isinstance(part, io.IOBase) or type(part).__name__ in (
        "BufferedReader",
        "TextIOWrapper",
        "FileIO",
    ):
        return (
            "open files cannot be pickled, and each worker needs its own; store the path and open the file "
            "in the worker (on first use)"
        )
    return (
        f"{type(exc).__name__}: {exc}. Keep only picklable state there; create files, locks, connections "
        f"and clients in the worker (on first use)"
    )


def check_picklable(parts: Mapping[str, Any], method: str) -> None:
    """Raise :class:`WorkerPickleError` naming the first of ``parts`` (label -> object) that
    ``method`` workers could not receive; labels read like "the transform"."""
    for label, obj in parts.items():
        if obj is None:
            continue
        exc = _picklable(obj)
        if exc is None:
            if callable(obj) and _interactive_main(obj):
                raise WorkerPickleError(
                    f"{label} {describe(obj)} is defined in an interactive session (__main__), which {method!r} "
                    f"workers cannot import: put it in a .py module and import it, or use num_workers=0"
                )
            continue
        path, part = _culprit(obj)
        inside = f" (its part {path.lstrip('.')}: {describe(part)})" if path else ""
        raise WorkerPickleError(
            f"{label} {describe(obj)}{inside} cannot be pickled, which {method!r} DataLoader workers need: "
            f"{_advice(part, exc)}"
        ) from exc


def check_dataset_picklable(dataset: Any, method: str) -> None:
    """Like :func:`check_picklable` for the dataset itself, naming the attribute that fails (as the
    dataset pickles itself: through its ``__getstate__``, which every ``PlannedDataset`` has)."""
    exc = _picklable(dataset)
    if exc is None:
        return
    state = dataset.__getstate__()
    if isinstance(state, Mapping):
        check_picklable(
            {f"the dataset's attribute {name!r},": value for name, value in state.items()}, method
        )
    raise WorkerPickleError(
        f"the dataset ({type(dataset).__qualname__}) cannot be pickled, which {method!r} "
        f"DataLoader workers need: {type(exc).__name__}: {exc}"
    ) from exc


def open_files(obj: Any, depth: int = 0, path: str = "") -> Iterator[tuple[str, io.IOBase]]:
    """Open file objects held by ``obj`` (a few levels deep), with their paths."""
    if isinstance(obj, io.IOBase):
        if not obj.closed:
            yield path, obj
        return
    if depth < 3 and not isinstance(obj, (str, bytes, torch.Tensor)):
        for name, child in _children(obj):
            yield from open_files(child, depth + 1, path + name)


def warn_open_files(parts: Mapping[str, Any]) -> None:
    """Forked workers inherit open files and share one file position: warn about any the user's parts hold."""
    for label, obj in parts.items():
        for path, f in open_files(obj):
            where = f" (at {path.lstrip('.')})" if path else ""
            warnings.warn(
                f"{label} {describe(obj)} holds {describe(f)}{where}; forked DataLoader workers share its file "
                f"position, so their reads interleave: open the file in the worker (on first use) instead",
                RuntimeWarning,
                stacklevel=3,
            )


# -- what workers return -------------------------------------------------------------------------


def _tensors(value: Any, path: str = "batch", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
        return
    if depth > 6:
        return
    data = getattr(value, "data", None)
    offsets = getattr(value, "offsets", None)
    if isinstance(data, torch.Tensor) and isinstance(offsets, torch.Tensor):  # RaggedBytes
        yield f"{path}.data", data
        yield f"{path}.offsets", offsets
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _tensors(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(value, (list, tuple)):
        if value and isinstance(value[0], (str, bytes, int, float)):
            return  # a batch's list of keys, strings or numbers (one field's values, all of a kind)
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]", depth + 1)
    elif hasattr(value, "batch") and hasattr(value, "new_arenas"):  # a transport Shipment
        yield from _tensors(value.batch, path, depth + 1)


def foreign_tensors(batch: Any) -> list[tuple[str, torch.device]]:
    """Where a batch holds tensors outside CPU memory (CUDA, or any other device)."""
    return [(path, t.device) for path, t in _tensors(batch) if t.device.type != "cpu"]


_PLAIN = (torch.Tensor, np.ndarray, np.generic, str, bytes, bytearray, int, float, bool, type(None))
_PICKLES: set[type] = set()  # value types this process has pickled (checked once each)


def _unpicklable(value: Any, path: str = "batch", depth: int = 0) -> Iterator[tuple[str, str]]:
    """(where, why) of values in ``value`` that cannot be pickled: torch's worker would fail to send the
    batch in a thread of its own, and the main process wait for it forever."""
    if isinstance(value, _PLAIN) or depth > 6:
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _unpicklable(v, f"{path}[{k!r}]", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:64]):  # one field's values are of one kind
            yield from _unpicklable(v, f"{path}[{i}]", depth + 1)
    elif type(value) not in _PICKLES:
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # any failure is what the worker would meet
            yield path, f"{type(value).__name__}: {exc}"
        else:
            _PICKLES.add(type(value))


def check_worker_batch(batch: Any) -> None:
    """Refuse a batch from a DataLoader worker that holds non-CPU tensors or values that cannot be
    pickled (which torch's worker could not send: the loader would wait for ever), naming them and the
    fix."""
    bad = next(_unpicklable(batch), None)
    if bad is not None:
        raise WorkerBatchError(
            f"a DataLoader worker returned a batch with a value that cannot be sent to the main process "
            f"({bad[0]}: {bad[1][:200]}); return tensors, numpy arrays, bytes, numbers or strings from the "
            f"transform and collate_fn (bytes(view) for a memoryview)"
        )
    found = foreign_tensors(batch)
    if found:
        where = ", ".join(f"{path} on {device}" for path, device in found[:4])
        more = f" and {len(found) - 4} more" if len(found) > 4 else ""
        raise WorkerDeviceError(
            f"a DataLoader worker returned tensors that are not in CPU memory ({where}{more}). Workers must "
            f"return CPU tensors: CUDA in worker processes is fragile (forked workers cannot use it, and CUDA "
            f"memory shared from a worker must outlive its use in the main process). Keep the dataset, "
            f"transform and collate_fn on the CPU and move batches to the GPU in the main process, e.g. with "
            f"shardstream.DeviceLoader(loader, 'cuda')"
        )


def check_first_batch(
    batch: Any, num_workers: int, batches_per_worker: float, extra_batches: int, free: int | None
) -> None:
    """In a worker, before its first batch of a pass is sent: :func:`check_shm` on that batch's size
    (by then another worker's batch may already have failed to reach shared memory, so the main
    process alone would see it too late)."""
    check_shm(
        batch_nbytes(batch),
        num_workers,
        batches_per_worker,
        extra_batches=extra_batches,
        free=free,
        basis="measured on the first batch",
    )


def ragged_images(batch: Any) -> str | None:
    """A warning for a batch of the default collate whose field holds images of different sizes (a
    list of C×H×W tensors instead of one N×C×H×W tensor), naming the field and the fix; None if none does."""
    if not isinstance(batch, Mapping):
        return None
    for name, value in batch.items():
        if (
            type(value) is list
            and len(value) > 1
            and all(isinstance(v, torch.Tensor) and v.dim() == 3 for v in value)
        ):
            shapes = list(dict.fromkeys(tuple(v.shape) for v in value))
            if len(shapes) > 1:
                return (
                    f"batch[{name!r}] is a list of {len(value)} tensors, not one N×C×H×W tensor: its "
                    f"images have different sizes (C×H×W {shapes[0]}, {shapes[1]}"
                    f"{', ...' if len(shapes) > 2 else ''}), which cannot be stacked; resize or crop "
                    "them to one size in transform= (e.g. torchvision's RandomResizedCrop), or batch "
                    f"images of one shape together with ss.Bucketed(ds, key=ss.aspect_ratio({name!r}), "
                    "...) (this warning comes once per loader)"
                )
    return None
