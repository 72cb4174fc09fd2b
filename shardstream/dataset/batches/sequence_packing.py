"""``SequencePacking``: variable-length samples (SFT conversations, instruction pairs) packed into rows
of at most ``seq_len`` tokens by best-fit decreasing over a pool.

Each pool of samples is packed by :func:`shardstream.plan.bins.best_fit_decreasing`; each batch
holds ``batch_rows`` rows of exactly ``seq_len`` tokens (the tail of a row is padding), with
``input_ids``, ``labels`` (the sample's labels or loss mask; -100 on padding and on the first token of
every sample, so that a model that shifts its labels, as Hugging Face's do, never predicts one sample's
first token from the one before it), ``position_ids`` counting from 0 in every sample (and in the
padding after the last one, which is a sequence of its own), and ``cu_seqlens`` / ``max_seqlen`` by
the token datasets' convention: a sequence starts exactly where ``position_ids`` is 0, and the last
entry is ``rows * seq_len``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...errors import UsageError
from ...plan.bins import best_fit_decreasing, cut_largest, deal
from ..tokens import varlen_fields
from .pooled import PooledBatches

IGNORE = -100  # the label no loss is taken of (PyTorch's cross_entropy ignore_index)


def _tokens(value: Any) -> np.ndarray:
    return np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value, dtype=np.int64)


class SequencePacking(PooledBatches):
    """Batches of ``batch_rows`` rows of ``seq_len`` tokens, several samples to a row.

    Args:
        dataset: a :class:`ShardDataset` (or a :class:`MixedDataset`) whose samples hold ``field`` (a
            1-d sequence of token ids: tensor, array or list) and optionally ``labels`` (the same length,
            -100 where no loss is taken) or ``loss_mask`` (the same length, 1 where a loss is taken).
        seq_len: tokens per row; a longer sample is an error naming it (truncate or filter it in the
            dataset's transform).
        window: the pool's size, the samples packed together (the loader reads a pool at a time);
            larger pools pad less.
        batch_rows: rows per batch (the batch's shape is always ``batch_rows x seq_len``).
        field: the samples' field of token ids.
        labels: the samples' field of labels, if they have one.
        loss_mask: the samples' field of loss masks, if they have one.
        pad_id: the token id of padding.
        num_workers: for ``dataset.loader``.
        loader_kwargs: other arguments of ``dataset.loader``.

    Every sample of the epoch is in exactly one row (padding repeats of ``drop_last=False`` included);
    every rank yields the same number of batches; a batch holds at least one sample.
    """

    def __init__(  # noqa: PLR0913 - keyword settings with defaults, as LengthBucketing's
        self,
        dataset: Any,
        seq_len: int,
        *,
        window: int = 1024,
        batch_rows: int = 1,
        field: str = "input_ids",
        labels: str = "labels",
        loss_mask: str = "loss_mask",
        pad_id: int = 0,
        num_workers: int | None = None,
        **loader_kwargs: Any,
    ):
        for name, value in (("seq_len", seq_len), ("batch_rows", batch_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be 1 or more, not {value!r}")
        self.seq_len, self.batch_rows = seq_len, batch_rows
        self.field, self.labels, self.loss_mask, self.pad_id = field, labels, loss_mask, pad_id
        super().__init__(dataset, window, num_workers, loader_kwargs)

    def plan(self, samples: list[Any]) -> list[list[list[int]]]:
        """The pool's rows (best fit decreasing), dealt into batches of ``batch_rows`` rows."""
        lengths = np.array([len(s[self.field]) for s in samples], dtype=np.int64)
        long = np.flatnonzero(lengths > self.seq_len)
        if len(long):
            s = samples[int(long[0])]
            name = s.get("__key__", f"sample {int(long[0])} of the window")
            raise UsageError(
                f"{name} has {int(lengths[long[0]])} tokens, more than seq_len={self.seq_len}: raise seq_len, "
                "or truncate or filter such samples in the dataset's transform"
            )
        rows = best_fit_decreasing(lengths, self.seq_len)
        return [rows[a:b] for a, b in _batches(len(rows), -(-len(rows) // self.batch_rows))]

    def fit(self, groups: list[list[list[int]]], count: int) -> list[list[list[int]]]:
        """``count`` batches of the same rows, rows halved where there are fewer rows than batches."""
        rows = cut_largest([r for g in groups for r in g], count)
        return [rows[a:b] for a, b in _batches(len(rows), count)]

    def _labels(self, sample: dict[str, Any], ids: np.ndarray) -> np.ndarray:
        if self.labels in sample:
            return _tokens(sample[self.labels])
        if self.loss_mask in sample:
            return np.where(_tokens(sample[self.loss_mask]) != 0, ids, IGNORE)
        return ids

    def make(self, samples: list[Any], group: list[list[int]]) -> dict[str, Any]:
        """One batch: ``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens``, ``max_seqlen``, the
        samples' keys by row (``__key__``) and the real tokens in it (``tokens``)."""
        shape = (self.batch_rows, self.seq_len)
        ids = np.full(shape, self.pad_id, dtype=np.int64)
        labels = np.full(shape, IGNORE, dtype=np.int64)
        positions = np.tile(np.arange(self.seq_len, dtype=np.int64), (self.batch_rows, 1))
        keys: list[list[Any]] = []
        for r, row in enumerate(group):
            at = 0
            keys.append([samples[i].get("__key__") for i in row])
            for i in row:
                tokens = _tokens(samples[i][self.field])
                n = len(tokens)
                target = self._labels(samples[i], tokens)
                if len(target) != n:
                    raise UsageError(
                        f"{samples[i].get('__key__', 'a sample')}: {n} tokens but {len(target)} labels; "
                        f"give '{self.labels}' or '{self.loss_mask}' one value per token"
                    )
                ids[r, at : at + n] = tokens
                labels[r, at : at + n] = target
                if n:
                    labels[r, at] = IGNORE
                positions[r, at : at + n] = np.arange(n)
                at += n
            positions[r, at:] = np.arange(self.seq_len - at)  # the padding: a sequence of its own
        keys += [[] for _ in range(self.batch_rows - len(group))]
        return {
            "input_ids": torch.from_numpy(ids),
            "labels": torch.from_numpy(labels),
            "position_ids": torch.from_numpy(positions),
            **varlen_fields(positions),
            "__key__": keys,
            "tokens": int(sum(len(samples[i][self.field]) for row in group for i in row)),
        }


def _batches(rows: int, count: int) -> list[tuple[int, int]]:
    return deal(rows, count) if count else []


__all__ = ["IGNORE", "SequencePacking"]
