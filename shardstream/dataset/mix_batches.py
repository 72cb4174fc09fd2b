"""A mix's batches: the sources' parts put back in the mix's order, each row tagged with its source."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import UsageError
from .collate import _empty
from .readers import MappedBytes
from .tokens import varlen_fields

SOURCE = "__source__"
TOKEN_FIELDS = ("input_ids", "labels", "position_ids")


def _name(source: Any) -> str:
    store = source.__dict__.get("store")
    return store.url if store is not None else type(source).__name__


def tag(sample: Any, i: int, source: Any) -> Any:
    """``sample`` with ``__source__`` set to ``i``; a mix needs dict samples to say where each came from."""
    if not isinstance(sample, dict):
        raise UsageError(f"source {i} of the mix ({_name(source)}) gives {type(sample).__name__} samples; a mix "
                         "tags each sample with __source__, so its sources' transforms must return dicts")
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


def check_fields(samples: Sequence[dict[str, Any]], seen: dict[int, dict[str, str]], sources: Sequence[Any]) -> None:
    """Refuse a batch whose sources give different fields, or the same field as different kinds of
    value (a collated batch would quietly hold lists with holes or mixed types); ``seen`` keeps each
    source's fields once found. Fields named ``__x__`` may differ."""
    for sample in samples:
        i = sample[SOURCE]
        if i not in seen:
            seen[i] = {k: _kind(v) for k, v in sample.items() if not (k.startswith("__") and k.endswith("__"))}
    if len(seen) < 2:
        return
    (first, names), *rest = sorted(seen.items())
    for i, other in rest:
        fix = ("a batch needs the same fields from every source, decoded alike: choose them with fields= "
               "(e.g. fields=['jpg;png', 'cls']), decode= or a transform on each source")
        if other.keys() != names.keys():
            missing, extra = sorted(names.keys() - other.keys()), sorted(other.keys() - names.keys())
            what = f"lacks field {missing[0]!r}" if missing else f"has field {extra[0]!r}"
            raise UsageError(f"source {i} of the mix ({_name(sources[i])}) {what} that source {first} "
                             f"({_name(sources[first])}) {'has' if missing else 'lacks'}; {fix}")
        for name, kind in other.items():
            if kind != names[name]:
                raise UsageError(f"field {name!r} of source {i} of the mix ({_name(sources[i])}) is a {kind}, of "
                                 f"source {first} ({_name(sources[first])}) a {names[name]}; {fix}")


def merge_mapped(parts: Sequence[tuple[np.ndarray, dict[str, Any], int]], n: int, sources: Sequence[Any]
                 ) -> dict[str, Any] | None:
    """One batch of locations from each source's (rows, mapped batch, source index); None where the
    sources' fields differ (the general path then names the difference)."""
    names = [k for k in parts[0][1] if k != "__key__"]
    if any(sorted(k for k in batch if k != "__key__") != sorted(names) for _, batch, _ in parts):
        return None
    keys: list[Any] = [None] * n
    source = np.empty(n, dtype=np.int64)
    for rows, batch, i in parts:
        for r, key in zip(rows.tolist(), batch["__key__"]):
            keys[r] = key
        source[rows] = i
    out: dict[str, Any] = {"__key__": keys}
    for name in names:
        paths: list[str] = []
        identities: list[Any] = []
        shards = np.empty(n, dtype=np.int32)
        starts = np.empty(n, dtype=np.int64)
        sizes = np.empty(n, dtype=np.int64)
        for rows, batch, _ in parts:
            values: MappedBytes = batch[name]
            shards[rows] = values.shards + len(paths)
            starts[rows], sizes[rows] = values.starts, values.sizes
            paths += values.paths
            identities += values.identities if values.identities is not None else [None] * len(values.paths)
        out[name] = MappedBytes(paths, shards, starts, sizes, identities)
    out[SOURCE] = torch.from_numpy(source)
    return out


def merge_tokens(parts: Sequence[tuple[np.ndarray, dict[str, Any], int]], n: int) -> dict[str, Any]:
    """One batch of token windows from each source's (rows, batch, source index), in the mix's order,
    with ``cu_seqlens`` and ``max_seqlen`` over the whole batch."""
    length = parts[0][1]["input_ids"].shape[1]
    out: dict[str, Any] = {name: _empty((n, length), torch.int64) for name in TOKEN_FIELDS}
    source = _empty((n,), torch.int64)
    for rows, batch, i in parts:
        index = torch.from_numpy(rows)
        for name in TOKEN_FIELDS:
            out[name][index] = batch[name]
        source[index] = i
    out.update(varlen_fields(out["position_ids"].numpy()))
    out[SOURCE] = source
    return out


__all__ = ["SOURCE", "check_fields", "merge_mapped", "merge_tokens", "tag"]
