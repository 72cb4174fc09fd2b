"""A mix's global order: which source each position of an epoch reads, from integers alone.

Source ``i`` gets an exact **quota** ``q_i`` of the epoch's ``N`` positions: ``w_i * N`` rounded
down or up by largest remainder, so the quotas sum to ``N``. The positions are dealt by a binary
tree over the sources: a node that holds ``c`` of the first ``n`` positions gives its left child
``floor(c * Q_left / Q + 1/2)`` of them (``Q``: the quotas under a node) and its right child the
rest. Each split is a balanced (Sturmian) sequence, off by at most half a sample, so with up to
four sources (no source more than two splits deep) every prefix of the order holds each source's
share to within one sample: ``|count_i(n) - w_i * n| < 1``; with more sources the errors of nested
splits can add up to a little more (at most 1.3 in the tests). Each source's count at any
position is a closed form: a position is placed in O(sources), with no table of O(samples), and
the order is the same for any world size.

Each source is read as an endless stream of its own passes: the ``k``-th sample a source gives
in epoch ``e`` is item ``e * q_i + k`` of its stream, that is item ``(e * q_i + k) % size`` of its
pass ``(e * q_i + k) // size`` (:func:`stream_items`). An upsampled source (quota above its
size) thus shows every sample before any sample a third time, and a downsampled one goes on
where it stopped in the next epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def quotas(weights: Sequence[float] | np.ndarray, total: int) -> np.ndarray:
    """Positions per source in an epoch of ``total``: ``weights`` (normalised) times ``total``,
    rounded down, the remainder going to the largest fractions (ties to the lower index)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    exact = w * total
    q = np.floor(exact).astype(np.int64)
    left = int(total - q.sum())
    if left > 0:
        q[np.argsort(-(exact - q), kind="stable")[:left]] += 1
    return q


def _split(items: list[int], q: np.ndarray, top: bool) -> tuple[list[int], list[int]]:
    """Two groups of about equal quota (the heaviest first, each to the lighter group); a mix of four
    sources splits two and two, so that no source sits more than two splits deep."""
    if top and len(items) == 4:
        pairings = [
            ([items[0], items[j]], [i for i in items[1:] if i != items[j]]) for j in (1, 2, 3)
        ]
        return min(pairings, key=lambda ab: abs(int(q[ab[0]].sum()) - int(q[ab[1]].sum())))
    a: list[int] = []
    b: list[int] = []
    wa = wb = 0
    for i in sorted(items, key=lambda i: (-int(q[i]), i)):
        if wa <= wb:
            a.append(i)
            wa += int(q[i])
        else:
            b.append(i)
            wb += int(q[i])
    return sorted(a), sorted(b)


@dataclass(frozen=True)
class MixSchedule:
    """The order of one mix epoch: position -> (source, its index among the source's positions).

    ``quota[i]`` positions go to source ``i``; ``total`` is their sum. The tree's internal nodes
    are rows of ``left``/``right`` (a child ``>= 0`` is a node, ``-1 - i`` is source ``i``) and
    ``left_quota``/``node_quota`` (the quotas under the left child and under the node).
    """

    quota: np.ndarray
    total: int
    left: np.ndarray
    right: np.ndarray
    left_quota: np.ndarray
    node_quota: np.ndarray

    @classmethod
    def create(cls, quota: Sequence[int] | np.ndarray) -> MixSchedule:
        q = np.asarray(quota, dtype=np.int64)
        if len(q) == 0 or (q < 0).any() or q.sum() == 0:
            raise ValueError(f"a mix needs quotas of 0 or more, not all 0: {q.tolist()}")
        rows: list[list[int]] = []

        def build(items: list[int]) -> int:
            if len(items) == 1:
                return -1 - items[0]
            a, b = _split(items, q, not rows)
            row = len(rows)
            rows.append([0, 0, int(q[a].sum()), int(q[items].sum())])
            rows[row][0], rows[row][1] = build(a), build(b)
            return row

        root = build([i for i in range(len(q)) if q[i] > 0])
        table = np.array(rows, dtype=np.int64).reshape(-1, 4)
        if root < 0:  # one source takes every position
            table = np.array([[root, root, int(q.sum()), int(q.sum())]], dtype=np.int64)
        return cls(q, int(q.sum()), table[:, 0], table[:, 1], table[:, 2], table[:, 3])

    def _left_count(self, node: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Of a node's first ``count`` positions, how many its left child holds."""
        ql, qn = self.left_quota[node], self.node_quota[node]
        if self.total < 1 << 30:  # exact in int64
            return (2 * ql * count + qn) // (2 * qn)
        big = (2 * ql.astype(object) * count.astype(object) + qn.astype(object)) // (
            2 * qn.astype(object)
        )
        return big.astype(np.int64)  # Python integers: no overflow past 2**30 positions

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, index among that source's positions of the epoch) of each of ``positions``."""
        positions = np.asarray(positions, dtype=np.int64)
        node = np.zeros(len(positions), dtype=np.int64)
        before = positions.copy()  # positions of the current node before each one
        while True:
            inner = node >= 0
            if not inner.any():
                break
            n, c = node[inner], before[inner]
            left_before = self._left_count(n, c)
            go_left = self._left_count(n, c + 1) > left_before
            node[inner] = np.where(go_left, self.left[n], self.right[n])
            before[inner] = np.where(go_left, left_before, c - left_before)
        return -1 - node, before

    def counts(self, n: int) -> np.ndarray:
        """How many of the first ``n`` positions each source holds."""
        out = np.zeros(len(self.quota), dtype=np.int64)

        def go(child: int, count: int) -> None:
            if child < 0:
                out[-1 - child] = count
                return
            left = int(self._left_count(np.array([child]), np.array([count]))[0])
            go(int(self.left[child]), left)
            if self.right[child] != self.left[child]:  # (a mix with one source: its leaf is both)
                go(int(self.right[child]), count - left)

        go(0, int(n))
        return out


def stream_items(
    epoch: int, quota: int, size: int, index: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(pass, item within the pass) of a source's ``index``-th samples of mix epoch ``epoch``."""
    t = np.asarray(index, dtype=np.int64) + int(epoch) * int(quota)
    return t // size, t % size


__all__ = ["MixSchedule", "quotas", "stream_items"]
