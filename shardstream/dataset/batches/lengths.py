"""``LengthBucketing``: variable-size batches filled up to a token budget (SFT-style sequences).

The dataset's loader reads ``window`` samples at a time (one of its batches, so every rank reads
the same number of pools: the plan's equal spans). Each pool is sorted by length (ties by
position, so it is deterministic) and cut into batches whose padded size ``rows x longest``
stays within ``batch_tokens``. The number of batches of a pool depends on its lengths, so
under ``torch.distributed`` the ranks agree on it with one ``all_reduce(MAX)`` of one integer
per pool, and a rank that needs fewer cuts its largest batches: every rank yields the same
number of batches, and none waits for another in a collective.

Resume: :meth:`state_dict` is the loader's state at the start of the current pool plus the
batches handed out from it; :meth:`load_state_dict` reads that pool again and skips them. On
another world size the interrupted pool is read whole again (its batches cut anew).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ...errors import UsageError
from ..ranks import agree
from .collate import collate, pad_sequences
from .pooled import PoolResume


def cut(lengths: np.ndarray, budget: int) -> list[int]:
    """Ends of batches over ascending ``lengths``, greedily: each batch's rows x longest within
    ``budget`` (a longer single sequence is a batch of its own)."""
    ends, start = [], 0
    for i in range(1, len(lengths) + 1):
        if i - start > 1 and (i - start) * int(lengths[i - 1]) > budget:
            ends.append(i - 1)
            start = i - 1
    ends.append(len(lengths))
    return ends


def cut_to(ends: list[int], count: int) -> list[int]:
    """``ends`` with its largest batches halved until there are ``count`` (never more than rows)."""
    ends = list(ends)
    while len(ends) < count:
        starts = [0] + ends[:-1]
        sizes = [e - s for s, e in zip(starts, ends)]
        j = int(np.argmax(sizes))
        if sizes[j] < 2:
            break
        ends.insert(j, starts[j] + sizes[j] // 2)
    return ends


class LengthBucketing(PoolResume):
    """Batches of ``dataset``'s samples sorted by the length of ``field``, within ``batch_tokens``.

    Args:
        dataset: a :class:`ShardDataset` whose samples hold a sequence ``field`` (a tensor, array or list).
        batch_tokens: the most padded tokens in a batch (rows x the longest sequence).
        window: the pool's size, the samples sorted together; larger pools pad less and mix less.
        field: the sequence field; batches hold it padded with ``padding_value``, with ``lengths``,
            ``attention_mask``, ``position_ids``, ``cu_seqlens`` and ``max_seqlen`` (see :meth:`batch`);
            the other fields are collated as usual.
        padding_value: the value that pads ``field`` to the longest sequence of a batch.
        num_workers: for ``dataset.loader``.
        loader_kwargs: other keywords for ``dataset.loader``.
    """

    def __init__(
        self,
        dataset: Any,
        batch_tokens: int,
        *,
        window: int = 512,
        field: str = "input_ids",
        padding_value: float = 0,
        num_workers: int | None = None,
        **loader_kwargs: Any,
    ):
        if batch_tokens < 1 or window < 1:
            raise UsageError(
                f"batch_tokens and window must be at least 1, not {batch_tokens} and {window}"
            )
        self.batch_tokens, self.window = int(batch_tokens), int(window)
        self.field, self.padding_value = field, padding_value
        dataset.collate_fn = list  # the loader hands over each pool's samples as they are
        self.dataset = dataset
        self.loader = dataset.loader(self.window, num_workers, **loader_kwargs)
        self._start: dict[str, Any] = self.loader.state_dict()
        self._emitted = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def batch(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """The padded batch, with ``lengths``, ``attention_mask``, and ``position_ids`` (0 .. length - 1 on
        each row, 1 on padding as transformers' convention has it), ``cu_seqlens`` and ``max_seqlen`` over
        the real tokens flattened: a sequence starts where a real token's position is 0."""
        padded, lengths, mask = pad_sequences([s[self.field] for s in samples], self.padding_value)
        rest = collate([{k: v for k, v in s.items() if k != self.field} for s in samples])
        positions = torch.arange(padded.shape[1]).expand(len(samples), -1).masked_fill(~mask, 1)
        cu = torch.zeros(int((lengths > 0).sum()) + 1, dtype=torch.int32)
        torch.cumsum(lengths[lengths > 0], 0, out=cu[1:])
        return {
            **rest,
            self.field: padded,
            "lengths": lengths,
            "attention_mask": mask,
            "position_ids": positions.contiguous(),
            "cu_seqlens": cu,
            "max_seqlen": int(lengths.max()),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        it = iter(self.loader)
        while True:
            start = self.loader.state_dict()
            pool: list[dict[str, Any]] | None = next(it, None)
            if pool is None:
                break
            if start != self._start:
                self._start, self._emitted = start, 0
            lengths = np.array([len(s[self.field]) for s in pool], np.int64)
            order = np.argsort(lengths, kind="stable")
            ends = cut(lengths[order], self.batch_tokens)
            ends = cut_to(ends, agree(len(ends), "max"))
            begin = 0
            for k, end in enumerate(ends):
                if k >= self._skip:
                    self._emitted = k + 1
                    yield self.batch([pool[i] for i in order[begin:end].tolist()])
                begin = end
            self._skip = 0
        self._start, self._emitted = self.loader.state_dict(), 0


__all__ = ["LengthBucketing", "cut", "cut_to"]
