"""Which samples of which shard a dataset names, with which labels: the one answer every reader asks.

A manifest lists shards and the **stored samples** of each (what the shard file holds:
``Manifest.stored_counts``). A dataset may name fewer: a split **selects** some of each shard's stored
samples (its selection side file), and a token dataset names **windows** of ``seq_len + 1`` tokens
instead of documents. A merge **relabels**: each shard's ``cls`` values map to the merged class list.
Versions, appends and merges across stores only change which shards a manifest lists.

:func:`samples_of` turns a manifest (and, for tokens, a ``seq_len``) into a :class:`SampleSet`: the
dataset's samples per shard, sample ``i`` in manifest order, the stored sample each one is, and its
label. ``ShardDataset``, ``TokenDataset``, ``MixedDataset``, ``ShardMap``, the batch shapes and every
command count and locate samples through it, so none can name another set of samples than the others.
The words are kept apart everywhere (see the glossary in ``docs/design/format.md``): *stored* samples
are a shard file's, *selected* samples a split's, and a dataset's *samples* are what its readers yield
one of: its selected samples, or its windows.
"""

from __future__ import annotations

import bisect
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .relabel import LABEL_FIELD
from .selection import selected_counts

if TYPE_CHECKING:
    from .relabel import Relabel
    from .schema import Manifest


@dataclass(frozen=True)
class SampleSet:
    """A dataset's samples: per shard how many, sample ``i`` in manifest order, and what each one reads.

    Attributes:
        manifest: the manifest the samples are of.
        per_shard: the dataset's samples of each shard (int64): its selected samples, or its windows.
        seq_len: a token dataset's tokens per window (``None``: samples are stored samples).
    """

    manifest: Manifest
    per_shard: np.ndarray
    seq_len: int | None = None
    _ends: np.ndarray = field(init=False, repr=False, compare=False)
    _bounds: list[int] = field(
        init=False, repr=False, compare=False
    )  # _ends, for one index at a time

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ends", np.cumsum(self.per_shard, dtype=np.int64))
        object.__setattr__(self, "_bounds", self._ends.tolist())

    @property
    def total(self) -> int:
        """The dataset's samples (an epoch before padding or dropping for ranks)."""
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def selected(self) -> bool:
        """Whether the dataset reads some of its shards' stored samples only (a split)."""
        return self.seq_len is None and self.manifest.selection is not None

    @property
    def classes(self) -> list[str] | None:
        """The class names a sample's ``cls`` indexes (after a merge's relabelling)."""
        return self.manifest.classes

    def first(self, shard: int) -> int:
        """The index of shard ``shard``'s first sample."""
        return int(self._ends[shard] - self.per_shard[shard])

    def locate(self, index: int) -> tuple[int, int]:
        """(shard, sample of the shard) of sample ``index`` in manifest order (negative: from the end);
        ``IndexError`` outside, ``TypeError`` for what is not an integer (``True`` included)."""
        if isinstance(index, (bool, np.bool_)):
            raise TypeError(f"sample indexes are integers, not {index!r}")
        i = operator.index(index)
        bounds = self._bounds  # (a Python list: no array made for one index)
        n = bounds[-1] if bounds else 0
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample {index} is out of range: the dataset has {n:,} samples")
        shard = bisect.bisect_right(bounds, i)
        return shard, i - (bounds[shard - 1] if shard else 0)

    def locate_many(self, indexes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`locate` of many indexes at once (all within ``[-total, total)``, already checked)."""
        found = np.asarray(indexes, dtype=np.int64)
        found = np.where(found < 0, found + self.total, found)
        shards = np.searchsorted(self._ends, found, side="right")
        return shards, found - (self._ends[shards] - self.per_shard[shards])

    def stored_rows(self, shards: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """The stored sample numbers of the dataset's samples ``offsets`` of ``shards`` (a split's
        selection maps them; otherwise they are the same). For windows: the window numbers."""
        selection = self.manifest.selection
        if selection is None or self.seq_len is not None:
            return np.asarray(offsets, dtype=np.int64)
        return selection.offsets(np.asarray(shards, dtype=np.int64), np.asarray(offsets))

    def stored_rows_of(self, shard: int) -> np.ndarray:
        """The stored sample numbers shard ``shard``'s samples read, in order."""
        count = int(self.per_shard[shard])
        return self.stored_rows(np.full(count, shard, dtype=np.int64), np.arange(count))

    def stored_numbers(self) -> np.ndarray:
        """Each of the dataset's samples, in order, as a number among all the stored samples of its shards
        in manifest order (what a per-stored-sample side file, as recorded image sizes, is indexed by)."""
        if self.seq_len is not None:
            raise ValueError("windows are no stored samples")
        shards = np.repeat(np.arange(len(self.per_shard)), self.per_shard)
        offsets = np.arange(self.total) - np.repeat(self._ends - self.per_shard, self.per_shard)
        stored = self.manifest.stored_counts
        return (np.cumsum(stored) - stored)[shards] + self.stored_rows(shards, offsets)

    def labeled(self, stored: dict[str, Any], shard: int, where: str) -> dict[str, Any]:
        """A stored sample with its label mapped to :attr:`classes` (a merge's relabelling)."""
        relabel = self.manifest.relabel
        return stored if relabel is None else relabel.sample(stored, shard, where)

    def labels(self, values: np.ndarray, shard: int, where: str) -> np.ndarray:
        """Shard ``shard``'s stored ``cls`` values (integers) as indexes into :attr:`classes`."""
        relabel = self.manifest.relabel
        return values if relabel is None else relabel.labels(values, shard, where)

    @property
    def relabels(self) -> bool:
        """Whether a sample's ``cls`` must be read to be mapped (a merge of other class lists)."""
        return self.manifest.relabel is not None

    @property
    def relabel(self) -> Relabel | None:
        """Each shard's map of its stored labels to :attr:`classes` (a merge's), or ``None``."""
        return self.manifest.relabel

    @property
    def stored_bytes_per_sample(self) -> float:
        """The shards' bytes per stored sample (for windows: per window, what one costs to read)."""
        m = self.manifest
        stored = int(m.stored_counts.sum()) if self.seq_len is None else int(m.tokens["total"])
        per = m.total_bytes / max(stored, 1)
        return per * self.seq_len if self.seq_len is not None else per


def samples_of(manifest: Manifest, seq_len: int | None = None) -> SampleSet:
    """The samples ``manifest`` names: each shard's selected samples (all of its stored ones but for a
    split), or, for a token dataset read with ``seq_len``, its windows of ``seq_len + 1`` tokens."""
    if seq_len is not None:
        from .token_stats import token_windows

        return SampleSet(manifest, token_windows(manifest, seq_len).astype(np.int64), int(seq_len))
    per_shard = selected_counts(manifest.stored_counts, manifest.selection)
    return SampleSet(manifest, np.asarray(per_shard, dtype=np.int64))


__all__ = ["LABEL_FIELD", "SampleSet", "samples_of"]
