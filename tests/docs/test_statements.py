"""What the pages state that the code can check: the command-line table names every command and its
options, every `shardstream COMMAND` a page shows exists, `make test` is described as the Makefile runs
it, the package's version is newer than the releases the pages call old, and sample indexes are
written by default as the format page says."""

from __future__ import annotations

import inspect
import re

import click
import pytest

import shardstream as ss
from shardstream.cli import cli

from .markdown import DOCS, ROOT, pages

STORAGE = (
    "--endpoint-url",
    "--anon",
    "--profile",
    "--trust-root",
    "-o",
)  # every command takes these


def commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    return {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}


def table_rows() -> dict[str, str]:
    """The command-line reference's table: command name -> its row."""
    text = (DOCS / "reference" / "cli.md").read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `shardstream (\w+)\b.*$", text, re.M)}


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_and_option_is_in_the_cli_table(name):
    row = table_rows().get(name)
    assert row is not None, f"docs/reference/cli.md's table has no row for shardstream {name}"
    missing = []
    for param in commands()[name].params:
        if not isinstance(param, click.Option):
            continue
        spellings = param.opts + param.secondary_opts
        if any(s in STORAGE or s == "--storage-option" for s in spellings):
            continue
        if not any(re.search(rf"{re.escape(s)}(?![\w-])", row) for s in spellings):
            missing.append("/".join(spellings))
    assert missing == [], f"shardstream {name}'s row in docs/reference/cli.md lacks {missing}"


def test_the_storage_options_every_command_takes_are_named_once():
    text = (DOCS / "reference" / "cli.md").read_text()
    below = text[text.index("Every command takes") :]
    assert all(f"`{option}" in below for option in STORAGE)
    for command in commands().values():
        assert {"--endpoint-url", "--anon", "--profile", "--trust-root"} <= {
            s for p in command.params for s in getattr(p, "opts", [])
        }


def test_every_command_a_page_shows_exists():
    shown = re.compile(r"`shardstream ([a-z][\w-]*)|^\s*(?:\$ )?shardstream ([a-z][\w-]*)", re.M)
    known = set(commands())
    wrong = []
    for page in pages():
        text = page.read_text()
        inline = [m.group(1) for m in shown.finditer(text) if m.group(1)]
        blocks = re.findall(r"^```(?:bash|sh|console|text)?\n(.*?)^```", text, re.M | re.S)
        fenced = [m.group(2) for b in blocks for m in shown.finditer(b) if m.group(2)]
        wrong += [f"{page.relative_to(ROOT)}: shardstream {w}" for w in inline + fenced]
    assert [w for w in wrong if w.rsplit(" ", 1)[1] not in known] == []


def test_make_test_is_described_as_the_makefile_runs_it():
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    runs = recipe.group(1)
    assert "ruff check" in runs and "mkdocs build --strict" in runs and "pytest" in runs
    for page in (ROOT / "README.md", DOCS / "getting-started.md"):
        (line,) = re.findall(r"^make test +# (.*)$", page.read_text(), re.M)
        assert "ruff" in line and "docs" in line and "test suite" in line, (page, line)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_package_is_newer_than_every_release_the_pages_call_old():
    current = _version(ss.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## (\d+\.\d+\.\d+)\s*$", changelog, re.M)
    unreleased = changelog.index("## Unreleased") < changelog.index(f"## {released[0]}")
    # changes since the last release: the package says a newer version than that release
    assert current > _version(released[0]) if unreleased else current == _version(released[0])
    older = re.compile(r"(?:shardstream\s+)?(\d+\.\d+\.\d+) and older")
    for page in pages():
        for found in older.findall(page.read_text()):
            assert _version(found) < current, (
                f"{page.name} calls {found} old; the package says {current}"
            )


def test_the_format_page_says_sample_indexes_are_written_by_default():
    assert inspect.signature(ss.pack).parameters["index"].default is True
    text = " ".join((DOCS / "design" / "format.md").read_text().split())
    paragraph = text[text.index("A sample index (") :]
    assert "written by every pack" in paragraph and "--no-index" in paragraph
    assert "only when asked" not in text
