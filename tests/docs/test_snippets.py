"""Every ```python block of the documentation (docs/**/*.md and the README) runs as it is, in a fresh
temporary folder, unless the line above it says why not: ``<!-- illustrative: <reason> -->``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs.markdown import ROOT, pages, python_blocks, stray_marks

BLOCKS = [block for page in pages() for block in python_blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.illustrative is None]


def test_the_docs_have_blocks_that_run():
    assert len(RUNNABLE) >= 3, "the guides should show code that runs"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_illustrative_mark_marks_a_python_block(page):
    assert stray_marks(page) == [], (
        "an illustrative mark must be '<!-- illustrative: <reason> -->' directly above a ```python fence"
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_python_block_runs(block, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    script = tmp_path / "block.py"
    script.write_text(block.code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"{block.name} failed (mark it '<!-- illustrative: reason -->' if it cannot run in an empty "
        f"folder):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )
