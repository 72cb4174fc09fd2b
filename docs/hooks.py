"""MkDocs hooks: new guide pages join the nav by themselves, the changelog is the repository's own, and the
docstrings' Sphinx roles (``:class:`Name```) render as the code they name."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def _listed(entries: list) -> set[str]:
    """Every page path a nav (sub)list names, however deep."""
    found: set[str] = set()
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        if isinstance(value, list):
            found |= _listed(value)
        else:
            found.add(value)
    return found


def on_config(config, **kwargs):
    """Append the guides that ``nav`` does not list to its "Guides" section, sorted by file name."""
    nav = config["nav"]
    guides = next(entry["Guides"] for entry in nav if isinstance(entry, dict) and "Guides" in entry)
    listed = _listed(nav)
    for page in sorted((Path(config["docs_dir"]) / "guides").glob("*.md")):
        path = f"guides/{page.name}"
        if path not in listed:
            guides.append(path)
    return config


def on_files(files, config, **kwargs):
    """Serve ``CHANGELOG.md`` from the repository root as ``changelog.md``: one file, not two copies."""
    files.append(File.generated(config, "changelog.md", abs_src_path=str(ROOT / "CHANGELOG.md")))
    return files


# ":class:" and friends before a rendered ``Name`` (mkdocstrings renders the role's text as it is)
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj):(<code>)~?")


def on_page_content(html, page, **kwargs):
    """Drop the Sphinx role in front of each name the docstrings cite, keeping the name as code."""
    return SPHINX_ROLE.sub(r"\1", html)
