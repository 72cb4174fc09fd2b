"""Where a dataset is in its epoch, shared with its workers, and the resume state made from it.

Workers of a persistent DataLoader keep their copy of the dataset, so epoch, rank and resume
position travel through a small shared-memory block that the main process writes and every
worker reads at the start of each pass. The resume state (``state_dict()``) is a few integers
plus the epoch's unread segment; loading it with another world size splits that segment anew
(:func:`shardstream.plan.remaining`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import plan
from ..errors import ShardstreamError, UsageError
from .batches.shared_memory import shared_zeros

STATE_VERSION = 1
MAX_INTERVALS = 4096  # segment intervals the block holds (enough for resizes to 4,096 ranks)


@dataclass(frozen=True)
class Position:
    """One pass's starting point: the epoch, this rank, and the segment still to read."""

    epoch: int
    rank: int
    world_size: int
    segment: list[tuple[int, int]]
    segment_world: int  # the world size the segment's spans are cut for
    consumed: int  # positions of this rank's span read already

    def span(self, drop_last: bool) -> tuple[int, int]:
        """[start, stop) of this rank's span, as indices into the (padded) segment."""
        return plan.rank_range(self.segment, self.segment_world, self.rank, drop_last)

    def remaining(self, drop_last: bool) -> int:
        start, stop = self.span(drop_last)
        return stop - start - self.consumed


class SharedPosition:
    """A :class:`Position` in shared memory: written by the main process, read by every worker.

    Layout: epoch, rank, world size, segment world size, consumed, interval count, intervals...
    The block is allocated in shared memory directly and read and written through numpy: a torch
    copy of its 65 KB would run an OpenMP loop, and a process forked after one (a ``fork`` pool
    made by a process that has a ShardDataset) hangs in its first OpenMP loop.
    """

    def __init__(self) -> None:
        self.block = shared_zeros(6 + 2 * MAX_INTERVALS)
        self.gen = shared_zeros(1)  # bumped by every set(): workers see changes

    @property
    def generation(self) -> int:
        return int(self.gen.numpy()[0])

    def set(self, p: Position, bump: bool = True) -> None:
        if len(p.segment) > MAX_INTERVALS:
            raise ShardstreamError(
                f"a resume state with {len(p.segment)} intervals is more than this reader holds"
            )
        b = self.block.numpy()
        b[:6] = [p.epoch, p.rank, p.world_size, p.segment_world, p.consumed, len(p.segment)]
        if p.segment:
            b[6 : 6 + 2 * len(p.segment)] = np.asarray(p.segment, dtype=np.int64).reshape(-1)
        if bump:
            self.gen.numpy()[0] += 1

    def get(self) -> Position:
        b = self.block.numpy()
        epoch, rank, world_size, segment_world, consumed, n = b[:6].tolist()
        flat = b[6 : 6 + 2 * n].tolist()
        segment = [(flat[2 * i], flat[2 * i + 1]) for i in range(n)]
        return Position(epoch, rank, world_size, segment, segment_world, consumed)


@dataclass(frozen=True)
class OrderKey:
    """What fixes the epoch's order and each rank's part of it: a resume state must match it."""

    seed: int
    num_samples: int
    drop_last: bool
    shuffle: bool
    window: int  # the resolved shuffle window, in samples
    fingerprint: str  # the manifest's (Manifest.fingerprint): which shards, samples and bytes
    dataset_version: int | None = None  # the manifest's version (Manifest.version), for one dataset


# a default window over remote shards downloads at most this before its first batch
REMOTE_WINDOW_BYTES = 1 << 30


def resolve_window(
    shuffle_window: int | None,
    counts: np.ndarray,
    nbytes: np.ndarray | None = None,
    remote: bool = False,
) -> int:
    """The shuffle window in samples: the default for ``None`` (about 64 shards; over remote shards at
    most 1 GiB of them, and at least four, since the first batch waits for the window's shards);
    0 or 1 shuffle no samples within a window (shards are still permuted, with ``shuffle=True``)."""
    if shuffle_window is None:
        if remote and nbytes is not None:
            return plan.default_window(counts, nbytes, max_bytes=REMOTE_WINDOW_BYTES)
        return plan.default_window(counts)
    if (
        isinstance(shuffle_window, bool)
        or not isinstance(shuffle_window, (int, np.integer))
        or shuffle_window < 0
    ):
        raise UsageError(
            f"shuffle_window must be a number of samples (0 or more) or None, not {shuffle_window!r}"
        )
    return max(int(shuffle_window), 1)


def to_state(p: Position, key: OrderKey) -> dict[str, Any]:
    """The resume state of a pass starting at ``p``."""
    return {
        "version": STATE_VERSION,
        "epoch": p.epoch,
        "seed": key.seed,
        "num_samples": key.num_samples,
        "drop_last": key.drop_last,
        "shuffle": key.shuffle,
        "window": key.window,
        "fingerprint": key.fingerprint,
        **({"dataset_version": key.dataset_version} if key.dataset_version is not None else {}),
        "segment": [list(iv) for iv in p.segment],
        "world_size": p.segment_world,
        "consumed": p.consumed,
    }


def _differences(state: dict[str, Any], key: OrderKey) -> list[str]:
    """The settings in which ``state`` differs from ``key``, as phrases; keys a state lacks are not checked."""
    out = []
    saved = state.get("dataset_version")
    # another version with the same data (an identical re-pack) resumes exactly: no difference then
    same_data = state.get("fingerprint") == key.fingerprint
    if (
        saved is not None
        and key.dataset_version is not None
        and saved != key.dataset_version
        and not same_data
    ):
        out.append(
            f"dataset version {saved} in the state, {key.dataset_version} here (open it with "
            f"version={saved} to resume on the data the state was saved with)"
        )
    if state["num_samples"] != key.num_samples:
        out.append(f"{state['num_samples']} samples in the state, {key.num_samples} here")
    fingerprint = state.get("fingerprint")
    if fingerprint is not None and fingerprint != key.fingerprint:
        out.append(
            f"manifest fingerprint {str(fingerprint)[:12]}... in the state, {key.fingerprint[:12]}... here "
            "(the dataset was re-packed or changed)"
        )
    if state["seed"] != key.seed:
        out.append(f"seed {state['seed']} in the state, {key.seed} here")
    if bool(state["drop_last"]) != key.drop_last:
        out.append(f"drop_last={bool(state['drop_last'])} in the state, {key.drop_last} here")
    shuffle = state.get("shuffle")
    if shuffle is not None and bool(shuffle) != key.shuffle:
        out.append(f"shuffle={bool(shuffle)} in the state, {key.shuffle} here")
    window = state.get("window")
    # without shuffle it orders nothing
    if key.shuffle and shuffle and window is not None and window != key.window:
        out.append(f"shuffle_window={window} in the state, {key.window} here")
    return out


_REQUIRED = ("epoch", "seed", "num_samples", "drop_last", "segment", "world_size", "consumed")


def from_state(state: dict[str, Any], key: OrderKey, rank: int, world_size: int) -> Position:
    """The position ``state`` resumes at for this rank.

    Refuses a state saved with another dataset (manifest fingerprint, sample count), seed,
    ``drop_last``, ``shuffle`` or shuffle window, naming what differs. States saved by
    shardstream 0.2.0 lack ``shuffle``, ``window`` and ``fingerprint``: those are unknown
    then, and not checked.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        found = state.get("version") if isinstance(state, dict) else type(state).__name__
        raise ShardstreamError(
            f"unknown resume state version {found!r}; pass what state_dict() returned"
        )
    missing = [name for name in _REQUIRED if name not in state]
    if missing:
        raise ShardstreamError(
            f"the resume state lacks {', '.join(missing)}; pass what state_dict() returned"
        )
    differences = _differences(state, key)
    if differences:
        raise ShardstreamError(
            f"the resume state does not fit this dataset: {'; '.join(differences)}; resume with the dataset and "
            "settings it was saved with, or start the epoch afresh (set_epoch) instead of loading it"
        )
    try:
        segment = [(int(a), int(b)) for a, b in state["segment"]]
        saved_world, consumed, epoch = (
            int(state["world_size"]),
            int(state["consumed"]),
            int(state["epoch"]),
        )
    except (TypeError, ValueError) as exc:
        raise ShardstreamError(
            f"the resume state is malformed ({exc}); pass what state_dict() returned"
        ) from exc
    if (
        saved_world < 1
        or any(not 0 <= a < b <= key.num_samples for a, b in segment)
        or not 0
        <= consumed
        <= plan.per_rank(plan.segment_length(segment), saved_world, key.drop_last)
    ):
        raise ShardstreamError(
            "the resume state's segment, world_size or consumed is out of range for this "
            "dataset; pass what state_dict() returned"
        )
    if saved_world != world_size:  # another world size: split what is left anew
        segment, saved_world, consumed = (
            plan.remaining(segment, saved_world, consumed, key.drop_last),
            world_size,
            0,
        )
    return Position(epoch, rank, world_size, segment, saved_world, consumed)


# A StatefulDataLoader's worker state: the pass-start state plus which worker (of how many) and how many
# of its chunks (of ``chunk`` samples, dealt round robin) it has yielded.
WORKER_KEYS = ("worker", "workers", "chunk", "done")


def next_epoch(p: Position, num_samples: int) -> Position:
    """The start of the epoch after ``p``'s, whole."""
    return Position(p.epoch + 1, p.rank, p.world_size, [(0, num_samples)], p.world_size, 0)


def progress_state(
    p: Position,
    key: OrderKey,
    span: tuple[int, int],
    chunk: int,
    done: int,
    num_workers: int,
    worker_id: int,
) -> dict[str, Any]:
    """The state of a pass from ``p`` whose reader (one of ``num_workers``) has yielded ``done`` chunks."""
    if num_workers == 1:
        return to_state(
            dataclasses.replace(p, consumed=min(p.consumed + done * chunk, span[1] - span[0])), key
        )
    return dict(to_state(p, key), worker=worker_id, workers=num_workers, chunk=chunk, done=done)


def loaded_position(
    state: dict[str, Any], key: OrderKey, rank: int, world_size: int, worker: tuple[int, int] | None
) -> tuple[Position, int]:
    """Where ``state`` resumes in this process (``worker``: (id, count) in a DataLoader worker), and how
    many of this worker's chunks to skip. A state with nothing left resumes the next epoch, whole."""
    if not isinstance(state, dict):
        raise ShardstreamError(
            f"a resume state is a dict, not {type(state).__name__}; pass what state_dict() returned"
        )
    base = {k: v for k, v in state.items() if k not in WORKER_KEYS}
    p = from_state(base, key, rank, world_size)
    skip = 0
    if "worker" in state:
        saved = (state["worker"], state["workers"])
        if worker is None and saved[1] > 1:
            raise ShardstreamError(
                "this is one DataLoader worker's state (a StatefulDataLoader's); load the "
                "StatefulDataLoader's state_dict into a StatefulDataLoader with as many workers"
            )
        if worker is not None and tuple(worker) != saved:
            raise ShardstreamError(
                f"a state of worker {saved[0]} of {saved[1]} loaded into worker {worker[0]} of "
                f"{worker[1]}; resume with as many workers"
            )
        if worker is None or worker[1] == 1:  # one worker: its chunks are contiguous
            left = p.remaining(key.drop_last)
            p = dataclasses.replace(
                p, consumed=p.consumed + min(int(state["done"]) * int(state["chunk"]), left)
            )
        else:
            skip = int(state["done"])
    if p.remaining(key.drop_last) == 0 and skip == 0:
        p = next_epoch(p, key.num_samples)
    return p, skip
