"""The matrix's rows: every way shardstream reads a dataset, each giving what it found in one form.

A reader returns a :class:`Found`: the samples it yielded (key, field bytes, label), the windows of a
token dataset, or the count a command reports. ``not_for`` says where a reader does not apply and why
(one line each, shown in the matrix page). A new reader is one more entry of :data:`READERS`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import shardstream as ss

from .datasets import BUILDERS, Case, command

LABEL = "cls"


@dataclass
class Found:
    """What a reader found: samples as (key, fields, label) in the order read, token windows, or the
    count a command reports; the class list its labels index."""

    rows: list[tuple[str, dict[str, bytes], Any]] | None = None
    windows: Counter[tuple[int, ...]] | None = None
    count: int | None = None
    classes: list[str] | None = None
    keys_only: bool = False  # rows hold keys, no field bytes or labels (ls --keys)


def as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def as_label(value: Any) -> int:
    """A stored or decoded label (``b"1"``, ``1``, a 0-d tensor, ``"1"``) as an int."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value).decode()
    return int(value)


def sample_row(sample: dict[str, Any]) -> tuple[str, dict[str, bytes], Any]:
    fields = {k: as_bytes(v) for k, v in sample.items() if not k.startswith("__") and k != LABEL}
    return sample["__key__"], fields, as_label(sample[LABEL]) if LABEL in sample else None


def unbatch(batch: dict[str, Any]) -> list[tuple[str, dict[str, bytes], Any]]:
    """A collated batch of raw samples as rows."""
    n = len(batch["__key__"])
    return [sample_row({k: v[i] for k, v in batch.items() if k != "__bucket__"}) for i in range(n)]


def window_rows(batch: dict[str, Any]) -> Counter[tuple[int, ...]]:
    """A batch of token windows as each window's ``seq_len + 1`` tokens."""
    ids, labels = np.asarray(batch["input_ids"]), np.asarray(batch["labels"])
    ids, labels = ids.reshape(-1, ids.shape[-1]), labels.reshape(-1, labels.shape[-1])
    return Counter(tuple(row.tolist()) + (int(last[-1]),) for row, last in zip(ids, labels))


# -- the Python API ------------------------------------------------------------------------------------
def dataset(case: Case) -> Any:
    if case.seq_len is not None:
        return ss.TokenDataset(
            case.url, case.seq_len, shuffle=True, seed=5, drop_last=False, **case.opened()
        )
    return ss.ShardDataset(case.url, decode=None, shuffle=True, seed=5, **case.opened())


def through_loader(loader: Any, ds: Any, case: Case) -> Found:
    if case.seq_len is not None:
        windows: Counter[tuple[int, ...]] = Counter()
        for batch in loader:
            windows += window_rows(batch)
        return Found(windows=windows)
    rows = [row for batch in loader for row in unbatch(batch)]
    return Found(rows, classes=ds.sample_set.classes)


def shard_dataset(num_workers: int, workers: str) -> Callable[[Case], Found]:
    def read(case: Case) -> Found:
        ds = dataset(case)
        return through_loader(
            ds.loader(batch_size=3, num_workers=num_workers, workers=workers), ds, case
        )

    return read


def mixed_one_source(case: Case) -> Found:
    ds = dataset(case)
    mix = ss.MixedDataset([ds], seed=2)
    return through_loader(mix.loader(batch_size=3, num_workers=0), ds, case)


def bucketed(case: Case) -> Found:
    ds = dataset(case)
    batches = ss.Bucketed(
        ds, ss.aspect_ratio("jpg"), boundaries=[1.5, 2.5], batch_size=3, num_workers=0
    )
    assert batches.planned_up_front == (case.name in PLANNED), case.name
    return through_loader(batches, ds, case)


def bucketed_by_duration(case: Case) -> Found:
    ds = dataset(case)
    batches = ss.Bucketed(
        ds, ss.duration("mp4"), boundaries=[0.8, 1.2], batch_size=3, num_workers=0
    )
    assert batches.planned_up_front
    return through_loader(batches, ds, case)


# every dataset with image sizes recorded at pack time (or by index, or carried by a split or merge):
# the epoch planned from them; Parquet read in place records none
PLANNED = set(BUILDERS) - {"parquet in place", "token windows", "video and audio"}


def shard_map(case: Case) -> Found:
    m = ss.ShardMap(case.url, decode=None, seq_len=case.seq_len, **case.opened())
    if case.seq_len is not None:
        windows: Counter[tuple[int, ...]] = Counter()
        for i in range(len(m)):
            windows += window_rows({k: v[None] for k, v in m[i].items()})
        return Found(windows=windows)
    rows = [sample_row(m[i]) for i in range(len(m))]
    assert [sample_row(s) for s in m.__getitems__(list(range(len(m))))] == rows
    return Found(rows, classes=m.sample_set.classes)


def shard_map_get(case: Case) -> Found:
    m = ss.ShardMap(case.url, decode=None, **case.opened())
    rows = []
    for key in case.samples:
        rows.append(sample_row(m.get(key)))
        assert m[m.index_of(key)]["__key__"] == key
    return Found(rows, classes=m.sample_set.classes)


# -- the commands ------------------------------------------------------------------------------------
def _info(case: Case) -> dict[str, Any]:
    seq = [] if case.seq_len is None else ["--seq-len", str(case.seq_len)]
    return json.loads(command(["info", case.url, "--json", *seq, *case.flags()]))


def info(case: Case) -> Found:
    doc = _info(case)
    if case.seq_len is not None:
        return Found(count=doc["tokens"]["windows"]["windows"])
    return Found(count=doc["num_samples"], classes=doc["classes"])


def cat(case: Case) -> Found:
    """``cat DATASET i --field F`` for every sample and field: the bytes as written to a pipe."""
    from click.testing import CliRunner

    from shardstream.cli import cli

    runner, flags = CliRunner(), case.flags()
    fields = sorted({f for s in case.samples.values() for f in s.fields})
    rows = []
    for i in range(_info(case)["num_samples"]):
        got = {}
        for name in ["__key__", LABEL, *fields]:
            done = runner.invoke(cli, ["cat", case.url, str(i), "--field", name, *flags])
            assert done.exit_code == 0, done.output
            got[name] = done.stdout_bytes
        key, label = got.pop("__key__").decode(), as_label(got.pop(LABEL))
        rows.append((key, got, label))
    return Found(rows, classes=_info(case)["classes"])


def ls_keys(case: Case) -> Found:
    lines = command(["ls", case.url, "--keys", "--json", *case.flags()]).splitlines()
    docs = [json.loads(line) for line in lines]
    assert [d["index"] for d in docs] == list(range(len(docs)))
    return Found([(d["key"], {}, None) for d in docs], keys_only=True)


def verify(case: Case) -> Found:
    out = command(["verify", case.url, "-q", *case.flags()])
    found = re.search(r"ok: [\d,]+ shards?, ([\d,]+) samples?", out)
    assert found, out
    if case.seq_len is not None:  # a token dataset's samples are documents; its windows are read
        return Found(count=case.count)
    return Found(count=int(found.group(1).replace(",", "")))


def bench(case: Case) -> Found:
    args = ["bench", case.url, "--workers", "0", "--samples", str(case.count), "--decode", "none"]
    doc = json.loads(command([*args, "--json", "-q", *case.flags()]))
    assert all(p["samples"] == case.count for p in doc["points"]), doc["points"]
    return Found(count=doc["dataset_samples"])


@dataclass(frozen=True)
class Reader:
    name: str
    read: Callable[[Case], Found]
    not_for: dict[str, str] = field(default_factory=dict)  # dataset -> why it does not apply


NO_KEYS = "a token dataset's windows have no keys or fields"
READERS = [
    Reader("ShardDataset, 0 workers", shard_dataset(0, "auto")),
    Reader("ShardDataset, 2 worker processes", shard_dataset(2, "processes")),
    Reader("ShardDataset, 2 reader threads", shard_dataset(2, "threads")),
    Reader("ShardMap: len, every m[i]", shard_map),
    Reader("ShardMap: m.get(key)", shard_map_get, {"token windows": NO_KEYS}),
    Reader("MixedDataset of one source", mixed_one_source),
    Reader(
        "Bucketed (aspect ratio)",
        bucketed,
        {
            "token windows": "a token dataset holds no images",
            "video and audio": "a dataset of videos and recordings holds no images",
        },
    ),
    Reader(
        "Bucketed (duration)",
        bucketed_by_duration,
        {
            d: "a dataset without video or audio has no durations"
            for d in BUILDERS
            if d != "video and audio"
        },
    ),
    Reader("shardstream cat", cat, {"token windows": NO_KEYS}),
    Reader("shardstream ls --keys", ls_keys, {"token windows": NO_KEYS}),
    Reader("shardstream info", info),
    Reader("shardstream verify", verify),
    Reader(
        "shardstream bench",
        bench,
        {"token windows": "bench measures ShardDataset; token datasets have benchmarks/tokens.py"},
    ),
]
