"""Samples and batches from open shards: decode, transform, skip what fails, or take raw bytes.

Three ways to a batch, fastest first: raw bytes of local tars as locations in the shard files
(:class:`MappedBytes`, nothing copied); Arrow rows gathered by ``take`` into columns (no
per-row Python); and sample by sample, decoded and transformed, for ``collate`` to stack.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import ShardstreamError
from ..manifest import Manifest
from ..storage import Store
from .collate import MappedBytes
from .decode import Decoder
from .readers import OpenShards

log = logging.getLogger("shardstream")


class SampleReader:
    """Turns (shard, offset) pairs of the plan into samples, by the dataset's settings of this pass.

    ``on_error="skip"`` replaces a sample that fails with the last good one (so every rank
    still yields the same number), counts it in :attr:`skipped` and logs it.
    """

    def __init__(self, store: Store, manifest: Manifest):
        self.store, self.manifest = store, manifest
        self.decoder = Decoder(None)
        self.transform: Callable[[dict[str, Any]], Any] | None = None
        self.on_error = "raise"
        self.raw = True
        self.skipped = 0  # samples replaced under on_error="skip", in this process
        self.last_good: Any = None

    def begin(self, decoder: Decoder, transform: Callable[[dict[str, Any]], Any] | None, on_error: str,
              raw: bool) -> None:
        """Start a pass with the dataset's settings as they are now."""
        self.decoder, self.transform, self.on_error = decoder, transform, on_error
        self.raw = raw  # undecoded bytes, no transform: views of the shard's memory into the batch
        self.last_good = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "last_good": None}  # a sample of this process stays here

    def decode(self, shards: OpenShards, shard: int, offset: int, batched: bool) -> Any:
        if self.raw and batched:
            return shards.get(shard).views(offset)  # collated (copied once) before anyone else sees it
        sample = self.decoder(shards.get(shard).sample(offset))
        return self.transform(sample) if self.transform is not None else sample

    def load(self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray, batched: bool,
             stand_in: Callable[[], Any]) -> list[Any]:
        """The samples at (``ids``, ``offsets``); a failure raises naming shard and sample, or is skipped."""
        out: list[Any] = []
        for shard, offset in zip(ids.tolist(), offsets.tolist()):
            try:
                sample = self.decode(shards, shard, offset, batched)
            except Exception as exc:
                where = self.store.url_of(self.manifest.paths[shard])
                key = shards.key_of(shard, offset)
                message = f"{where}: sample {offset}{f' ({key!r})' if key else ''}: {exc}"
                if self.on_error == "raise":
                    if isinstance(exc, ShardstreamError):
                        raise type(exc)(message) from exc
                    raise ShardstreamError(message) from exc
                self.skipped += 1
                log.warning("skipped %s", message)
                if self.last_good is None:
                    self.last_good = stand_in()
                out.append(self.last_good)  # equal length: repeat the last good sample
                continue
            out.append(sample)
            self.last_good = sample
        return out

    def load_mapped(self, shards: OpenShards, ids: np.ndarray, offsets: np.ndarray) -> dict[str, Any] | None:
        """Raw bytes of a local tar batch as locations in the shard files (see MappedBytes);
        None if this batch cannot be put so (a field some samples lack, a shard that fails)."""
        try:
            readers = [shards.get(int(s)) for s in ids]
        except ShardstreamError:
            return None  # the general path reports or skips it
        located = [r.locate(o) for r, o in zip(readers, offsets.tolist())]
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
            batch[name] = MappedBytes(paths, local.astype(np.int32), spans[:, 0], spans[:, 1])
        return batch

    @staticmethod
    def load_columns(shards: OpenShards, ids: np.ndarray, offsets: np.ndarray) -> dict[str, Any]:
        """Arrow batch mode: rows gathered with ``take`` per shard, columns to tensors, no per-row Python."""
        import pyarrow as pa

        if (ids == ids[0]).all() and (np.diff(offsets) == 1).all():  # unshuffled: a zero-copy slice
            table = shards.get(int(ids[0])).table.slice(int(offsets[0]), len(offsets))
            return {name: column_to_batch(table.column(name)) for name in table.column_names}
        group = np.argsort(ids, kind="stable")  # rows grouped by shard, plan order kept within each
        pieces = []
        for shard in np.unique(ids):
            rows = offsets[group][ids[group] == shard]
            pieces.append(shards.get(int(shard)).take(pa.array(rows)))  # errors name the shard
        table = pa.concat_tables(pieces).take(pa.array(np.argsort(group, kind="stable")))
        return {name: column_to_batch(table.column(name)) for name in table.column_names}


def column_to_batch(column) -> Any:
    """An Arrow column as a tensor when it is numeric (lists of equal length become 2-D), else a list."""
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if column.null_count == 0 and (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                   or pa.types.is_boolean(kind)):
        return torch.from_numpy(np.array(column.to_numpy(zero_copy_only=False)))  # own, writable memory
    if (column.null_count == 0 and (pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind))
            and (pa.types.is_integer(kind.value_type) or pa.types.is_floating(kind.value_type))):
        lengths = column.value_lengths().to_numpy(zero_copy_only=False) if len(column) else np.zeros(0)
        if len(lengths) and (lengths == lengths[0]).all():
            values = column.flatten().to_numpy(zero_copy_only=False)
            return torch.from_numpy(np.array(values).reshape(len(column), int(lengths[0])))  # own, writable
    return column.to_pylist()
