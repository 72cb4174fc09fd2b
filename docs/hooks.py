"""MkDocs hooks: new guide pages join the nav by themselves, and the changelog is the repository's own."""

from __future__ import annotations

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
