"""Modules talk through public names: no module reads another module's ``_private`` names, the loader
never probes a dataset with ``getattr``/``hasattr`` (it asks what the ``Readable`` contract names),
and nothing writes into another object's ``__dict__``. Read from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "shardstream"


def trees() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT.parent)): ast.parse(p.read_text())
        for p in sorted(ROOT.rglob("*.py"))
    }


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines: functions, classes, attributes and variables it assigns, and string
    constants (keys of its own ``__dict__``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reads_another_modules_private_names():
    found = trees()
    ours = {name: defined_names(tree) for name, tree in found.items()}
    everywhere = set().union(*ours.values())
    bad = []
    for module, tree in found.items():
        own = ours[module]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                bad += [
                    f"{module}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if private(a.name) and (node.module or "").startswith(".")
                ]
                bad += [
                    f"{module}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if private(a.name) and node.level > 0
                ]
            elif isinstance(node, ast.Attribute) and private(node.attr):
                base = node.value
                if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                # a private name of another module's
                if node.attr in everywhere and node.attr not in own:
                    bad.append(f"{module}:{node.lineno} reads .{node.attr}")
    assert not sorted(set(bad))


def test_the_loader_asks_datasets_only_what_the_contract_names():
    bad = []
    for module, tree in trees().items():
        if not module.startswith(
            ("shardstream/loader/", "shardstream/cli/bench", "shardstream/device")
        ):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
            ):
                target = ast.unparse(node.args[0])
                if target in ("dataset", "ds", "self.dataset") or target.endswith(".dataset"):
                    bad.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not bad


def test_nothing_writes_into_another_objects_dict():
    bad = []
    for module, tree in trees().items():
        for node in ast.walk(tree):
            owner = None
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "__dict__"
            ):
                owner = node.value.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("update", "setdefault", "pop")
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "__dict__"
            ):
                owner = node.func.value.value
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "object.__setattr__"
                and node.args
            ):
                owner = node.args[0]
            if owner is not None and not (isinstance(owner, ast.Name) and owner.id == "self"):
                bad.append(f"{module}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not bad


# The one owner of "which samples of which shard, with which labels": a manifest's selection and
# relabelling are read through manifest.sample_set (samples_of) on the read path; only the modules that
# make or keep those files (the manifest, packing's merge/split/append/gc, the resharding source that
# refuses them) touch them directly.
OWNERS_OF_SELECTION = ("shardstream/manifest/", "shardstream/packing/", "shardstream/sources/")


def test_the_read_path_counts_samples_only_through_the_sample_set():
    bad = []
    for module, tree in trees().items():
        if module.startswith(OWNERS_OF_SELECTION) or module == "shardstream/cli/living.py":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            base = ast.unparse(node.value)
            sample_set = base.endswith(("samples", "sample_set"))
            if node.attr == "selection" or (node.attr == "relabel" and not sample_set):
                bad.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "read a split's selection or a merge's relabelling through samples_of: " + str(
        bad
    )


def test_datasets_hold_settings_as_a_value_not_behind_a_guard():
    """A dataset's settings are one frozen ReadSettings and what it was made with is Fixed: no dataset
    class overrides ``__setattr__``, and none writes into its own ``__dict__`` to get past one."""
    bad = []
    for module, tree in trees().items():
        if not module.startswith("shardstream/dataset/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "__setattr__":
                bad.append(f"{module}:{node.lineno} defines __setattr__")
            writes_dict = (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Store)
                and ast.unparse(node.value) == "self.__dict__"
            ) or (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) in ("self.__dict__.update", "self.__dict__.setdefault")
            )
            if writes_dict:
                bad.append(f"{module}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not bad
