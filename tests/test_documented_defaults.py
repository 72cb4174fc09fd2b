"""The docs state today's defaults: each default is read from the code, and the docstrings and the
documentation's lines that name it (docs/**/*.md and the README) are checked against it (the shuffle
window, workers, prefetch, retries, timeout, sample indexes, the cache's place; every default a public
docstring states; every signature a page writes out). A default that changes without its docs fails here."""

from __future__ import annotations

import ast
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
# the documentation as one text: the site's pages and the README
DOCS = "\n".join(
    p.read_text() for p in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
)


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
    for text in (argument_doc(ss.ShardDataset, "shuffle_window"), flat(DOCS)):
        assert shards in text and remote in text
    assert f"{WINDOW_MIN:,} to 2^{WINDOW_MAX.bit_length() - 1} samples" in argument_doc(
        ss.ShardDataset, "shuffle_window"
    )
    docs = [flat(DOCS)] + [flat(p.read_text()) for p in (ROOT / "shardstream").rglob("*.py")]
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
    assert readme[name] in flat(DOCS)


def test_the_cache_location_is_stated_as_it_is_made(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    import os

    assert default_cache_dir() == str(tmp_path / f"shardstream-{os.getuid()}" / "cache")
    assert "``shardstream-<uid>/cache`` in the system's temporary folder" in argument_doc(
        StorageSettings, "cache_dir"
    )
    assert "<tmp>/shardstream-<uid>/cache" in DOCS


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
    assert "`pack` runs `--workers` processes (default: all cores)" in flat(DOCS)
    from shardstream.cli.pack import pack as pack_command

    options = {o.name: o for o in pack_command.params}
    assert "[default: CPU cores]" in options["workers"].help
    assert options["sample_index"].default is True  # every destination
    assert "``index`` (default True)" in flat(inspect.getdoc(ss.pack))
    assert inspect.signature(ss.pack).parameters["index"].default is True
    assert options["sample_index"].show_default


# -- every public docstring and every signature written out in the docs ---------------------------------------


def public_callables() -> list[tuple[str, object, inspect.Signature]]:
    """(name, object, signature) of every callable of ``shardstream.__all__`` but the error classes."""
    found = []
    for name in ss.__all__:
        obj = getattr(ss, name)
        if not callable(obj) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
            continue
        found.append((name, obj, inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)))
    return found


STATED = re.compile(
    r"\bdefaults?(?: is| to)?:?\s+(?:``)?(?P<value>[-\w.\"']+?)(?:``)?(?=[\s,;)]|$)", re.I
)


def literal(text: str):
    """A stated default as a value: a number, True/False/None, or a quoted string; else the bare word."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@pytest.mark.parametrize("name", [name for name, _, _ in public_callables()])
def test_defaults_stated_in_docstrings_are_the_code_s(name):
    """A docstring's "default: X" for an argument whose code default is a value (not None: decided
    later) names that value."""
    obj = getattr(ss, name)
    _, _, signature = next(c for c in public_callables() if c[0] == name)
    wrong = []
    for param in signature.parameters.values():
        code = param.default
        if param.name.startswith("_") or code is inspect.Parameter.empty or code is None:
            continue
        if not isinstance(code, (bool, int, float, str)):
            continue
        for found in STATED.finditer(argument_doc(obj, param.name)):
            stated = literal(found.group("value"))
            compared = isinstance(stated, (bool, int, float)) or stated == str(code)
            if compared and (stated != code or isinstance(stated, bool) != isinstance(code, bool)):
                wrong.append(f"{param.name}: the docstring says {stated!r}, the code {code!r}")
    assert wrong == []


def written_signatures() -> list[tuple[str, str, str]]:
    """(page, name, arguments) of every inline-code signature of a public name in the docs: a span
    ``Name(a, b, *, c=1)`` with a bare ``*``, or whose bare positional names are the parameters'."""
    names = "|".join(name for name, _, _ in public_callables())
    span = re.compile(rf"`(?:ss\.|shardstream\.)?({names})\(([^`]*?)\)`", re.S)
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    return [
        (page.relative_to(ROOT).as_posix(), m.group(1), " ".join(m.group(2).split()))
        for page in pages
        for m in span.finditer(page.read_text())
    ]


def stated_defaults(arguments: str, signature: inspect.Signature) -> dict[str, object] | None:
    """The ``name=value`` pairs of a written signature, or None when the span is a call, not a signature."""
    parts = [part.strip() for part in arguments.split(",") if part.strip() not in ("", "...")]
    bare = [part for part in parts if "=" not in part]
    params = set(signature.parameters)
    if "*" not in bare and not (bare and all(part in params for part in bare)):
        return None  # a call with values of the user's, like ShardDataset(url, shuffle=True)
    pairs = {}
    for part in parts:
        if "=" in part:
            key, value = part.split("=", 1)
            try:
                pairs[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                continue  # an expression (a default computed in the code): not compared
    return pairs


def test_signatures_written_in_the_docs_have_the_code_s_defaults():
    signatures = {name: signature for name, _, signature in public_callables()}
    checked, wrong = 0, []
    for page, name, arguments in written_signatures():
        pairs = stated_defaults(arguments, signatures[name])
        if pairs is None:
            continue
        checked += 1
        for key, value in pairs.items():
            param = signatures[name].parameters.get(key)
            if param is None:
                wrong.append(f"{page}: {name}() has no argument {key!r}")
            elif param.default != value:
                wrong.append(
                    f"{page}: {name}({key}={value!r}), but the code's default is {param.default!r}"
                )
    assert checked >= 4, (
        "the guides write out the signatures of DeviceLoader, TokenDataset, MixedDataset, ..."
    )
    assert wrong == []
