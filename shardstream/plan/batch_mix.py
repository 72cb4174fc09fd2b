"""A mix whose unit is a batch: each batch of ``batch_size`` positions reads one source.

The mix's schedule (:class:`~shardstream.plan.mix.MixSchedule`) deals out **batches** instead of
samples: source ``i`` gets an exact quota of ``Q_i`` of the epoch's ``M`` batches (``w_i * M``
rounded by largest remainder), and every prefix of the batch order holds each source's share to
within one batch. Position ``p`` of the epoch (a sample) is row ``p % batch_size`` of batch
``p // batch_size``; if that batch is the ``k``-th of source ``i``, the sample is item
``k * batch_size + row`` of the source's ``Q_i * batch_size`` positions in the epoch, read from the
source's endless stream of passes exactly as in a sample mix (:func:`~shardstream.plan.mix.stream_items`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .mix import MixSchedule, quotas


@dataclass(frozen=True)
class BatchSchedule:
    """The order of one per-source-batch mix epoch: sample position -> (source, its index among the
    source's positions), each batch of ``batch_size`` positions from one source."""

    batches: MixSchedule
    batch_size: int

    @classmethod
    def create(
        cls, weights: Sequence[float] | np.ndarray, batches: int, batch_size: int
    ) -> BatchSchedule:
        """``batches`` batches of ``batch_size`` dealt to the sources by ``weights``."""
        if batch_size < 1 or batches < 1:
            raise ValueError(
                f"a batch mix needs at least one batch of one sample, not {batches} of {batch_size}"
            )
        return cls(MixSchedule.create(quotas(weights, batches)), int(batch_size))

    @property
    def quota(self) -> np.ndarray:
        """Samples per source in an epoch (whole batches)."""
        return self.batches.quota * self.batch_size

    @property
    def total(self) -> int:
        """Samples in an epoch."""
        return self.batches.total * self.batch_size

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, index among that source's positions of the epoch) of each sample position."""
        positions = np.asarray(positions, dtype=np.int64)
        batch, row = np.divmod(positions, self.batch_size)
        source, k = self.batches.locate(batch)
        return source, k * self.batch_size + row

    def batch_sources(self, batches: np.ndarray) -> np.ndarray:
        """The source of each of ``batches`` (batch indices of the epoch)."""
        return self.batches.locate(np.asarray(batches, dtype=np.int64))[0]

    def counts(self, n: int) -> np.ndarray:
        """How many of the first ``n`` batches each source holds."""
        return self.batches.counts(n)


def expand(batches: np.ndarray, batch_size: int) -> np.ndarray:
    """The sample positions of ``batches``, batch after batch."""
    rows = np.arange(batch_size, dtype=np.int64)
    return (np.asarray(batches, dtype=np.int64)[:, None] * batch_size + rows).ravel()


__all__ = ["BatchSchedule", "expand"]
