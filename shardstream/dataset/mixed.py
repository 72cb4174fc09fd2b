"""``MixedDataset``: several datasets read as one, each by its weight, exactly and resumably.

The mix's epoch is ``samples_per_epoch`` positions; :mod:`shardstream.plan.mix` says which source
each position reads (exact quotas, every prefix in proportion) and which item of that source's
endless stream of passes it is. From there the mix is a dataset like any other: ranks get equal
spans of its order, workers get batch-size chunks, and ``state_dict()`` is the same few integers,
so it resumes with another world size or number of workers. Each source keeps its own decode,
transform, fields, shuffle and storage; the mix owns the split over ranks and workers. Every
sample (and batch) carries ``__source__``, the index of the source it came from.

With ``batching="per_source"`` the unit of the plan is a batch (:mod:`shardstream.plan.batch_mix`):
every batch holds ``batch_size`` samples of one source, the sources take turns by their weights,
and ranks, workers and resume states count batches.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np

from .. import plan
from ..errors import UsageError
from ..manifest.labels import read_labels
from ..plan.batch_mix import BatchSchedule, expand
from ..plan.mix import MixSchedule, quotas, stream_items
from .base import PassRun, PlannedDataset, ReadSettings
from .batches.collate import collate
from .counters import StageCounters
from .mix.batches import check_fields, gather_mapped, merge_tokens, tag
from .mix.prefetch import SourcePrefetch
from .mix.weights import label_weights, source_weights
from .parallel import Parallel
from .shard_dataset import ShardDataset
from .tokens import TokenDataset

# a chunk reaches at most two passes of a source (the end of one, the start of the next)
_PASSES_KEPT = 2


class MixCounters:
    """The stage counters of every source, and the mix's own collate time, as one table."""

    def __init__(self, sources: Sequence[ShardDataset]):
        self.sources = tuple(sources)
        self.own = StageCounters()

    def add(self, **counts: int) -> None:
        self.own.add(**counts)

    def totals(self) -> dict[str, int]:
        parts = [s.counters.totals() for s in self.sources]
        out = self.own.totals()
        for part in parts:
            for name, value in part.items():
                if name not in ("skip_shard", "skip_sample"):
                    out[name] += value
        out["skip_shard"] = out["skip_sample"] = -1  # a mix's skipped samples are each source's own
        return out


class MixedDataset(PlannedDataset):
    """Read several datasets as one stream, each source in its exact proportion.

    Args:
        sources: :class:`ShardDataset` objects, or :class:`TokenDataset` objects of one ``seq_len``
            for a token mix. Each keeps its decode, transform, fields, shuffle and storage
            settings; their rank, world size and ``drop_last`` are the mix's.
        weights: relative weights, normalised (default: the sources' sizes, a shuffled interleave
            of all of them). For token sources they weigh tokens too (every sample is ``seq_len``).
        samples_per_epoch: positions per epoch (default: the sum of the sources' sizes). Source
            ``i`` gives exactly ``floor`` or ``ceil`` of ``w_i * samples_per_epoch`` per epoch,
            reading its own passes endlessly: an upsampled source repeats, a downsampled one goes
            on in the next epoch where it stopped.
        seed: varies every source's passes (with each source's own seed); seed 0 reads pass ``k``
            of a source in the order that source alone would read its epoch ``k``.
        drop_last: as for :class:`ShardDataset`.
        rank: as for :class:`ShardDataset`.
        world_size: as for :class:`ShardDataset`.
        parallel: as for :class:`ShardDataset`.
        collate_fn: makes a batch from sample dicts (default: :func:`shardstream.dataset.batches.collate.collate`).
        batching: ``"mixed"`` (default: sources mixed sample by sample, inside batches too) or
            ``"per_source"``: each batch of ``batch_size`` samples comes from one source, and batches
            (not samples) are dealt to the sources by their weights, exactly per epoch and within one
            batch in every prefix. The epoch is then ``samples_per_epoch // batch_size`` batches;
            ``len(mix)`` counts batches, and ``mix.loader(batch_size)`` takes the same ``batch_size``.
        batch_size: samples per batch, for ``batching="per_source"`` only.
    """

    def __init__(  # noqa: PLR0913 - keyword settings with defaults, as ShardDataset's
        self,
        sources: Sequence[ShardDataset | TokenDataset],
        weights: Sequence[float] | None = None,
        *,
        samples_per_epoch: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        parallel: Parallel | None = None,
        batching: str = "mixed",
        batch_size: int | None = None,
    ):
        sources = tuple(sources) if not isinstance(sources, PlannedDataset) else (sources,)
        if not sources:
            raise UsageError("MixedDataset needs at least one source")
        for i, s in enumerate(sources):
            if not isinstance(s, (ShardDataset, TokenDataset)):
                raise TypeError(
                    f"source {i} of the mix is a {type(s).__name__}; give ShardDataset or TokenDataset "
                    "objects (a mix of mixes: list their sources with the product of the weights)"
                )
        tokens = [isinstance(s, TokenDataset) for s in sources]
        if any(tokens) and not all(tokens):
            raise UsageError(
                f"source {tokens.index(not tokens[0])} of the mix is {'not ' if tokens[0] else ''}a "
                "TokenDataset while source 0 is"
                + ("" if tokens[0] else " not")
                + "; a batch cannot hold token windows and other samples: mix them separately"
            )
        if all(tokens) and len({s.seq_len for s in sources}) > 1:
            lengths = [s.seq_len for s in sources]
            raise UsageError(
                f"the token sources of the mix have seq_len {lengths}; give every source the same "
                "seq_len (a batch stacks their windows)"
            )
        w = source_weights(sources, weights)
        total = (
            sum(s.num_samples for s in sources) if samples_per_epoch is None else samples_per_epoch
        )
        if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < 1:
            raise UsageError(
                f"samples_per_epoch must be a number of samples (1 or more), not {samples_per_epoch!r}"
            )
        schedule, units = _schedule(w, int(total), batching, batch_size)
        q = schedule.quota
        key = {"sources": [_source_key(s) for s in sources], "quota": q.tolist()}
        if batching == "per_source":
            key["batch_size"] = int(schedule.batch_size)
        per_sample = [s.manifest.total_bytes / max(s.num_samples, 1) for s in sources]
        # what the mix is, set once
        self.sources, self.weights, self.quota, self.schedule = sources, w, q, schedule
        self.tokens, self.batching = all(tokens), batching
        self.unit = 1 if batching == "mixed" else int(schedule.batch_size)
        self._units_per_epoch = units
        self._bytes_per_epoch = int(sum(b * n for b, n in zip(per_sample, q)))
        self._mix_fingerprint = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        self._settings = ReadSettings(
            seed=int(seed), window=1, drop_last=bool(drop_last), collate_fn=collate_fn or collate
        )
        self._counters = MixCounters(sources)
        self._start_planning(rank, world_size, None, parallel)

    @classmethod
    def by_label(
        cls,
        labels: str | os.PathLike[str] | Mapping[Any, str | ShardDataset],
        weights: str | Mapping[Any, float] | None = "balanced",
        *,
        samples_per_epoch: int | None = None,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataset_kwargs: Any,
    ) -> MixedDataset:
        """Class-balanced (or any per-label weighted) sampling of one dataset split by label.

        Args:
            labels: a split pack (``pack --split-by cls``: one dataset per class and ``_labels.json``),
                or a ``{label: url or ShardDataset}`` mapping.
            weights: ``"balanced"`` (every label equally often), ``"sqrt"`` (in proportion to the
                square root of each label's size), ``None`` (its size: the dataset as it is), or a
                ``{label: weight}`` mapping naming every label (0 leaves one out).
            samples_per_epoch: default: the samples of all labels together, so an epoch is as long as
                the dataset; rare labels repeat (each sample before any a third time) and common
                ones go on in the next epoch where they stopped.
            dataset_kwargs: for each label's :class:`ShardDataset` (``decode``, ``transform``, ...).
        """
        if isinstance(labels, (str, os.PathLike)):
            options = dataset_kwargs.get("storage_options")
            store, index = read_labels(
                os.fspath(labels), options if isinstance(options, dict) else None
            )
            named: dict[Any, Any] = {e.name: f"{store.url}/{e.path}" for e in index.labels}
        else:
            named = dict(labels)
        if not named:
            raise UsageError("by_label needs at least one label")
        sources = [
            v if isinstance(v, ShardDataset) else ShardDataset(v, **dataset_kwargs)
            for v in named.values()
        ]
        w = label_weights(list(named), sources, weights)
        mix = cls(
            sources,
            w,
            samples_per_epoch=samples_per_epoch,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
            collate_fn=collate_fn,
        )
        mix.labels = list(named)
        return mix

    # -- what the plan reads, and what a loader needs to know -----------------------------------------
    @property
    def num_samples(self) -> int:
        """Positions of one epoch in the plan: ``samples_per_epoch``, or with ``batching="per_source"``
        the epoch's batches."""
        return self._units_per_epoch

    @property
    def samples_per_epoch(self) -> int:
        """Samples of one epoch (all ranks together)."""
        return int(self.quota.sum())

    def loader(
        self, batch_size: int, num_workers: int | None = None, **dataloader_kwargs: Any
    ) -> Any:
        """A :class:`~shardstream.loader.ShardLoader` over this mix (with ``batching="per_source"``,
        ``batch_size`` must be the mix's: the plan's unit is then one batch)."""
        if self.batching == "mixed":
            return super().loader(batch_size, num_workers, **dataloader_kwargs)
        if batch_size != self.unit:
            raise UsageError(
                f"this mix makes per-source batches of {self.unit} samples (MixedDataset(..., "
                f"batch_size={self.unit})); its loader takes batch_size={self.unit}, not {batch_size}"
            )
        return super().loader(1, num_workers, **dataloader_kwargs)

    @property
    def fingerprint(self) -> str:
        """A sha256 over every source's order key and the quotas: what fixes the mix's order."""
        return self._mix_fingerprint

    @property
    def replaces_failures(self) -> bool:
        """Some source replaces its failing samples (``on_error="skip"``)."""
        return any(s.replaces_failures for s in self.sources)

    @property
    def mapped(self) -> bool:
        """Every source's raw batches travel as locations in local shard files, so the mix's do too."""
        return not self.tokens and self.default_collate and all(s.mapped for s in self.sources)

    @property
    def default_collate(self) -> bool:
        return self.tokens or self.collate_fn is collate

    @property
    def sizes(self) -> list[int]:
        """Samples in each source (in a pass of it)."""
        return [s.num_samples for s in self.sources]

    @property
    def counters(self) -> MixCounters:
        """The sources' stage counters and the mix's own collate time."""
        return self._counters

    @property
    def skipped(self) -> int:
        """Samples the sources replaced under ``on_error="skip"`` (each source's own count, summed)."""
        return sum(s.skipped for s in self.sources)

    @skipped.setter
    def skipped(self, value: int) -> None:
        for s in self.sources:
            s.skipped = 0
        if value:
            raise UsageError("a mix's skipped count can only be reset to 0")

    def describe(self, shard: int, sample: int) -> str:
        return f"sample {sample} of source {shard} of the mix"

    def batch_bytes(self, samples: int) -> int:
        """Stored bytes of ``samples`` positions, by the sources' sizes in their quotas."""
        return int(self._bytes_per_epoch / max(self.samples_per_epoch, 1) * samples * self.unit)

    def worker_parts(self) -> dict[str, Any]:
        parts: dict[str, Any] = {}
        for i, s in enumerate(self.sources):
            parts.update(
                {f"{label} of source {i}": part for label, part in s.worker_parts().items()}
            )
        if not self.default_collate:
            parts["the mix's collate_fn"] = self.collate_fn
        return parts

    # -- reading ------------------------------------------------------------------------------
    def read_pass(self, run: PassRun) -> Iterator[Any]:
        batched = self.batch_size is not None
        reader = MixReader(self, run.position.epoch, batched)

        def located() -> Iterator[tuple[np.ndarray, list[Any]]]:
            for units in run.positions():
                positions = units if self.unit == 1 else expand(units, self.unit)
                yield positions, list(reader.locate(positions))

        prefetch = SourcePrefetch(self.sources, reader.shards)
        try:
            for positions, parts in prefetch.ahead(located()):
                run.reseed_for(int(positions[0]))
                if not batched:
                    yield from reader.samples(len(positions), parts)
                elif self.mapped and (found := reader.mapped(len(positions), parts)) is not None:
                    yield found
                else:
                    yield run.emit(functools.partial(reader.batch, len(positions), parts))
        finally:
            prefetch.close()


def _schedule(
    weights: np.ndarray, total: int, batching: str, batch_size: int | None
) -> tuple[MixSchedule | BatchSchedule, int]:
    """The epoch's schedule, and its positions in the plan (samples, or batches per source)."""
    if batching == "mixed":
        if batch_size is not None:
            raise UsageError(
                "MixedDataset takes batch_size= only with batching='per_source'; a sample mix takes "
                "its batch size from its loader"
            )
        return MixSchedule.create(quotas(weights, total)), total
    if batching != "per_source":
        raise UsageError(f"batching must be 'mixed' or 'per_source', not {batching!r}")
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, (int, np.integer))
        or batch_size < 1
    ):
        raise UsageError(
            f"batching='per_source' needs batch_size= (samples per batch, 1 or more), not {batch_size!r}"
        )
    if total < batch_size:
        raise UsageError(
            f"samples_per_epoch {total} is less than one batch of {batch_size}; an epoch of "
            "per-source batches holds whole batches"
        )
    batches = total // int(batch_size)
    return BatchSchedule.create(weights, batches, int(batch_size)), batches


def _source_key(s: ShardDataset | TokenDataset) -> dict[str, Any]:
    """What fixes a source's passes: its manifest, seed, shuffle, window (and seq_len)."""
    k = s.order_key()
    return {
        "fingerprint": k.fingerprint,
        "seed": k.seed,
        "shuffle": k.shuffle,
        "window": k.window,
        "samples": k.num_samples,
        "seq_len": s.seq_len if isinstance(s, TokenDataset) else None,
    }


class MixReader:
    """One pass of a mix in one process: positions -> the sources' samples, in the mix's order."""

    def __init__(self, mix: MixedDataset, epoch: int, batched: bool):
        self.mix, self.epoch, self.batched = mix, int(epoch), batched
        self.orders: dict[tuple[int, int], plan.EpochOrder] = {}
        self.shards = [None if mix.tokens else s.open_shards() for s in mix.sources]
        for s, shards in zip(mix.sources, self.shards):
            if shards is not None:
                shards.forget_failures()
                s.sample_reader.begin(s.decoder, s.transform, s.on_error, s.raw)
        self.fields: dict[int, dict[str, str]] = {}
        self.live = np.flatnonzero(mix.quota).tolist()
        self.paths: dict[tuple[int, int], str] = {}

    def path_of(self, i: int, shard: int) -> str:
        """The file of shard ``shard`` of source ``i`` (mapped batches name it)."""
        found = self.paths.get((i, shard))
        if found is None:
            s = self.mix.sources[i]
            found = self.paths[(i, shard)] = s.store.path(s.manifest.paths[shard])
        return found

    def _order(self, i: int, passed: int) -> plan.EpochOrder:
        found = self.orders.get((i, passed))
        if found is None:
            s = self.mix.sources[i]
            seed = s.seed + (self.mix.seed << 32)
            found = plan.EpochOrder.create(
                s.sample_set.per_shard, seed, passed, s.shuffle, s.window
            )
            stale = [key for key in self.orders if key[0] == i and key[1] <= passed - _PASSES_KEPT]
            for key in stale:
                del self.orders[key]
            self.orders[(i, passed)] = found
        return found

    def locate(
        self, positions: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(source, rows of ``positions`` it holds, their shards, their stored offsets in them), per source
        (each source's sample set maps the plan's offsets: a split's selection)."""
        for i, rows, ids, offsets in self._planned(positions):
            yield i, rows, ids, self.mix.sources[i].sample_set.stored_rows(ids, offsets)

    def _planned(
        self, positions: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(source, rows of ``positions`` it holds, their shards, their offsets in the source's plan)."""
        src, index = self.mix.schedule.locate(positions)
        for i in self.live:
            rows = np.flatnonzero(src == i)
            if not len(rows):
                continue
            s = self.mix.sources[i]
            passes, items = stream_items(
                self.epoch, int(self.mix.quota[i]), s.num_samples, index[rows]
            )
            # (padding wraps to the epoch's start)
            first, last = (
                int(passes.min()),
                int(passes.max()),
            )
            if first == last:  # one pass: the usual case
                yield i, rows, *self._order(i, first).samples(items)
                continue
            ids, offsets = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
            for passed in range(first, last + 1):
                m = passes == passed
                ids[m], offsets[m] = self._order(i, passed).samples(items[m])
            yield i, rows, ids, offsets

    def _load(self, i: int, ids: np.ndarray, offsets: np.ndarray) -> list[Any]:
        s = self.mix.sources[i]
        if self.mix.tokens:
            batch = s.samples_at(ids, offsets)
            return [
                {k: batch[k][r] for k in ("input_ids", "labels", "position_ids")}
                for r in range(len(ids))
            ]
        return s.sample_reader.load(self.shards[i], ids, offsets, self.batched)

    def samples(self, n: int, located: list[Any]) -> list[Any]:
        """The ``n`` samples that ``located`` (:meth:`locate`'s parts) places, in order, each with ``__source__``."""
        out: list[Any] = [None] * n
        for i, rows, ids, offsets in located:
            for r, sample in zip(rows.tolist(), self._load(i, ids, offsets)):
                out[r] = tag(sample, i, self.mix.sources[i])
        return out

    def batch(self, n: int, located: list[Any]) -> Any:
        """A collated batch of the ``n`` located samples (``__source__`` a tensor of source indices)."""
        if self.mix.tokens:
            parts = [
                (rows, self.mix.sources[i].samples_at(ids, offsets), i)
                for i, rows, ids, offsets in located
            ]
            return merge_tokens(parts, n)
        samples = self.samples(n, located)
        if self.mix.default_collate:
            check_fields(samples, self.fields, self.mix.sources)
        started = perf_counter_ns()
        batch = self.mix.collate_fn(samples)
        self.mix.counters.add(collate_ns=perf_counter_ns() - started)
        return batch

    def mapped(self, n: int, located: list[Any]) -> dict[str, Any] | None:
        """Raw bytes of local tar sources as locations in their files (None: take the general path)."""
        parts = [
            (rows, self.mix.sources[i], self.shards[i], ids, offsets, i)
            for i, rows, ids, offsets in located
        ]
        return gather_mapped(parts, n, self.path_of)


__all__ = ["MixReader", "MixedDataset"]
