"""An epoch's global order: position -> (shard, sample within shard), from (seed, epoch) alone.

Shards are permuted, laid end to end, and the positions are shuffled inside consecutive
windows (a shuffle buffer computed from indices: deterministic and resumable). The default
window spans many shards (:func:`default_window`), so sorted packs are mixed too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# shards a default window mixes: enough for class-sorted packs to train as i.i.d.
WINDOW_SHARDS = 64
WINDOW_MIN = 1024  # samples
WINDOW_MAX = 1 << 20  # samples: each worker holds a window's permutation (8 bytes a sample)


def default_window(
    counts: Sequence[int] | np.ndarray,
    nbytes: Sequence[int] | np.ndarray | None = None,
    max_bytes: int | None = None,
) -> int:
    """The default shuffle window: about ``WINDOW_SHARDS`` average shards (1,024 to 2**20 samples),
    and with ``nbytes`` (bytes per shard) at most ``max_bytes`` of shards (at least four shards).

    The window mixes samples of many shards at once, so a pack whose shards are sorted (by class,
    by source) still gives batches about as diverse as an i.i.d. shuffle. The epoch is cut into
    windows of equal length (the last one at most a sample per window shorter), so the epoch's
    tail is mixed as well as its head.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if len(counts) == 0 or int(counts.sum()) == 0:
        return WINDOW_MIN
    total = int(counts.sum())
    per_shard = total / len(counts)
    shards = float(WINDOW_SHARDS)
    if nbytes is not None and max_bytes is not None and len(nbytes) == len(counts):
        mean_bytes = max(float(np.mean(np.asarray(nbytes, dtype=np.float64))), 1.0)
        shards = min(shards, max(4.0, max_bytes / mean_bytes))
    target = int(min(max(WINDOW_MIN, shards * per_shard), WINDOW_MAX))
    if target >= total:
        return target  # one window: the whole epoch
    windows = -(-total // target)
    return max(1, -(-total // windows))


def _rng(*key: int) -> np.random.Generator:
    words = []
    for k in key:
        k %= 1 << 64  # any Python int, negative seeds included
        words += [k & 0xFFFFFFFF, k >> 32]
    return np.random.default_rng(np.random.SeedSequence(words))


@dataclass
class EpochOrder:
    """The global order of one epoch: position ``p`` -> (shard, sample within shard).

    ``shard_order[i]`` is the i-th shard of the epoch and ``ends[i]`` the position where it
    ends; after :meth:`restrict`, both hold only the shards a range of positions can reach,
    starting at ``first``.
    """

    per_shard: np.ndarray  # the dataset's samples per shard, int64
    seed: int
    epoch: int
    shuffle: bool
    window: int
    shard_order: np.ndarray  # the epoch's shard permutation (or a slice of it)
    ends: np.ndarray  # cumulative sample counts along shard_order
    total: int
    first: int = 0
    _cached: tuple[int, np.ndarray] | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls,
        counts: Sequence[int] | np.ndarray,
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        window: int | None = None,
    ) -> EpochOrder:
        counts = np.asarray(counts, dtype=np.int64)
        if window is None:
            window = default_window(counts)
        if window < 1:
            raise ValueError(f"shuffle window must be at least 1 sample, not {window}")
        order = _rng(seed, epoch, 0).permutation(len(counts)) if shuffle else np.arange(len(counts))
        ends = np.cumsum(counts[order])
        return cls(
            counts,
            int(seed),
            int(epoch),
            bool(shuffle),
            int(window),
            order,
            ends,
            int(ends[-1]) if len(ends) else 0,
        )

    def restrict(self, lo: int, hi: int) -> EpochOrder:
        """The same order, holding only the shards that positions in [lo, hi) can reach.

        A rank reads about 1/world of the epoch, so its workers keep O(shards / world)
        of the plan instead of O(shards).
        """
        w_lo = (lo // self.window) * self.window
        w_hi = min(-(-hi // self.window) * self.window, self.total)
        k0 = int(np.searchsorted(self.ends, w_lo, side="right"))
        k1 = int(np.searchsorted(self.ends, max(w_hi - 1, w_lo), side="right")) + 1
        return EpochOrder(
            self.per_shard,
            self.seed,
            self.epoch,
            self.shuffle,
            self.window,
            self.shard_order[k0:k1].astype(np.int64),
            self.ends[k0:k1].copy(),
            self.total,
            k0,
        )

    def window_permutation(self, w: int) -> np.ndarray:
        """The in-window permutation of window ``w`` (identity without shuffle)."""
        if self._cached is not None and self._cached[0] == w:
            return self._cached[1]
        start = w * self.window
        length = min(self.window, self.total - start)
        perm = (
            _rng(self.seed, self.epoch, w + 1).permutation(length)
            if self.shuffle
            else np.arange(length)
        )
        self._cached = (w, perm)
        return perm

    def samples(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard ids, sample offsets) at global ``positions`` (each in ``[0, total)``)."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self.shuffle and self.window > 1:  # windows of one sample permute nothing
            src = np.empty_like(positions)
            windows = positions // self.window
            first, last = int(windows.min()), int(windows.max())
            for w in range(first, last + 1) if last - first < 2 else np.unique(windows).tolist():
                mask = windows == w
                src[mask] = (
                    w * self.window + self.window_permutation(w)[positions[mask] - w * self.window]
                )
        else:
            src = positions  # identity windows
        k = np.searchsorted(self.ends, src, side="right")
        shards = self.shard_order[k]
        offsets = src - (self.ends[k] - self.per_shard[shards])
        return shards, offsets


def batch_diversity(
    order: EpochOrder, labels: Sequence[np.ndarray], batch_size: int
) -> tuple[float, float]:
    """Shuffle quality: (mean distinct labels per batch along ``order``, the same for an i.i.d. shuffle).

    ``labels[s]`` holds the labels of shard ``s``'s samples in shard order. A figure well below
    the i.i.d. one means batches hold few classes (a sorted pack read with a narrow window).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    flat = (
        np.concatenate([np.asarray(x, dtype=np.int64) for x in labels])
        if len(labels)
        else np.zeros(0, np.int64)
    )
    if len(flat) != order.total:
        raise ValueError(f"labels cover {len(flat)} samples, the order {order.total}")
    starts = np.cumsum(order.per_shard) - order.per_shard
    seen: list[int] = []
    for lo in range(0, order.total, batch_size):
        shards, offsets = order.samples(np.arange(lo, min(lo + batch_size, order.total)))
        seen.append(len(np.unique(flat[starts[shards] + offsets])))
    _, freq = np.unique(flat, return_counts=True)
    p = freq / max(len(flat), 1)
    sizes = [min(batch_size, order.total - lo) for lo in range(0, order.total, batch_size)]
    iid = np.mean([float(np.sum(1 - (1 - p) ** b)) for b in sizes]) if sizes else 0.0
    return (float(np.mean(seen)) if seen else 0.0), float(iid)
