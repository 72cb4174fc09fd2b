"""The documentation's Markdown as the tests see it: its pages, their Python blocks and their headings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ILLUSTRATIVE = re.compile(r"^<!-- illustrative: (?P<reason>\S.*?) -->$")


@dataclass(frozen=True)
class Block:
    """One fenced Python block: where it is, its code, and why it is not run (None: it runs)."""

    path: Path
    line: int
    code: str
    illustrative: str | None

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page of the site, and the README."""
    return sorted(DOCS.rglob("*.md")) + [ROOT / "README.md"]


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of a page, each with the reason of the illustrative mark above it."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```python"):
            mark = ILLUSTRATIVE.match(lines[i - 1]) if i else None
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            code = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(path, i + 1, code, mark.group("reason") if mark else None))
            i = end
        i += 1
    return blocks


def stray_marks(path: Path) -> list[int]:
    """Lines with an illustrative mark that no ```python fence follows (a mark that marks nothing)."""
    lines = path.read_text().splitlines()
    return [
        n + 1
        for n, line in enumerate(lines)
        if line.startswith("<!-- illustrative")
        and not (
            ILLUSTRATIVE.match(line) and n + 1 < len(lines) and lines[n + 1].startswith("```python")
        )
    ]


def section(path: Path, heading: str) -> str:
    """The text of the section under ``heading`` (any level), up to the next heading of its level or above."""
    text = path.read_text()
    found = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert found, f"{path.relative_to(ROOT)} has no heading {heading!r}"
    level = len(found.group(1))
    rest = text[found.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest
