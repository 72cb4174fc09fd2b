"""Samples and batches from open shards: decode, transform, skip what fails, or take raw bytes.

Three ways to a batch, fastest first: raw bytes of local tars as locations in the shard files
(:class:`MappedBytes`, nothing copied); Arrow rows gathered by ``take`` into columns (no
per-row Python); and sample by sample, decoded and transformed, for ``collate`` to stack.

Under ``on_error="skip"`` every way replaces a sample that fails to load or decode by the last
good one (so every rank still yields ``len(ds)`` samples), counts it in shared memory
(:class:`SkipCount`, so the main process sees its workers' skips) and logs once per shard.
An exception raised by the user's transform is an error in code, not in data: it raises
:class:`TransformError` whatever ``on_error`` says.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from time import perf_counter_ns
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from ...errors import CorruptSampleError, ShardstreamError, TransformError, UsageError, sample_name
from ...formats import checksums as checksums_format
from ...manifest import Manifest
from ...manifest.relabel import LABEL_FIELD
from ...manifest.sample_set import SampleSet
from ...storage import Store
from ..batches.collate import MappedBytes
from ..batches.shared_memory import shared_zeros
from ..counters import StageCounters
from ..shards.mapped import Expected
from ..shards.readers import OpenShards
from .decode import Decoder, PendingJpeg

log = logging.getLogger("shardstream")

# DataLoader workers with their own count (more share slots, and may lose a count)
_WORKER_SLOTS = 256
_CLAIMS = 64  # shards a process can mark "reported" for the others at once
_CLAIM_MS = 60_000  # how long a report keeps other processes from reporting the same shard
_LINES_PER_PASS = 20  # per process: shards logged in one pass; the rest are only counted


class SkipCount:
    """Samples skipped by one dataset in every process that reads it, in a small shared table.

    Each process adds to a slot of its own (the main process, or DataLoader worker ``i``), so
    none overwrites another's; :attr:`total` sums them, in any process. :meth:`claim` lets the
    first process that meets a failing shard report it while the rank's other workers (which
    read other batches of the same shard) stay quiet.
    """

    def __init__(self) -> None:
        # [0] what `total = v` subtracts, [1] the main process, [2:2+W] workers, then claims (shard+1, slot, ms)
        self.table = shared_zeros(2 + _WORKER_SLOTS + 3 * _CLAIMS)

    @staticmethod
    def slot() -> int:
        info = get_worker_info()
        return 1 if info is None else 2 + info.id % _WORKER_SLOTS

    def add(self, n: int) -> None:
        self.table.numpy()[self.slot()] += n

    @property
    def total(self) -> int:
        counts = self.table.numpy()
        return int(counts[1 : 2 + _WORKER_SLOTS].sum() - counts[0])

    @total.setter
    def total(self, value: int) -> None:
        counts = self.table.numpy()
        counts[0] = counts[1 : 2 + _WORKER_SLOTS].sum() - int(value)

    def claim(self, shard: int) -> bool:
        """Whether this process may report ``shard``: no other did in the last minute."""
        entry = self.table.numpy()[2 + _WORKER_SLOTS :].reshape(_CLAIMS, 3)[shard % _CLAIMS]
        now, slot = int(time.time() * 1000), self.slot()
        if entry[0] == shard + 1 and entry[1] != slot and now - entry[2] < _CLAIM_MS:
            return False
        entry[:] = (shard + 1, slot, now)  # a race at worst gives a second line, never a lost count
        return True


Failures = dict[
    int, list[Any]
]  # shard -> [samples skipped in this batch, the first one's description]


class SampleReader:
    """Turns (shard, offset) pairs of the plan into samples, by the dataset's settings of this pass.

    ``on_error="skip"`` replaces a sample that fails with the last good one (so every rank
    still yields the same number), counts it in :attr:`skipped` and logs each failing shard
    once per pass (at most ``_LINES_PER_PASS`` shards per process).
    """

    def __init__(self, store: Store, samples: SampleSet):
        self.store, self.samples = store, samples
        self.decoder = Decoder(None)
        self.transform: Callable[[dict[str, Any]], Any] | None = None
        self.on_error = "raise"
        self.raw = True
        self.count = SkipCount()
        # stage times and counts of every process (shardstream.loader.stats)
        self.counters = StageCounters()
        self._decode_ns = self._transform_ns = 0  # this batch's so far (see account)
        self.candidates: Callable[[], Iterable[tuple[int, int]]] | None = None
        self.last_good: Any = None
        self.last_row: Any = None  # Arrow batch mode: the last good row, as a one-row table
        # shards this process reported (or chose not to) in this pass
        self._reported: set[int] = set()
        self._lines = 0

    @property
    def manifest(self) -> Manifest:
        """The manifest of the samples read."""
        return self.samples.manifest

    @property
    def skipped(self) -> int:
        """Samples replaced under ``on_error="skip"`` by every process reading this dataset."""
        return self.count.total

    @skipped.setter
    def skipped(self, value: int) -> None:
        self.count.total = value

    def begin(
        self,
        decoder: Decoder,
        transform: Callable[[dict[str, Any]], Any] | None,
        on_error: str,
        raw: bool,
        candidates: Callable[[], Iterable[tuple[int, int]]] | None = None,
        collated: bool = False,
    ) -> None:
        """Start a pass with the dataset's settings as they are now; ``candidates`` gives the rank's
        (shard, offset) pairs in order, to find a stand-in when samples fail before any good one.
        ``collated``: the default collate makes every batch of undecoded samples, so JPEGs can be
        decoded straight into it (unless a failure must be skipped sample by sample)."""
        self.decoder, self.transform, self.on_error = decoder, transform, on_error
        decoder.jpegs_into_batch = collated and on_error == "raise"
        self.raw = raw  # undecoded bytes, no transform: views of the shard's memory into the batch
        self.candidates = candidates
        self.last_good = self.last_row = None
        self._reported, self._lines = set(), 0

    def __getstate__(self) -> dict[str, Any]:
        # samples of this process stay here; the pass's candidates are a closure over its plan
        return {**self.__dict__, "last_good": None, "last_row": None, "candidates": None}

    def decode(self, shards: OpenShards, shard: int, offset: int, batched: bool) -> Any:
        """One sample, decoded and transformed (raw views when batches keep bytes)."""
        if self.raw and batched:
            # collated (copied once) before anyone else sees it
            return self.relabeled(shards.get(shard).views(offset), shard, offset)
        stored = self.relabeled(shards.get(shard).sample(offset), shard, offset)
        started = perf_counter_ns()
        sample = self.decoder(stored)
        decoded = perf_counter_ns()
        if self.decoder.jpegs_into_batch:  # JPEGs decoded by the collate: name them for its errors
            for name, value in sample.items():
                if type(value) is PendingJpeg:
                    value.where = (
                        f"field {name!r} of {sample_name(offset, stored.get('__key__'))} of "
                        f"{self.store.url_of(self.manifest.paths[shard])}"
                    )
        self._decode_ns += decoded - started
        if self.transform is None:
            return sample
        try:
            return self.transform(sample)
        except Exception as exc:
            key = sample.get("__key__") if isinstance(sample, dict) else None
            where = self.store.url_of(self.manifest.paths[shard])
            raise TransformError(
                f"the transform raised {type(exc).__name__} on {sample_name(offset, key)} "
                f"of {where}: {exc}; an error in the transform's code is not skipped by on_error='skip': "
                "fix the transform (or catch the error in it)"
            ) from exc
        finally:
            self._transform_ns += perf_counter_ns() - decoded

    def relabeled(self, stored: dict[str, Any], shard: int, offset: int) -> dict[str, Any]:
        """A stored sample with its label mapped to the dataset's class list (a merge's relabel)."""
        if not self.samples.relabels:
            return stored
        named = sample_name(offset, stored.get("__key__"))
        where = f"{named} of {self.store.url_of(self.manifest.paths[shard])}"
        return self.samples.labeled(stored, shard, where)

    def relabeled_rows(self, table: Any, shard: int, offset: int) -> Any:
        """Rows of shard ``shard`` (an Arrow table, the first at ``offset``) with their labels mapped."""
        relabel = self.samples.relabel
        if relabel is None or LABEL_FIELD not in table.column_names:
            return table
        import pyarrow as pa

        where = f"sample {offset}+ of {self.store.url_of(self.manifest.paths[shard])}"
        column = table.column(LABEL_FIELD)
        if column.null_count:
            values = [relabel.value(v, shard, where) for v in column.to_pylist()]
        else:
            values = relabel.labels(column.to_numpy(), shard, where)
        at = table.column_names.index(LABEL_FIELD)
        return table.set_column(at, table.field(at), pa.array(values, type=column.type))

    def load(
        self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray, batched: bool
    ) -> list[Any]:
        """The samples at (``ids``, ``offsets``); a failure raises naming shard and sample, or is skipped."""
        started = perf_counter_ns()
        shards.prepare(ids, offsets)
        out: list[Any] = []
        failed: Failures = {}
        for shard, offset in zip(ids.tolist(), offsets.tolist()):
            try:
                sample = self.decode(shards, shard, offset, batched)
            except UsageError:
                raise
            except Exception as exc:
                self._failure(shards, shard, offset, exc, failed)
                if self.last_good is None:
                    self.last_good = self._stand_in(lambda s, o: self.decode(shards, s, o, batched))
                out.append(self.last_good)  # equal length: repeat the last good sample
                continue
            out.append(sample)
            self.last_good = sample
        if failed:
            self._skipped(failed)
        self.account(shards, started, len(out))
        return out

    def load_mapped(
        self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray
    ) -> dict[str, Any] | None:
        """Raw bytes of a local tar batch as locations in the shard files (see MappedBytes), each value
        checked against its checksum where it is read (they carry the checksums); under skip, here, before
        the batch leaves. None if this batch cannot be put so (a field some samples lack, a shard that
        fails, under skip a value that differs from its checksum)."""
        started = perf_counter_ns()
        try:
            readers = [shards.get(int(s)) for s in ids]
        except Exception:
            return None  # the general path reports or skips it
        located = [r.locate(o) for r, o in zip(readers, offsets.tolist())]
        # a skip replaces the sample before the batch leaves: checked here (a second pass over the bytes);
        # else where each value is read, from the core's cache right after its copy (measured cheaper)
        here = self.on_error == "skip"
        if (
            here
            and checksums_format.CHECK_ON_READ
            and not all(
                r.intact(o, fields) for r, o, (_, fields) in zip(readers, offsets.tolist(), located)
            )
        ):
            return None  # the general path skips the damaged sample, naming it
        keys = [key for key, _ in located]
        entries = [fields for _, fields in located]
        names = entries[0].keys()
        if any(e.keys() != names for e in entries):
            return None
        used, local = np.unique(ids, return_inverse=True)
        paths = [self.store.path(self.manifest.paths[int(s)]) for s in used]
        batch: dict[str, Any] = {"__key__": keys}
        for name in names:
            spans = np.array([e[name] for e in entries], dtype=np.int64).reshape(-1, 2)
            batch[name] = MappedBytes(
                paths,
                local.astype(np.int32),
                spans[:, 0],
                spans[:, 1],
                [getattr(shards.get(int(s)), "identity", None) for s in used],
                None if here else _expected(readers, offsets, entries, keys, name),
            )
        self.account(shards, started, len(ids))
        return batch

    def load_columns(
        self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray
    ) -> dict[str, Any]:
        """Arrow batch mode: rows gathered with ``take`` per shard, columns to tensors, no per-row Python.
        Rows of a shard that fails are raised, or (skip) replaced by the last good row before them."""
        started = perf_counter_ns()
        table = None
        if (ids == ids[0]).all() and (np.diff(offsets) == 1).all():  # unshuffled: a zero-copy slice
            # a shard that fails: the general path raises or skips it
            with contextlib.suppress(Exception):
                table = shards.get(int(ids[0])).rows(int(offsets[0]), len(offsets))
                table = self.relabeled_rows(table, int(ids[0]), int(offsets[0]))
        if table is None:
            table = self._gather(shards, ids, offsets)
        if self.on_error == "skip":
            self.last_row = table.slice(len(offsets) - 1, 1)
        batch = {name: column_to_batch(table.column(name)) for name in table.column_names}
        self.account(shards, started, len(offsets))
        return batch

    def account(self, shards: OpenShards, started: int, samples: int) -> None:
        """Add a batch's counts and stage times: what decode and transform did not take was reading,
        except the time spent waiting for shards being downloaded."""
        waited, shards.waited_ns = getattr(shards, "waited_ns", 0), 0
        decode, transform, self._decode_ns, self._transform_ns = (
            self._decode_ns,
            self._transform_ns,
            0,
            0,
        )
        read = perf_counter_ns() - started - decode - transform - waited
        self.counters.add(
            samples=samples,
            wait_ns=waited,
            read_ns=max(read, 0),
            decode_ns=decode,
            transform_ns=transform,
        )

    def collate(self, collate_fn: Callable[[list[Any]], Any], samples: list[Any]) -> Any:
        """``collate_fn(samples)``, timed (JPEGs it decodes into the batch count as decoding)."""
        started, decoded = perf_counter_ns(), PendingJpeg.decode_ns
        try:
            return collate_fn(samples)
        finally:
            decoding = PendingJpeg.decode_ns - decoded
            self.counters.add(collate_ns=perf_counter_ns() - started - decoding, decode_ns=decoding)

    def _gather(self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray) -> Any:
        import pyarrow as pa

        pieces = []
        # each position's row in the pieces put end to end
        where = np.full(len(ids), -1, dtype=np.int64)
        at = 0
        failed: Failures = {}
        for shard in np.unique(ids).tolist():
            rows = np.flatnonzero(ids == shard)  # this shard's positions, in plan order
            try:
                reader = shards.get(shard)
                # rows whose values differ from their checksums: each fails alone
                damaged = reader.failures(offsets[rows])
                for k, exc in damaged:
                    self._failure(shards, shard, int(offsets[rows[k]]), exc, failed)
                rows = np.delete(rows, [k for k, _ in damaged])
                if not len(rows):
                    continue
                taken = reader.take(pa.array(offsets[rows]))
                pieces.append(self.relabeled_rows(taken, shard, int(offsets[rows[0]])))
            except Exception as exc:
                self._failure(shards, shard, int(offsets[rows[0]]), exc, failed, len(rows))
                continue
            where[rows] = np.arange(at, at + len(rows))
            at += len(rows)
        if failed:  # as sample by sample: each failed row takes the last good row before it
            fill = self.last_row
            if fill is None:
                fill = self._stand_in(
                    lambda s, o: self.relabeled_rows(shards.get(s).rows(o, 1), s, o)
                )
            pieces.append(fill)
            before = np.where(where >= 0, np.arange(len(where)), -1)
            np.maximum.accumulate(before, out=before)
            where = np.where(before >= 0, where[np.maximum(before, 0)], at)
            self._skipped(failed)
        return pa.concat_tables(pieces).take(pa.array(where))

    def _failure(
        self,
        shards: OpenShards,
        shard: int,
        offset: int,
        exc: Exception,
        failed: Failures,
        count: int = 1,
    ) -> None:
        """Raise ``exc`` again naming the shard and the sample, by key and position (the shard alone when it
        does not load) (``on_error="raise"``), or note it in ``failed``."""
        where = self.store.url_of(self.manifest.paths[shard])
        named = isinstance(exc, CorruptSampleError)  # it names the shard, the sample and the field
        if named and self.on_error == "raise":
            raise exc
        whole = not named and _fails(shards, shard)
        text = str(exc) if isinstance(exc, ShardstreamError) else f"{type(exc).__name__}: {exc}"
        text = text.removeprefix(f"{where}: ")  # the shard's own errors name it already
        detail = (
            text
            if whole or named
            else f"{sample_name(offset, shards.key_of(shard, offset))}: {text}"
        )
        if self.on_error == "raise":
            if isinstance(exc, ShardstreamError):
                raise type(exc)(f"{where}: {detail}") from exc
            raise ShardstreamError(f"{where}: {detail}") from exc
        self.counters.skipped(shard, offset)
        if shard not in failed:
            failed[shard] = [
                0,
                f"the shard does not load: {text}" if whole else f"the first, {detail}",
            ]
        failed[shard][0] += count

    def _skipped(self, failed: Failures) -> None:
        """Count a batch's skips (before the batch leaves this process) and log shards new to this pass."""
        self.count.add(sum(n for n, _ in failed.values()))
        for shard, (n, detail) in failed.items():
            if shard in self._reported:
                continue
            self._reported.add(shard)
            if self._lines >= _LINES_PER_PASS or not self.count.claim(shard):
                continue
            self._lines += 1
            more = (
                "; more shards fail in this pass: they are counted, not logged"
                if self._lines == _LINES_PER_PASS
                else ""
            )
            log.warning(
                "shard %d (%s): skipped %d sample%s: %s (later ones of this shard are counted, not "
                "logged: ds.skipped is %d)%s",
                shard,
                self.store.url_of(self.manifest.paths[shard]),
                n,
                "" if n == 1 else "s",
                detail,
                self.count.total,
                more,
            )

    def _stand_in(self, load_one: Callable[[int, int], Any]) -> Any:
        """The first sample of the rank's order that loads, for failures before any good sample."""
        first: Exception | None = None
        for shard, offset in self.candidates() if self.candidates is not None else ():
            try:
                return load_one(int(shard), int(offset))
            except UsageError:
                raise
            except Exception as exc:  # looking for any sample that loads
                first = first or exc
        raise ShardstreamError(
            f"no sample of this rank's part of {self.store.url} loads, so none can stand in "
            f"for those that fail (the first: {first}); run 'shardstream verify "
            f"{self.store.url}'"
        ) from first


def _expected(
    readers: list[Any],
    offsets: np.ndarray,
    entries: list[dict[str, Any]],
    keys: list[str],
    name: str,
) -> Expected | None:
    """What field ``name`` of a mapped batch's samples must be: each one's member checksum (None when no
    shard of the batch has them)."""
    sums = np.zeros(len(readers), dtype=np.uint64)
    known = np.zeros(len(readers), dtype=bool)
    for k, (reader, offset, entry) in enumerate(zip(readers, offsets.tolist(), entries)):
        if reader.sums is not None:  # its members in order: the field's is its place among them
            sums[k] = reader.sums[reader.first[offset] + list(entry).index(name)]
            known[k] = True
    if not known.any():
        return None
    return Expected(name, sums, keys, offsets.copy(), None if known.all() else known)


def _fails(shards: OpenShards, shard: int) -> bool:
    """Whether ``shard`` as a whole fails (OpenShards remembers that for the pass, so this asks cheaply)."""
    try:
        shards.get(shard)
    except Exception:
        return True
    return False


def column_to_batch(column) -> Any:
    """An Arrow column as a tensor when it is numeric (lists of equal length become 2-D), else a list."""
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if column.null_count == 0 and (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    ):
        # own, writable memory
        return torch.from_numpy(np.array(column.to_numpy(zero_copy_only=False)))
    if (
        column.null_count == 0
        and (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind))
        and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))
    ):
        lengths = (
            column.value_lengths().to_numpy(zero_copy_only=False) if len(column) else np.zeros(0)
        )
        if len(lengths) and (lengths == lengths[0]).all():
            values = column.flatten().to_numpy(zero_copy_only=False)
            # own, writable
            return torch.from_numpy(np.array(values).reshape(len(column), int(lengths[0])))
    return column.to_pylist()
