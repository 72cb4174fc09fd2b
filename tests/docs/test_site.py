"""The documentation site's checks that MkDocs does not make: nothing of the old one-page README was
lost (each of its headings and where it went), every public name is on the API page with each of its
arguments described, the README stays a front page, and the nav reaches every page."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

import shardstream as ss
from tests.docs.markdown import DOCS, ROOT

# Every heading of the README before it became a front page, the page it went to, and a phrase of
# its first lines that must still be on that page (whitespace aside): nothing lost on the way.
MOVED = [
    ("# shardstream", "index.md", "plus one small JSON manifest that is written last"),
    ("## Two commands", "getting-started.md", "`make test` is what CI runs (`.ci/run`)"),
    ("## Quick start", "getting-started.md", "shardstream index 'old/shards-{000000..000099}.tar'"),
    (
        "## What can be packed",
        "guides/packing.md",
        "Choose explicitly with `--layout imagefolder|files|table`",
    ),
    (
        "### HDF5, LMDB, NumPy, Hugging Face datasets, existing shards",
        "guides/packing.md",
        "These sources are read in the worker processes, a chunk of samples per job",
    ),
    ("### Pack from a function", "guides/packing.md", "maps `fn` over any list of inputs"),
    (
        "### Sources in object storage, and packing on a Ray cluster",
        "guides/packing.md",
        "A folder tree in a bucket packs like a local one",
    ),
    ("## The dataset on disk", "design/format.md", "Shard names carry the token of the pack run"),
    (
        "## Errors and guarantees",
        "guides/errors.md",
        "A dataset from someone else is untrusted input.",
    ),
    ("## Errors and guarantees", "design/trust-model.md", "**Tar shards are parsed strictly.**"),
    ("## Errors and guarantees", "design/trust-model.md", "**The shard cache heals itself**"),
    ("## Reading: `ShardDataset`", "guides/reading.md", "**Equal work on every rank.**"),
    (
        "## Training with Lightning, accelerate or torchdata",
        "guides/frameworks.md",
        "Each recipe is tested with the real library",
    ),
    (
        "## Token datasets for language models",
        "guides/tokens.md",
        "Pack a text corpus into token shards with one command",
    ),
    ("## Mixing datasets by weight", "guides/mixing.md", "reads several datasets as one stream"),
    ("## Feeding the GPU", "guides/gpu.md", "wraps any iterable of batches"),
    (
        "## Profiling the input pipeline: is the GPU waiting for data?",
        "guides/profiling.md",
        "Stats are always on",
    ),
    ("## Containers", "guides/containers.md", "`docker/` holds one image (`Dockerfile`)"),
    (
        "## Object storage: S3, GCS, S3-compatible stores, HTTP",
        "guides/object-storage.md",
        "**Whole shards, never a request per sample.**",
    ),
    ("## Command reference", "reference/cli.md", "Every command takes `--endpoint-url URL`"),
    ("## Benchmarks", "benchmarks/index.md", "Benchmarks compare against other tools"),
    (
        "### Packing (`benchmarks/pack.py`)",
        "benchmarks/packing.md",
        "| shardstream | 1.03 | 1.29 |",
    ),
    (
        "### Reading (`benchmarks/read.py`)",
        "benchmarks/reading.md",
        "| raw bytes, samples/s | **53,879** |",
    ),
    (
        "### Reading from S3 (`benchmarks/read.py --remote s3`)",
        "benchmarks/remote.md",
        "The same converted data uploaded (untimed) to a moto S3 server",
    ),
    (
        "#### Against SeaweedFS (`--remote seaweedfs`)",
        "benchmarks/remote.md",
        "## Against SeaweedFS",
    ),
    ("### Tokens (`benchmarks/tokens.py`)", "benchmarks/tokens.md", "| pack, tokens/s | 1.23 M |"),
    (
        "### Mixing (`benchmarks/mix.py`)",
        "benchmarks/mixing.md",
        "| shardstream `MixedDataset` | 30,046 |",
    ),
    (
        "### Manifest (`benchmarks/manifest.py`)",
        "benchmarks/manifest.md",
        "| local | head + table | 0.280 (0.34×) |",
    ),
    ("## Layout", "design/layout.md", "The package has one folder per stage of the pipeline"),
    ("## Development", "development.md", "Before a change lands: `make test`"),
]


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(("old", "page", "phrase"), MOVED, ids=[f"{m[0]} -> {m[1]}" for m in MOVED])
def test_every_old_readme_section_lives_on_in_the_site(old, page, phrase):
    assert flat(phrase) in flat((DOCS / page).read_text()), (
        f"{old!r} was moved to {page}, which lost it"
    )


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / page).is_file(), f"the README links to {page}, which does not exist"


def test_the_guides_cite_no_issues_commits_or_dates():
    """History belongs in CHANGELOG.md; the benchmark pages keep the dates and commits they measured."""
    cited = re.compile(r"\bissue \d+|\bcommit [0-9a-f]{7}\b|\b20\d\d-\d\d-\d\d\b", re.I)
    pages = [p for p in DOCS.rglob("*.md") if "benchmarks" not in p.parts]
    assert [
        f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in cited.finditer(p.read_text())
    ] == []


def test_every_public_name_is_on_the_api_page():
    api = (DOCS / "reference" / "api.md").read_text()
    rendered = set(re.findall(r"^::: shardstream\.(?:[\w.]*\.)?(\w+)$", api, re.M))
    assert set(ss.__all__) - {"__version__"} <= rendered
    assert "`shardstream.__version__`" in api


def described_arguments(doc: str) -> set[str]:
    """The names a Google-style ``Args:`` section describes (``**kwargs`` as ``kwargs``)."""
    section = re.search(r"^Args:\n(.*?)(?=^\S|\Z)", doc, re.M | re.S)
    if section is None:
        return set()
    return {
        name.lstrip("*") for name in re.findall(r"^    (\**\w+)[^:\n]*:", section.group(1), re.M)
    }


@pytest.mark.parametrize("name", [n for n in ss.__all__ if n != "__version__"])
def test_every_public_name_has_a_docstring_with_its_arguments(name):
    obj = getattr(ss, name)
    doc = inspect.getdoc(obj)
    assert doc and len(doc.split()) >= 5, (
        f"shardstream.{name} needs a docstring saying what and why"
    )
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return
    signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    wanted = {p for p in signature.parameters if p not in ("self", "cls") and not p.startswith("_")}
    assert wanted - described_arguments(doc) == set(), f"shardstream.{name}'s Args: lacks these"


def test_the_nav_names_pages_that_exist():
    nav = re.findall(
        r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M
    )
    assert len(nav) > 20
    assert [page for page in nav if not (DOCS / page).is_file() and page != "changelog.md"] == []


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict`` (which ``make test`` runs too): a broken link or anchor, a page outside
    the nav, a name the API page cannot find or a docstring that does not parse fails the build."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "--site-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert (tmp_path / "reference" / "api" / "index.html").is_file()


def test_a_guide_missing_from_the_nav_joins_the_guides_section(tmp_path):
    """A new ``docs/guides/<topic>.md`` shows up in the site without an edit of ``mkdocs.yml``."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    (tmp_path / "guides").mkdir()
    for name in ("reading.md", "parquet.md", "a-new-one.md"):
        (tmp_path / "guides" / name).write_text("# x\n")
    config = {
        "docs_dir": str(tmp_path),
        "nav": [{"Home": "index.md"}, {"Guides": ["guides/reading.md"]}],
    }
    hooks.on_config(config)
    assert config["nav"][1]["Guides"] == [
        "guides/reading.md",
        "guides/a-new-one.md",
        "guides/parquet.md",
    ]
