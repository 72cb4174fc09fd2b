"""Reader threads: a loader's workers as threads of the main process instead of worker processes.

Each thread reads as one worker slot of the plan (``WorkerSlot(i, n, in_thread=True)``), exactly the
chunks a worker process ``i`` of ``n`` would, into a small queue of its own; the main thread takes the
chunks round-robin, so the output is the rank's planned order, the same as with processes, and the
resume state is the same. What threads spare: no fork or spawn, no pickling of the dataset, no batches
through ``/dev/shm`` (a container's 64 MB ``/dev/shm`` cannot stop them), no second copy of the
process's memory. What they cost: one GIL. Reading memory-mapped shards, hashing, decompressing and
decoding JPEGs (Pillow, simplejpeg) release it, so a raw or decoding pipeline runs in parallel;
Python-heavy user transforms do not.

Hand-written because torch's DataLoader has no thread workers. A thread's error reaches the main
thread as itself (type, message and traceback). Leaving the loop early stops the threads at their
next chunk.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..dataset.contract import WorkerSlot, reading_as
from ..dataset.setup import READING
from ..errors import UsageError

log = logging.getLogger("shardstream")

_END, _ITEM, _ERROR = 0, 1, 2
_POLL = 0.1  # seconds a blocked thread waits before it looks whether the pass was called off


def _put(box: queue.Queue, item: tuple[int, Any], stop: threading.Event) -> bool:
    """Put ``item`` into ``box`` unless the pass is called off first; whether it was put."""
    while not stop.is_set():
        try:
            box.put(item, timeout=_POLL)
            return True
        except queue.Full:
            continue
    return False


def _read(
    dataset: Iterable[Any],
    slot: WorkerSlot,
    token: int,
    box: queue.Queue,
    stop: threading.Event,
) -> None:
    """One reader thread: the dataset's chunks for ``slot`` into ``box``, then the end (or the error)."""
    reading = READING.set(token)  # the configuring loader reads: the dataset checks it
    try:
        with reading_as(slot):
            for item in dataset:
                if not _put(box, (_ITEM, item), stop):
                    return
        _put(box, (_END, None), stop)
    except BaseException as exc:  # handed to the main thread, which raises it
        _put(box, (_ERROR, exc), stop)
    finally:
        READING.reset(reading)


WORKER_MODES = ("auto", "processes", "threads")


# DataLoader arguments that only worker processes take: given one, "auto" means processes
PROCESS_ARGUMENTS = ("multiprocessing_context", "worker_init_fn", "persistent_workers", "timeout")


def thread_count(
    dataset: Any, num_workers: int, workers: str, kwargs: dict[str, Any] | None = None
) -> int:
    """Reader threads for a loader of ``num_workers`` workers (0: worker processes, or none). ``workers``:
    ``"threads"``, ``"processes"``, or ``"auto"``: threads where they were measured to win
    (the dataset's ``threads_win``) and no argument of the loader's is one that only worker processes take."""
    if workers not in WORKER_MODES:
        raise UsageError(
            f"workers must be one of {', '.join(map(repr, WORKER_MODES))}, not {workers!r}"
        )
    if num_workers <= 0 or workers == "processes":
        return 0
    if workers == "auto" and (
        not dataset.threads_win(num_workers)
        or any(k in (kwargs or {}) for k in PROCESS_ARGUMENTS)
        or dataset.replaces_failures
    ):
        return 0
    if dataset.replaces_failures:
        raise UsageError(
            "workers='threads' cannot read a dataset with on_error='skip': the sample that stands in "
            "for a failing one is each worker's last good one, kept per process; use "
            "workers='processes' (or 'auto')"
        )
    if any(part is not None for part in dataset.worker_parts().values()) and dataset.seed_workers:
        log.warning(
            "reader threads share the random generators of the process: a transform's random "
            "draws are not reseeded per batch there (they are in worker processes); use "
            "workers='processes' for reproducible augmentations"
        )
    return num_workers


def threaded_pass(
    dataset: Iterable[Any],
    threads: int,
    token: int,
    depth: int = 2,
    on_start: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """One pass of ``dataset`` read by ``threads`` threads, each ``depth`` chunks ahead, in the planned
    order (worker ``i``'s chunks are ``i``, ``i + threads``, ...: round-robin, as torch takes them from
    worker processes). ``token``: the loader's (see :data:`~shardstream.dataset.setup.READING`)."""
    stop = threading.Event()
    boxes: list[queue.Queue] = [queue.Queue(maxsize=depth) for _ in range(threads)]
    workers = [
        threading.Thread(
            target=_read,
            args=(dataset, WorkerSlot(i, threads, in_thread=True), token, boxes[i], stop),
            name=f"shardstream-reader-{i}",
            daemon=True,
        )
        for i in range(threads)
    ]
    if on_start is not None:
        on_start()
    for worker in workers:
        worker.start()
    try:
        active = list(range(threads))
        turn = 0
        while active:
            i = active[turn % len(active)]
            kind, item = boxes[i].get()
            if kind == _ITEM:
                turn += 1
                yield item
            elif kind == _ERROR:
                raise item
            else:  # this worker has no more chunks; the others may have one more each
                active.remove(i)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=_POLL * 10)


__all__ = ["WORKER_MODES", "thread_count", "threaded_pass"]
