"""A mix's batches: the sources' parts put back in the mix's order, each row tagged with its source."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np
import torch

from ...errors import UsageError
from ..batches.collate import empty_batch_tensor
from ..shards.mapped import MappedBytes
from ..tokens import varlen_fields

SOURCE = "__source__"
TOKEN_FIELDS = ("input_ids", "labels", "position_ids")


def source_name(source: Any) -> str:
    """A mix's source, named for messages: its dataset's URL."""
    return source.store.url


def tag(sample: Any, i: int, source: Any) -> Any:
    """``sample`` with ``__source__`` set to ``i``; a mix needs dict samples to say where each came from."""
    if not isinstance(sample, dict):
        raise UsageError(
            f"source {i} of the mix ({source_name(source)}) gives {type(sample).__name__} samples; a mix "
            "tags each sample with __source__, so its sources' transforms must return dicts"
        )
    sample[SOURCE] = i
    return sample


def _kind(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{value.ndim}-d array"
    if isinstance(value, (bool, int, float, np.number)):
        return "number"
    return type(value).__name__


def check_fields(
    samples: Sequence[dict[str, Any]], seen: dict[int, dict[str, str]], sources: Sequence[Any]
) -> None:
    """Refuse a batch whose sources give different fields, or the same field as different kinds of
    value (a collated batch would quietly hold lists with holes or mixed types); ``seen`` keeps each
    source's fields once found. Fields named ``__x__`` may differ."""
    for sample in samples:
        i = sample[SOURCE]
        if i not in seen:
            seen[i] = {
                k: _kind(v)
                for k, v in sample.items()
                if not (k.startswith("__") and k.endswith("__"))
            }
    if len(seen) < 2:
        return
    (first, names), *rest = sorted(seen.items())
    for i, other in rest:
        fix = (
            "a batch needs the same fields from every source, decoded alike: choose them with fields= "
            "(e.g. fields=['jpg;png', 'cls']), decode= or a transform on each source"
        )
        if other.keys() != names.keys():
            missing, extra = (
                sorted(names.keys() - other.keys()),
                sorted(other.keys() - names.keys()),
            )
            what = f"lacks field {missing[0]!r}" if missing else f"has field {extra[0]!r}"
            raise UsageError(
                f"source {i} of the mix ({source_name(sources[i])}) {what} that source {first} "
                f"({source_name(sources[first])}) {'has' if missing else 'lacks'}; {fix}"
            )
        for name, kind in other.items():
            if kind != names[name]:
                raise UsageError(
                    f"field {name!r} of source {i} of the mix ({source_name(sources[i])}) is a {kind}, of "
                    f"source {first} ({source_name(sources[first])}) a {names[name]}; {fix}"
                )


def gather_mapped(
    parts: Sequence[tuple[np.ndarray, Any, Any, np.ndarray, np.ndarray, int]],
    n: int,
    path_of: Callable[[int, int], str],
) -> dict[str, Any] | None:
    """One batch of locations in the shard files of several sources, from each source's (rows, dataset,
    open shards, shard ids, offsets, source index), in one pass; None where a shard fails or the fields
    differ (the general path then raises, skips or names the difference). ``__source__`` is a numpy
    array here: a batch of locations crosses from a worker pickled whole, and a tensor would take a
    shared-memory segment of its own (half the cost of the batch)."""
    keys: list[Any] = [None] * n
    entries: list[Any] = [None] * n
    source = np.empty(n, dtype=np.int64)
    shard_of = np.empty(n, dtype=np.int32)
    paths: list[str] = []
    identities: list[Any] = []
    for rows, ds, shards, ids, offsets, i in parts:
        started = perf_counter_ns()
        known: dict[int, int] = {}
        try:
            for r, shard, offset in zip(rows.tolist(), ids.tolist(), offsets.tolist()):
                reader = shards.get(shard)
                k = known.get(shard)
                if k is None:
                    k = known[shard] = len(paths)
                    paths.append(path_of(i, shard))
                    identities.append(getattr(reader, "identity", None))
                keys[r], entries[r] = reader.locate(offset)
                shard_of[r] = k
        except Exception:
            return None
        source[rows] = i
        ds.sample_reader.account(shards, started, len(rows))
    names = entries[0].keys()
    if any(e.keys() != names for e in entries[1:]):
        return None
    batch: dict[str, Any] = {"__key__": keys}
    for name in names:
        spans = np.array([e[name] for e in entries], dtype=np.int64).reshape(-1, 2)
        batch[name] = MappedBytes(paths, shard_of, spans[:, 0], spans[:, 1], identities)
    batch[SOURCE] = source
    return batch


def merge_tokens(parts: Sequence[tuple[np.ndarray, dict[str, Any], int]], n: int) -> dict[str, Any]:
    """One batch of token windows from each source's (rows, batch, source index), in the mix's order,
    with ``cu_seqlens`` and ``max_seqlen`` over the whole batch."""
    length = parts[0][1]["input_ids"].shape[1]
    out: dict[str, Any] = {
        name: empty_batch_tensor((n, length), torch.int64) for name in TOKEN_FIELDS
    }
    source = empty_batch_tensor((n,), torch.int64)
    for rows, batch, i in parts:
        index = torch.from_numpy(rows)
        for name in TOKEN_FIELDS:
            out[name][index] = batch[name]
        source[index] = i
    out.update(varlen_fields(out["position_ids"].numpy()))
    out[SOURCE] = source
    return out


__all__ = ["SOURCE", "check_fields", "gather_mapped", "merge_tokens", "tag"]
