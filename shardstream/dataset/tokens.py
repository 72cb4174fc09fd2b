"""``TokenDataset``: fixed-length windows over token shards, for causal language-model training.

Shard ``s`` of ``n_s`` tokens holds ``(n_s - 1) // seq_len`` windows; window ``j`` is tokens
``[j * seq_len, (j + 1) * seq_len + 1)``. Windows overlap by one token, so within a shard every
token but the first is a label exactly once per epoch; what cannot fill a last window (fewer
than ``seq_len`` tokens per shard) is left out. Windows are the plan's samples (its per-shard
counts), so shuffling, the split over ranks and workers, ``len()``, ``state_dict()`` and resuming
on another world size are those of every :class:`~shardstream.dataset.base.PlannedDataset`.
Shards are read in place: memory maps of local files, or of the disk cache for remote ones.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import CorruptShardError, UsageError
from ..formats.tokens import TokenShard
from ..manifest.sample_set import SampleSet, samples_of
from ..manifest.token_stats import shard_tokens
from ..storage import ShardFetcher
from ..storage.settings import DEFAULT, StorageSettings
from .base import Fixed, PassRun, PlannedDataset, ReadSettings, Setting
from .batches.collate import empty_batch_tensor
from .contract import Counters
from .counters import StageCounters
from .parallel import Parallel
from .shard_pass import ShardPass, StoredDataset, open_stored
from .shards.readers import OpenShards, window_span
from .state import resolve_window

_CHUNK_BYTES = 4 << 20
TOKEN_FIELDS = ("input_ids", "labels", "position_ids")
IGNORE_INDEX = -100  # labels the loss skips (torch.nn.CrossEntropyLoss's default ignore_index)
_LOWEST = np.iinfo(np.int64).min


class TokenShards(OpenShards):
    """The token shards a process has open: views of their memory maps, nothing decoded."""

    def __init__(self, store: Any, manifest: Any, per_shard: np.ndarray, fetcher: ShardFetcher):
        super().__init__(store, manifest, fetcher=fetcher)
        self.per_shard = per_shard

    def fit_window(self, window: int) -> None:
        self.capacity = max(16, 2 * window_span(self.per_shard, window) + 1)

    def _load(self, shard: int) -> TokenShard:
        m = self.manifest
        name = self.store.url_of(m.paths[shard])
        data = self.fetcher.fetch(shard)
        if len(data) != m.nbytes[shard]:
            raise CorruptShardError(
                f"{name}: {len(data)} bytes, the manifest says {m.nbytes[shard]}; the shard is "
                "truncated or was replaced, run 'shardstream verify'"
            )
        reader = TokenShard(data, name, m.tokens["dtype"], int(m.stored_counts[shard]))
        reader.owned = 0  # type: ignore[attr-defined]
        return reader


def token_window_positions(offsets: np.ndarray, start: int, length: int) -> np.ndarray:
    """The ``position_ids`` of tokens ``start .. start + length - 1`` as one row: 0 at the row's start and
    at every document start inside it, counting up in between (a sequence starts exactly where a
    position is 0, as ``cu_seqlens`` says; Megatron's ``reset_position_ids``)."""
    first = int(offsets.searchsorted(start, side="right"))
    last = int(offsets.searchsorted(start + length, side="left"))
    base = np.full(length, _LOWEST, np.int64)
    base[0] = 0
    inner = offsets[first:last] - start
    base[inner] = inner
    return np.arange(length) - np.maximum.accumulate(base)


def token_collate(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of token windows: stacked ``input_ids``, ``labels``, ``position_ids``, plus the
    ``cu_seqlens`` (int32, from 0) and ``max_seqlen`` of the documents over the flattened batch."""
    batch = {
        k: torch.stack([torch.as_tensor(s[k]) for s in samples])
        for k in ("input_ids", "labels", "position_ids")
    }
    batch.update(varlen_fields(batch["position_ids"].numpy()))
    return batch


def varlen_fields(position_ids: np.ndarray) -> dict[str, Any]:
    """``cu_seqlens`` and ``max_seqlen`` for rows of ``position_ids``: a sequence starts wherever a
    position is 0 (each row's start and each document start: :func:`token_window_positions`) and ends at the
    next start or the row's end, so ``cu_seqlens[:-1]`` are the flat indices of the zeros."""
    rows, length = position_ids.shape
    starts = position_ids == 0
    starts[:, 0] = True
    found = np.flatnonzero(starts.ravel())
    # in the transport's arena when a worker sends the batch
    cu = empty_batch_tensor((len(found) + 1,), torch.int32)
    cu_np = cu.numpy()
    cu_np[:-1] = found
    cu_np[-1] = rows * length
    return {"cu_seqlens": cu, "max_seqlen": int(np.diff(cu_np).max()) if rows else 0}


class TokenDataset(StoredDataset, PlannedDataset):
    """Stream windows of ``seq_len + 1`` tokens from a token dataset (``pack(..., format="tokens")``).

    Each sample holds ``input_ids`` (the first ``seq_len`` tokens), ``labels`` (the next token of
    each) and ``position_ids`` (0 at the window's start and at each document start inside it);
    batches from :meth:`loader` add ``cu_seqlens`` and ``max_seqlen`` for variable-length
    attention, starting a sequence exactly where ``position_ids`` is 0 (so Hugging Face's
    padding-free flash-attention path, which derives them from ``position_ids``, agrees).

    Args:
        url: a token dataset's folder or its ``_manifest.json`` (any fsspec URL).
        seq_len: tokens per sample.
        mask_across_documents: set ``labels`` to -100 where the target starts the next document.
        shuffle: as for :class:`ShardDataset`.
        seed: as for :class:`ShardDataset`.
        shuffle_window: as for :class:`ShardDataset`, counted in windows.
        drop_last: as for :class:`ShardDataset`, but True by default here, so that no rank repeats
            windows.
        rank: as for :class:`ShardDataset`.
        world_size: as for :class:`ShardDataset`.
        parallel: as for :class:`ShardDataset`.
        verify_checksums: as for :class:`ShardDataset`.
        storage: as for :class:`ShardDataset`.
        storage_options: as for :class:`ShardDataset`.
        cache_dir: as for :class:`ShardDataset`.
        cache_limit: as for :class:`ShardDataset`.
        prefetch: as for :class:`ShardDataset`.
        retries: as for :class:`ShardDataset`.
        timeout: as for :class:`ShardDataset`.
        version: as for :class:`ShardDataset`: the dataset's version to read (default: the latest).
    """

    verify_checksums = Setting()

    def __init__(  # noqa: PLR0913 - keyword settings with defaults, as ShardDataset's
        self,
        url: str | os.PathLike[str],
        seq_len: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_window: int | None = None,
        drop_last: bool = True,
        mask_across_documents: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        parallel: Parallel | None = None,
        verify_checksums: bool = False,
        storage: StorageSettings | None = None,
        storage_options: dict[str, Any] | None = DEFAULT,
        cache_dir: str | os.PathLike[str] | None = DEFAULT,
        cache_limit: int | str | None = DEFAULT,
        prefetch: int | str = DEFAULT,
        retries: int = DEFAULT,
        timeout: float | None = DEFAULT,
        version: int | None = None,
    ):
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or seq_len < 1:
            raise UsageError(f"seq_len must be a number of tokens (1 or more), not {seq_len!r}")
        storage = StorageSettings.combine(
            storage,
            options=storage_options,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            prefetch=prefetch,
            retries=retries,
            timeout=timeout,
        )
        self._stored = open_stored(url, storage, version)
        tokens = self.manifest
        if tokens.shard_format != "tokens":
            raise UsageError(
                f"{self.store.url} holds {tokens.shard_format} shards, not tokens; read it with "
                "ShardDataset, or pack text with format='tokens'"
            )
        self._seq_len = int(seq_len)
        windows = samples_of(tokens, self.seq_len)
        if not windows.total:
            per_shard = shard_tokens(tokens)
            raise UsageError(
                f"{self.store.url}: seq_len {self.seq_len} is larger than every shard (the largest "
                f"holds {int(per_shard.max())} tokens); use a seq_len below that, or pack larger shards"
            )
        self._windows = windows  # the plan's samples
        self._settings = ReadSettings(
            shuffle=shuffle,
            seed=int(seed),
            window=resolve_window(
                shuffle_window, windows.per_shard, tokens.nbytes, remote=not self.store.local
            ),
            drop_last=drop_last,
            collate_fn=token_collate,
            verify_checksums=bool(verify_checksums),
        )
        self.mask_across_documents = bool(mask_across_documents)
        self._counters = StageCounters()
        self._start_planning(rank, world_size, None, parallel)

    # -- where it reads from, and what the plan reads ----------------------------------------------
    @Fixed
    def sample_set(self) -> SampleSet:
        """The dataset's samples: each shard's windows of ``seq_len + 1`` tokens."""
        return self._windows

    @Fixed
    def seq_len(self) -> int:
        """Tokens per sample (fixed when the dataset is made: the plan's samples are its windows)."""
        return self._seq_len

    @property
    def num_samples(self) -> int:
        """Windows in one epoch (before the split over ranks)."""
        return self.sample_set.total

    @property
    def fingerprint(self) -> str:
        """The manifest's fingerprint with windows as each shard's samples (another seq_len differs)."""
        view = copy.copy(self.manifest)
        view.stored_counts = self.sample_set.per_shard
        return view.fingerprint

    @property
    def tail_tokens(self) -> int:
        """Tokens that are no label in an epoch: each shard's first token, and what cannot fill its last
        window (fewer than ``seq_len`` per shard)."""
        return int(self.manifest.tokens["total"] - self.num_samples * self.seq_len)

    @property
    def tokens_per_sample(self) -> int:
        """Labels per sample (``seq_len``): the unit of a token-weighted mix."""
        return self.seq_len

    # -- what a loader needs to know ---------------------------------------------------------------
    @property
    def default_collate(self) -> bool:
        """Batches are made here, in tensors a worker's transport sends cheaply (as :func:`collate`'s are)."""
        return True

    @property
    def counters(self) -> Counters:
        return self._counters

    @property
    def skipped(self) -> int:
        """Token windows are never skipped (a shard that fails raises)."""
        return 0

    @skipped.setter
    def skipped(self, value: int) -> None:
        if value:
            raise UsageError("a TokenDataset's skipped count can only be reset to 0")

    def describe(self, shard: int, sample: int) -> str:
        return f"{self.store.url_of(self.manifest.paths[shard])} window {sample}"

    def batch_bytes(self, samples: int) -> int:
        """Stored bytes of ``samples`` windows (the token shards' bytes per window)."""
        return int(self.manifest.total_bytes / max(self.num_samples, 1) * samples)

    def threads_win(self, num_workers: int) -> bool:
        """Never (``workers="auto"`` reads token windows in worker processes): a batch of windows is small
        numpy calls that hold the GIL, so a reader thread competes with the training loop for it. On a
        quiet 2-core machine a whole 5.5 M-token epoch (``benchmarks/tokens.py --docs 20000``, medians of
        5 alternating rounds) read at 1.10x nanoGPT's loop with one worker process and 0.68x with one
        reader thread."""
        return False

    def batches_per_chunk(self, batch_size: int, num_workers: int) -> int:
        """Batches a worker makes and sends at once (about 4 MB of tensors): a batch of windows is cheap
        to make and dear to hand over, so workers send several and the loader cuts them apart."""
        if num_workers == 0:
            return 1
        per_batch = batch_size * self.seq_len * 8 * 3  # input_ids, labels, position_ids: int64
        return int(min(max(_CHUNK_BYTES // per_batch, 1), 16))

    def cut_chunk(self, chunk: dict[str, Any], size: int) -> list[dict[str, Any]]:
        """A chunk of windows cut into batches of ``size`` rows (views), each with its own ``cu_seqlens``."""
        rows = len(chunk["input_ids"])
        out = []
        for start in range(0, rows, size):
            part = {
                k: chunk[k][start : start + size] for k in ("input_ids", "labels", "position_ids")
            }
            part.update(varlen_fields(part["position_ids"].numpy()))
            out.append(part)
        return out

    # -- reading -----------------------------------------------------------------------------------
    def samples_at(self, ids: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:
        """A batch of the windows ``offsets`` of shards ``ids`` (plan samples), with ``cu_seqlens`` and
        ``max_seqlen``: how a mix of sources reads this one."""
        batch: dict[str, Any] = self.windows(
            self.open_shards(), np.asarray(ids), np.asarray(offsets)
        )
        batch.update(varlen_fields(batch["position_ids"].numpy()))
        return batch

    def open_shards(self) -> TokenShards:
        """The token shards this process has open (made once per process, and again if
        ``verify_checksums`` changed)."""
        verify, shards = self._local.shards or (None, None)
        if shards is None or verify != self.verify_checksums:
            fetcher = ShardFetcher(
                self.store, self.manifest, self.disk_cache, verify_local=self.verify_checksums
            )
            shards = TokenShards(self.store, self.manifest, self.sample_set.per_shard, fetcher)
            self._local.shards = (self.verify_checksums, shards)
        shards.fit_window(self.window if self.shuffle else 1)
        return shards

    def read_pass(self, run: PassRun) -> Iterator[Any]:
        shards = self.open_shards()
        shards.forget_failures()
        with ShardPass(
            run,
            self.sample_set,
            shuffle=self.shuffle,
            window=self.window,
            shards=shards,
            stored=self.stored,
            look_ahead=True,
        ) as pass_:
            for _, ids, offsets in pass_.chunks():
                if self.batch_size is None:
                    yield {k: v[0] for k, v in self.windows(shards, ids, offsets).items()}
                else:
                    yield run.emit(functools.partial(self._batch, shards, ids, offsets))

    def _batch(self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:
        batch = self.windows(shards, ids, offsets)
        batch.update(varlen_fields(batch["position_ids"].numpy()))
        return batch

    def windows(
        self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray
    ) -> dict[str, torch.Tensor]:
        """The windows ``offsets`` of shards ``ids`` as ``input_ids``, ``labels`` and ``position_ids`` rows:
        each shard's rows gathered in one step from a strided view of its windows."""
        length, rows = self.seq_len, len(ids)
        span = length + 1
        out = {name: empty_batch_tensor((rows, length), torch.int64) for name in TOKEN_FIELDS}
        inputs, labels, positions = (t.numpy() for t in out.values())
        # positions: 0 at each row's start and at each document start inside it (see token_window_positions)
        base = np.full((rows, span), _LOWEST, np.int64)
        base[:, 0] = 0
        for shard, where in _by_shard(ids):
            reader = shards.get(shard)
            picked = offsets[where]
            # (rows of this shard, span), in the shard's dtype
            taken = _window_view(reader, length)[picked]
            inputs[where] = taken[:, :-1]
            labels[where] = taken[:, 1:]
            starts = picked * length
            doc = reader.offsets
            first = doc.searchsorted(starts, side="right")
            counts = doc.searchsorted(starts + span, side="left") - first
            total = int(counts.sum())
            if total:  # the document starts inside each row, as columns of its row
                ends = np.cumsum(counts)
                inner = np.arange(total) + np.repeat(first - (ends - counts), counts)
                cols = doc[inner] - np.repeat(starts, counts)
                base[np.repeat(np.arange(rows)[where], counts), cols] = cols
        counted = np.arange(span) - np.maximum.accumulate(base, axis=1)
        positions[:] = counted[:, :-1]
        if self.mask_across_documents:
            labels[counted[:, 1:] == 0] = IGNORE_INDEX
        return out


def _by_shard(ids: np.ndarray) -> list[tuple[int, Any]]:
    """The rows of each shard in ``ids``: one slice of all rows when they share a shard (the usual
    batch), else each shard's row indices."""
    if not len(ids):
        return []
    first = ids[0]
    if (ids == first).all():
        return [(int(first), slice(None))]
    return [(int(shard), np.flatnonzero(ids == shard)) for shard in np.unique(ids)]


def _window_view(reader: TokenShard, length: int) -> np.ndarray:
    """Shard ``reader``'s windows of ``length + 1`` tokens as rows of one strided view (window ``j``
    starts at token ``j * length``; no copy), made once per open shard and length."""
    found = reader.__dict__.get("window_view")
    if found is not None and found[0] == length:
        return found[1]
    tokens = reader.tokens
    count = max((len(tokens) - 1) // length, 0)
    step = tokens.strides[0]
    view = np.lib.stride_tricks.as_strided(
        tokens, shape=(count, length + 1), strides=(length * step, step), writeable=False
    )
    reader.window_view = (length, view)  # type: ignore[attr-defined]
    return view


__all__ = [
    "IGNORE_INDEX",
    "TokenDataset",
    "token_collate",
    "varlen_fields",
    "token_window_positions",
]
