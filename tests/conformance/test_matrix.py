"""Every reader agrees on every dataset: the conformance matrix, readers x datasets.

Each cell reads one dataset (:mod:`.datasets`) with one reader (:mod:`.readers`) and checks what it
found against the dataset's reference, made from what was written: the same key set (each key once),
the same bytes of every field, the same labels (as class names where the dataset has a class list), the
same token windows, and the count a command reports equal to the readers'. Cells where a reader does
not apply are listed with the reason in ``docs/design/conformance.md``, which :func:`render` writes and
a test keeps in step.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from .datasets import BUILDERS, Builder, Case
from .readers import READERS, Found, Reader

PAGE = Path(__file__).parents[2] / "docs" / "design" / "conformance.md"
CELLS = [
    pytest.param(r, d, id=f"{d} | {r.name}")
    for r in READERS
    for d in BUILDERS
    if d not in r.not_for
]


@pytest.fixture(scope="session")
def cases(tmp_path_factory):
    """Each dataset, built the first time a cell asks for it."""
    builder = Builder(tmp_path_factory.mktemp("conformance"))
    yield builder.need
    import fsspec

    memory = fsspec.filesystem("memory")
    if memory.exists("/conformance"):
        memory.rm("/conformance", recursive=True)


def check(found: Found, case: Case) -> None:
    if found.count is not None:
        assert found.count == case.count, f"{case.name}: reports {found.count}, holds {case.count}"
    if not found.keys_only and found.rows is not None and case.seq_len is None:
        labelled = {s.label for s in case.samples.values()}
        if all(isinstance(x, str) for x in labelled):
            assert found.classes is not None and labelled <= set(found.classes)
    if found.windows is not None:
        assert found.windows == case.windows
    if found.rows is None:
        return
    keys = [key for key, _, _ in found.rows]
    repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
    assert not repeated, f"{case.name}: read more than once: {repeated[:5]}"
    assert set(keys) == set(case.samples), (
        f"{case.name}: not read {sorted(set(case.samples) - set(keys))[:5]}, "
        f"read but not in the dataset {sorted(set(keys) - set(case.samples))[:5]}"
    )
    if found.keys_only:
        return
    for key, fields, label in found.rows:
        want = case.samples[key]
        assert fields == want.fields, f"{case.name}: {key}: other bytes"
        if found.classes is not None and isinstance(want.label, str):
            label = found.classes[label]
        assert label == want.label, f"{case.name}: {key}: label {label!r}, written {want.label!r}"


@pytest.mark.parametrize(("reader", "dataset"), CELLS)
def test_cell(reader: Reader, dataset: str, cases) -> None:
    case = cases(dataset)
    check(reader.read(case), case)


def render() -> str:
    """The matrix page: every reader against every dataset, each cell checked or why it does not apply."""
    names = list(BUILDERS)
    lines = [
        "# Conformance: every reader agrees on every dataset",
        "",
        "<!-- written by tests/conformance/test_matrix.py (render); a test keeps it in step -->",
        "",
        "Each checked cell reads the dataset with the reader and finds the dataset's reference: the same",
        "keys (each once), the same bytes of every field, the same labels (class names where the dataset",
        "has a class list), the same token windows, and, for the commands that report one, the same",
        "count. The datasets are made in the test from data it wrote; the reference is computed from that",
        "data (a split's documented key hash, a merge's class names, the token shards' own bytes), not",
        "read through shardstream. `make test` runs every cell (`tests/conformance/`).",
        "",
        "| reader | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    notes: dict[str, int] = {}
    for r in READERS:
        cells = []
        for d in names:
            if d in r.not_for:
                n = notes.setdefault(r.not_for[d], len(notes) + 1)
                cells.append(f"n/a ({n})")
            else:
                cells.append("✓")
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    lines += ["", "Not applicable:", ""]
    lines += [f"{n}. {why}" for why, n in notes.items()]
    return "\n".join(lines) + "\n"


def test_the_matrix_page_is_the_matrix() -> None:
    assert PAGE.read_text() == render(), (
        "docs/design/conformance.md is stale: write it again with "
        "python -c 'from tests.conformance.test_matrix import PAGE, render; PAGE.write_text(render())'"
    )


def test_every_dataset_is_read_by_every_reader_that_applies() -> None:
    assert len(CELLS) == sum(len(BUILDERS) - len(r.not_for) for r in READERS)
    assert {d for r in READERS for d in r.not_for} <= set(BUILDERS)
