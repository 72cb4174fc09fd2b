"""A split's selection: which samples of each listed shard a dataset reads, in a side file.

The manifest lists the source's shards (their paths under a root beside the dataset, their full sample
counts, sizes and checksums, unchanged); ``selection`` in its head names ``.shardstream/selection-<16 hex>-<16 hex>.npy`` (:mod:`.side_names`)
(with its sha256 and the number of samples selected), a NumPy array of ``uint32``: the number of shards
``n``, then each shard's selected count, then the selected sample numbers of each shard in increasing
order. The plan works on the selected counts (O(shards)); a reader maps the plan's (shard, offset) to the
offset in the shard with one vectorized lookup per batch. The file costs 4 bytes per selected sample (and
as much memory in each reading process); it is untrusted input: its sha256 is checked before it is parsed
(with ``allow_pickle=False``) and every number against the shards it selects from.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .side_names import side_name, side_name_fits

SELECTION_PREFIX, SELECTION_SUFFIX = "selection-", ".npy"


@dataclass
class Selection:
    """Per shard, the samples a dataset reads of it (``rows[starts[i]:starts[i + 1]]``, increasing)."""

    per_shard: np.ndarray  # int64: the selected samples of each shard
    rows: np.ndarray  # uint32, all shards' selected sample numbers
    reference: dict[str, Any] = field(
        default_factory=dict
    )  # what the head holds: file, sha256, samples

    @property
    def starts(self) -> np.ndarray:
        cached = self.__dict__.get("_starts")
        if cached is None:
            cached = self.__dict__["_starts"] = np.concatenate(
                [[0], np.cumsum(self.per_shard, dtype=np.int64)]
            )
        return cached

    def data(self) -> bytes:
        """The side file's bytes (those its reference's sha256 is of)."""
        array = np.concatenate([[len(self.per_shard)], self.per_shard, self.rows]).astype(np.uint32)
        sink = io.BytesIO()
        np.save(sink, array, allow_pickle=False)
        return sink.getvalue()

    def offsets(self, shards: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """The offsets in the shards of the plan's (``shards``, ``offsets``): the i-th selected sample of each."""
        return self.rows[self.starts[shards] + offsets].astype(np.int64)

    def problem(self, samples: np.ndarray) -> str | None:
        """What keeps this selection from selecting of shards of ``samples`` samples, or None."""
        if len(self.per_shard) != len(samples):
            return f"its selection lists {len(self.per_shard)} shards, the manifest {len(samples)}"
        if (self.per_shard > samples).any():
            i = int(np.argmax(self.per_shard > samples))
            return f"its selection takes {int(self.per_shard[i])} samples of shard {i}, which has {int(samples[i])}"
        if len(self.rows) and (self.rows >= np.repeat(samples, self.per_shard)).any():
            return "its selection names a sample past the end of its shard"
        steps = np.diff(self.rows.astype(np.int64))
        inner = np.ones(len(steps), bool)
        firsts = self.starts[1:-1]  # where each shard's rows start, after the first shard's
        inner[firsts[(firsts > 0) & (firsts < len(self.rows))] - 1] = False
        if (steps[inner] <= 0).any():
            return "its selection's samples of a shard are not in increasing order"
        return None


def selected_counts(stored_counts: np.ndarray, selection: Selection | None) -> np.ndarray:
    """Per shard, the samples a dataset reads of it: a split's selected ones, else every stored one
    (the rule :func:`~shardstream.manifest.sample_set.samples_of` and ``Manifest.num_samples`` share)."""
    return stored_counts if selection is None else selection.per_shard


def encode_selection(per_shard: Sequence[np.ndarray]) -> tuple[bytes, Selection]:
    """The side file of a selection (each shard's selected sample numbers, increasing), and the selection."""
    counts = np.array([len(rows) for rows in per_shard], dtype=np.int64)
    rows = (
        np.concatenate([np.asarray(r, np.uint32) for r in per_shard])
        if per_shard
        else np.zeros(0, np.uint32)
    )
    data = Selection(counts, rows.astype(np.uint32)).data()
    digest = hashlib.sha256(data).hexdigest()
    reference = {
        "file": side_name(SELECTION_PREFIX, SELECTION_SUFFIX, digest),
        "sha256": digest,
        "samples": int(counts.sum()),
    }
    return data, Selection(counts, rows.astype(np.uint32), reference)


def read_selection(
    ref: dict[str, Any], read: Callable[[str], bytes] | None
) -> tuple[str | None, Selection | None]:
    """(problem or None, selection) of the head's ``selection`` reference, its file read with ``read``."""
    name, digest, samples = ref.get("file"), ref.get("sha256"), ref.get("samples")
    if set(ref) != {"file", "sha256", "samples"} or not (
        side_name_fits(name, SELECTION_PREFIX, SELECTION_SUFFIX, digest) and type(samples) is int
    ):
        return f"its selection reference {str(ref)[:120]} is not {{file, sha256, samples}}", None
    if read is None:
        return f"it names the selection {name}, and nothing was given to read it", None
    data = read(name)
    if hashlib.sha256(data).hexdigest() != digest:
        return f"its selection {name} does not match its sha256 (changed or damaged)", None
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        return f"its selection {name} is not a NumPy array ({str(exc)[:80]})", None
    if array.dtype != np.uint32 or array.ndim != 1 or not len(array):
        return f"its selection {name} is not a flat uint32 array", None
    n = int(array[0])
    counts = array[1 : 1 + n].astype(np.int64)
    rows = array[1 + n :]
    if len(counts) != n or int(counts.sum()) != len(rows) or len(rows) != samples:
        return f"its selection {name} does not add up ({samples} samples in the head)", None
    return None, Selection(counts, rows, dict(ref))


__all__ = [
    "SELECTION_PREFIX",
    "Selection",
    "encode_selection",
    "read_selection",
    "selected_counts",
]
