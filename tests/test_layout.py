"""The package's shape: one folder per pipeline stage, imports that follow the data flow, no cycles,
limits on functions (not files), and a layout page (docs/design/layout.md) that names every folder and module there is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardstream"

# What each stage may import (besides itself). The write path (sources, packing) and the read path
# (plan, dataset, loader, device) share the foundations (formats, storage, manifest) and never each other.
ALLOWED = {
    "errors": set(),
    "version": set(),
    "sizes": {"errors"},
    "host": set(),
    "formats": {"errors"},
    "storage": {"errors", "sizes"},
    "manifest": {"errors", "version", "formats", "storage"},
    "sources": {"errors", "sizes", "formats", "storage", "manifest"},
    "packing": {"errors", "sizes", "formats", "storage", "manifest", "sources"},
    "plan": set(),
    "dataset": {"errors", "sizes", "formats", "storage", "manifest", "plan"},
    "loader": {"errors", "plan", "dataset"},
    "device": {"errors", "loader"},
    "cli": {
        "errors",
        "version",
        "sizes",
        "storage",
        "manifest",
        "packing",
        "plan",
        "dataset",
        "loader",
        "device",
    },
}
FOUNDATIONS = {"sizes", "host"}  # byte sizes and machine facts: every stage may use them
for _stage, _allowed in ALLOWED.items():
    if _stage not in FOUNDATIONS | {"errors", "version"}:
        _allowed.update(FOUNDATIONS)
ENTRY_POINTS = {"__init__", "__main__"}  # the package root may name any stage
# Imports by name at run time (importlib), which the import graph includes. The one that points up the
# flow is deliberate: PlannedDataset.loader(), a convenience that makes the loader over the dataset.
LATE_BOUND_UP = {("shardstream.dataset.base", "shardstream.loader")}
# A base class that makes its backends by name, as fsspec's registry does: Store(url) imports the backend the
# URL needs, and each backend imports the base it extends.
LATE_BOUND_UP |= {
    ("shardstream.storage.store", "shardstream.storage.local_store"),
    ("shardstream.storage.store", "shardstream.storage.fsspec_store"),
    ("shardstream.storage.store", "shardstream.storage.s3_store"),
}


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its code: lazy imports in functions,
    and modules named in strings (``importlib.import_module("shardstream.loader")``, registry entries
    ``"shardstream.sources.folder:image_folder"``), too. A name that is no module of the package (an
    old path, a typo) is kept as it is, so that the checks below fail on it."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
        ):
            found.update(
                a.value
                for a in node.args
                if isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.startswith("shardstream")
            )
            continue
        # a registry entry, "module:attribute"
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("shardstream.")
            and re.fullmatch(r"[\w.]+:\w+", node.value)
        ):
            found.add(node.value.split(":", 1)[0])
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                for alias in node.names
            ]
        else:
            continue
        found.update(
            t for t in targets if (t in known or t.startswith("shardstream")) and t != name
        )
    return found


def stage(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


GRAPH = {name: imports(name, path, modules()) for name, path in modules().items()}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_every_import_names_a_module_of_today(module):
    stale = sorted(t for t in GRAPH[module] if t not in modules())
    assert not stale, f"{module} imports {stale}: not modules of the package (old paths?)"


def test_every_top_level_module_or_folder_is_a_known_stage():
    names = {stage(m) for m in GRAPH} - ENTRY_POINTS
    assert names == set(ALLOWED), (
        "a new stage needs its place in ALLOWED (and in docs/design/layout.md)"
    )


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if stage(m) not in ENTRY_POINTS))
def test_imports_follow_the_data_flow(module):
    own = stage(module)
    wrong = sorted(
        t
        for t in GRAPH[module]
        if stage(t) != own and stage(t) not in ALLOWED[own] and (module, t) not in LATE_BOUND_UP
    )
    assert not wrong, (
        f"{module} ({own}) imports {wrong}; {own} may import only {sorted(ALLOWED[own])}"
    )


def test_no_import_cycles():
    graph = graph_without_late_binding()
    seen: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> None:
        seen[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if seen.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                pytest.fail(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in seen:
                visit(nxt)
        path.pop()
        seen[node] = 2

    for node in sorted(graph):
        if node not in seen:
            visit(node)


def graph_without_late_binding() -> dict[str, set[str]]:
    return {
        m: {t for t in targets if (m, t) not in LATE_BOUND_UP and t in GRAPH}
        for m, targets in GRAPH.items()
    }


def test_the_layering_check_sees_lazy_relative_old_and_named_imports(tmp_path):
    """The checks above must see an upward import however it is written (they would pass otherwise)."""
    fake = tmp_path / "shardstream" / "storage"
    fake.mkdir(parents=True)
    (fake / "x.py").write_text(
        "import importlib\n"
        "def f():\n    from ..loader import shard_loader\n    from ... import os\n"
        "    from ..transport import Ring\n    import shardstream.collate\n"
        "    importlib.import_module('shardstream.dataset')\n"
    )
    known = {
        "shardstream.storage.x": fake / "x.py",
        "shardstream.loader": Path("-"),
        "shardstream.loader.shard_loader": Path("-"),
        "shardstream.dataset": Path("-"),
    }
    assert imports("shardstream.storage.x", fake / "x.py", known) == {
        "shardstream.loader.shard_loader",
        "shardstream.transport",
        "shardstream.collate",
        "shardstream.dataset",
    }


def test_functions_not_files_are_limited():
    """Size is limited per function (ruff's complexity, argument and statement rules, which make test runs),
    not per file: a long but coherent module is fine, a 24-parameter function is not."""
    tomllib = pytest.importorskip(
        "tomllib", reason="tomllib is in the standard library from Python 3.11"
    )
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert {"C901", "PLR0913", "PLR0915"} <= set(ruff["lint"]["select"])
    assert ruff["lint"]["mccabe"]["max-complexity"] <= 12
    assert (
        ruff["lint"]["pylint"]["max-args"] <= 8 and ruff["lint"]["pylint"]["max-statements"] <= 50
    )
    assert not any(
        rule in ruff["lint"]["per-file-ignores"].get(path, [])
        for path in ("shardstream/**",)
        for rule in ("C901", "PLR0913", "PLR0915")
    )


def readme_tree() -> set[str]:
    """The paths the layout page's tree names (``dataset/collate.py``), from its indentation."""
    section = (ROOT / "docs" / "design" / "layout.md").read_text()
    blocks = section.split("```")[
        1::2
    ]  # the section's code blocks; the tree is the one of the package
    tree = next(block for block in blocks if block.lstrip("\n").startswith("shardstream/"))
    named: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indent, "dataset/shards/") of the folders around a line
    for line in tree.splitlines()[2:]:
        if not line.strip():
            continue
        entry, indent = line.split()[0], len(line) - len(line.lstrip())
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = (folders[-1][1] if folders and indent > 2 else "") + entry
        named.add(path)
        if entry.endswith("/"):
            folders.append((indent, path))
    return named


def test_the_layout_page_matches_the_tree():
    named = readme_tree()
    actual = set()
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        parts = rel.split("/")
        actual.update("/".join(parts[: i + 1]) + "/" for i in range(len(parts) - 1))
        if not rel.endswith("/__init__.py"):
            actual.add(rel)
    assert actual - named == set(), "modules missing from docs/design/layout.md"
    assert named - actual == set(), "docs/design/layout.md names modules that do not exist"


# The rooms of the dataset stage, and which of the others each may use: how shards are read knows nothing
# of samples, batches or datasets; a mix's parts serve MixedDataset (and the batch shapes, which read mixes).
DATASET_ROOMS = {
    "shards": set(),
    "samples": {"shards", "batches", "root"},
    "batches": {"shards", "samples", "root"},
    "mix": {"shards", "batches", "root"},
    "root": {"shards", "samples", "batches", "mix"},
}


def dataset_room(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 else "root"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if m.startswith("shardstream.dataset.")))
def test_dataset_rooms_follow_their_order(module):
    own = dataset_room(module)
    wrong = sorted(
        t
        for t in GRAPH[module]
        if t.startswith("shardstream.dataset.")
        and dataset_room(t) != own
        and dataset_room(t) not in DATASET_ROOMS[own]
    )
    assert not wrong, (
        f"{module} ({own}/) imports {wrong}; {own}/ may use only {sorted(DATASET_ROOMS[own])}"
    )


def test_every_dataset_room_is_known():
    rooms = {dataset_room(m) for m in GRAPH if m.startswith("shardstream.dataset.")}
    assert rooms == set(DATASET_ROOMS), "a new room of dataset/ needs its place in DATASET_ROOMS"
