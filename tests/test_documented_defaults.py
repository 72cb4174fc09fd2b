"""The docs state today's defaults: each default is read from the code, and the docstrings and README
lines that name it are checked against it (the shuffle window, workers, prefetch, retries, timeout,
sample indexes, the cache's place). A default that changes without its docs fails here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import shardstream as ss
from shardstream import host
from shardstream.dataset.state import REMOTE_WINDOW_BYTES
from shardstream.loader import shard_loader
from shardstream.packing import engine
from shardstream.plan.order import WINDOW_MAX, WINDOW_MIN, WINDOW_SHARDS
from shardstream.storage.cache import default_cache_dir
from shardstream.storage.settings import StorageSettings

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def flat(text: str) -> str:
    return " ".join(text.split())


def argument_doc(obj, name: str) -> str:
    """The text a Google-style ``Args:`` section gives for ``name`` (up to the next argument)."""
    doc = inspect.getdoc(obj) or ""
    found = re.search(
        rf"^\s*(?:[\w, ]*\b){re.escape(name)}\b[\w, ]*:(.*?)(?=^\s*[\w, ]+:\s|\Z)", doc, re.M | re.S
    )
    assert found, f"{obj.__qualname__}'s docstring does not describe {name}"
    return flat(found.group(1))


def test_the_shuffle_window_default_is_stated_as_the_plan_computes_it():
    shards = f"about {WINDOW_SHARDS} shards"
    assert REMOTE_WINDOW_BYTES % (1 << 30) == 0
    remote = f"at most {REMOTE_WINDOW_BYTES >> 30} GiB"
    for text in (argument_doc(ss.ShardDataset, "shuffle_window"), flat(README)):
        assert shards in text and remote in text
    assert f"{WINDOW_MIN:,} to 2^{WINDOW_MAX.bit_length() - 1} samples" in argument_doc(
        ss.ShardDataset, "shuffle_window"
    )
    docs = [flat(README)] + [flat(p.read_text()) for p in (ROOT / "shardstream").rglob("*.py")]
    docs += [flat(p.read_text()) for p in (ROOT / "benchmarks").rglob("*.py")]
    stale = re.compile(r"(default[^.]{0,40}|windows? of )(about|~) ?(four|4) shards", re.I)
    assert not [m.group(0) for text in docs for m in stale.finditer(text)]


@pytest.mark.parametrize("name", ["prefetch", "retries", "timeout"])
def test_storage_defaults_are_stated_where_they_are_set(name):
    value = StorageSettings.__dataclass_fields__[name].default
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    assert f"default: {shown}" in argument_doc(StorageSettings, name)
    readme = {
        "prefetch": f'prefetch="{value}"',
        "retries": f"default {shown}",
        "timeout": f"default {shown} s",
    }
    assert readme[name] in flat(README)


def test_the_cache_location_is_stated_as_it_is_made(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    import os

    assert default_cache_dir() == str(tmp_path / f"shardstream-{os.getuid()}" / "cache")
    assert "``shardstream-<uid>/cache`` in the system's temporary folder" in argument_doc(
        StorageSettings, "cache_dir"
    )
    assert "<tmp>/shardstream-<uid>/cache" in README


def test_the_loader_worker_default_is_the_formula_its_docs_state(monkeypatch):
    formula = "min(4 x GPUs, CPU cores - 1)"
    assert formula in flat(inspect.getdoc(shard_loader.default_num_workers))
    assert f"``num_workers`` = {formula}" in flat(inspect.getdoc(ss.ShardLoader))
    assert "raw local tar batches: 1" in flat(inspect.getdoc(ss.ShardLoader))
    for cores, gpus, ranks, expected in (
        (2, 0, 1, 1),
        (16, 2, 1, 8),
        (16, 8, 2, 7),
        (64, 8, 8, 4),
        (1, 0, 1, 1),
    ):
        monkeypatch.setattr(host.os, "sched_getaffinity", lambda _pid, n=cores: set(range(n)))
        monkeypatch.setattr(shard_loader.torch.cuda, "is_available", lambda g=gpus: g > 0)
        monkeypatch.setattr(shard_loader.torch.cuda, "device_count", lambda g=gpus: g)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks))
        assert (
            shard_loader.default_num_workers()
            == expected
            == max(min(4 * gpus, cores - 1) // ranks, 1)
        )


def test_pack_defaults_are_stated_as_the_code_sets_them(monkeypatch):
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda _pid: set(range(6)))
    assert engine.default_workers() == 6  # pack's workers: every core it may use
    assert "`pack` runs `--workers` processes (default: all cores)" in flat(README)
    from shardstream.cli.pack import pack as pack_command

    options = {o.name: o for o in pack_command.params}
    assert "[default: CPU cores]" in options["workers"].help
    assert options["sample_index"].default is None  # decided by the destination
    assert "default: when ``dest`` is object storage" in flat(inspect.getdoc(ss.pack))
    assert "[when DEST is object storage" in flat(options["sample_index"].help)
