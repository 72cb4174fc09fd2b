"""What can be packed, found by a registry of lazy imports (like fsspec's protocol table).

Each kind of source is a dotted path to the function that lists it, imported only when a
pack uses it, with the install hint to give when its library is missing. Every source lists
its samples in a deterministic order; ``open_source`` works out which layout a path holds.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import SourceError
from .folder import CLASS_SUFFIXES, FileSample, FolderSource, walk
from .remote import arrow_filesystem, is_remote, walk_remote
from .table import TABLE_SUFFIXES, TableSource, sample_permutation

LAYOUTS = ("auto", "imagefolder", "files", "table", "hdf5", "lmdb", "numpy", "hf", "shards")
# listed by their own modules, which take options
SAMPLE_LAYOUTS = (
    "hdf5",
    "lmdb",
    "numpy",
    "hf",
    "shards",
)
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst")


@dataclass(frozen=True)
class SourceKind:
    """One kind of source: ``target`` (``"module:function"``) lists it; ``requires`` names the
    modules it imports, and ``install`` how to get them."""

    target: str
    requires: tuple[str, ...] = ()
    install: str = ""

    def load(self, name: str) -> Callable[..., Any]:
        for module in self.requires:
            try:
                importlib.import_module(module)
            except ImportError:
                raise SourceError(
                    f"{name} sources need the {module!r} package; install it with: {self.install}"
                ) from None
        module, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module), attr)


REGISTRY: dict[str, SourceKind] = {
    "imagefolder": SourceKind("shardstream.sources.folder:image_folder"),
    "files": SourceKind("shardstream.sources.folder:file_tree"),
    "table": SourceKind(
        "shardstream.sources.table:TableSource", ("pyarrow",), "pip install pyarrow"
    ),
    # token shards: text or token files
    "text": SourceKind("shardstream.sources.text:open_text_source"),
    "hdf5": SourceKind(
        "shardstream.sources.hdf5:open_hdf5_source", ("h5py",), "pip install 'shardstream[hdf5]'"
    ),
    "lmdb": SourceKind(
        "shardstream.sources.lmdbs:open_lmdb_source", ("lmdb",), "pip install 'shardstream[lmdb]'"
    ),
    "numpy": SourceKind("shardstream.sources.numpy_arrays:open_numpy_source"),
    "hf": SourceKind("shardstream.sources.hf:open_hf_source", ("pyarrow",), "pip install pyarrow"),
    # WebDataset tars, shardstream datasets
    "shards": SourceKind("shardstream.sources.shards:open_shards_source"),
}


def detect_layout(path: str) -> str | None:
    """Which of :data:`SAMPLE_LAYOUTS` the file or folder ``path`` holds, by its names alone; None if none."""
    lower = path.lower().rstrip("/")
    if os.path.isfile(path):
        if lower.endswith((".h5", ".hdf5", ".he5")):
            return "hdf5"
        if lower.endswith(".npy"):
            return "numpy"
        if lower.endswith(".mdb"):
            return "lmdb"
        return "shards" if lower.endswith(_TAR_SUFFIXES) else None
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError:
        return None
    if "_manifest.json" in names:
        return "shards"
    if "data.mdb" in names:
        return "lmdb"
    if "dataset_dict.json" in names or {"state.json", "dataset_info.json"} <= set(names):
        return "hf"
    files = [n for n in names if os.path.isfile(os.path.join(path, n))]
    if files and len(files) == len(names):
        if all(n.lower().endswith(".npy") for n in files):
            return "numpy"
        if all(n.lower().endswith(_TAR_SUFFIXES) for n in files):
            return "shards"
    return None


def open_source(
    path: str, layout: str = "auto", storage_options: dict[str, Any] | None = None, **options: Any
) -> Any:
    """Find out what ``path`` holds and list it; a :class:`SourceError` if it cannot be packed.

    ``options`` go to the HDF5, LMDB, NumPy, Hugging Face and shard sources (``fields``, ``field_name``,
    ``decode_value``: see their modules); folders and tables take none."""
    if layout not in LAYOUTS:
        raise SourceError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if is_remote(path):
        return _open_remote(path, layout, storage_options, options)
    path = path[len("file://") :] if path.startswith("file://") else path
    if not os.path.exists(path):
        kind = "broken symbolic link" if os.path.islink(path) else "no such file or folder"
        raise SourceError(f"source {path} does not exist ({kind})")
    sample_layout = (
        layout if layout in SAMPLE_LAYOUTS else detect_layout(path) if layout == "auto" else None
    )
    if sample_layout is not None:
        return _open_samples(sample_layout, path, options)
    if options:
        raise SourceError(
            f"{', '.join(sorted(options))} apply to HDF5, LMDB and NumPy sources, not to {path}"
        )
    if os.path.isfile(path):
        return _open_table_file(path, layout)
    return _open_folder(path, layout)


def _open_samples(layout: str, path: str, options: dict[str, Any]) -> Any:
    """A source of samples of one of :data:`SAMPLE_LAYOUTS` (HDF5, LMDB, NumPy, Hugging Face, shards)."""
    lister = REGISTRY[layout].load(layout)
    unknown = sorted(set(options) - set(inspect.signature(lister).parameters))
    if unknown:
        raise SourceError(f"{', '.join(unknown)} do not apply to {path}, a {layout} source")
    return lister(path, **options)


def _open_table_file(path: str, layout: str) -> Any:
    """One table file (Parquet, CSV, JSON lines, Arrow)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TABLE_SUFFIXES or layout in ("imagefolder", "files"):
        raise SourceError(
            f"cannot pack the file {path}: give a folder, or a table file "
            f"({', '.join(sorted(TABLE_SUFFIXES))})"
        )
    return REGISTRY["table"].load("table")(path, TABLE_SUFFIXES[suffix], [path])


def _open_folder(path: str, layout: str) -> Any:
    """A local folder: of table files, of class folders of images (ImageFolder), or of files grouped by key."""
    files, hidden = walk(path)
    if not files:
        extra = f" ({hidden} hidden entries skipped)" if hidden else ""
        raise SourceError(f"source folder {path} is empty: no files to pack{extra}")
    # os.path.splitext's suffixes (no name starts with a dot: hidden files are not listed)
    suffixes = {
        rel[dot:].lower() if (dot := rel.rfind(".")) > rel.rfind("/") else "" for rel, _, _ in files
    }
    is_table = suffixes <= TABLE_SUFFIXES.keys()
    if layout == "table" or (layout == "auto" and is_table):
        formats = {TABLE_SUFFIXES.get(s) for s in suffixes}
        if not is_table or len(formats) != 1:
            raise SourceError(
                f"source folder {path} must hold table files of one kind for layout 'table' "
                f"(found {', '.join(sorted(s or '(none)' for s in suffixes))})"
            )
        return REGISTRY["table"].load("table")(path, formats.pop(), [p for _, p, _ in files])
    in_class_dirs = all(rel.count("/") == 1 for rel, _, _ in files)
    if layout == "auto":
        layout = "imagefolder" if in_class_dirs and suffixes <= CLASS_SUFFIXES else "files"
        if layout == "files":
            _refuse_strays(path, files)
    return REGISTRY[layout].load(layout)(path, files, hidden)


def _open_remote(
    url: str, layout: str, storage_options: dict[str, Any] | None, options: dict[str, Any]
) -> FolderSource | TableSource:
    """A folder tree or tables in object storage (``storage_options`` reach them), listed through fsspec."""
    if layout not in ("auto", "imagefolder", "files", "table") or options:
        raise SourceError(
            f"{url}: sources in object storage are folder trees and tables (layout auto, imagefolder, "
            "files or table); copy other sources to a local folder first"
        )
    files, hidden = walk_remote(url, storage_options)
    if not files:
        raise SourceError(f"source {url} holds no objects to pack (it is empty or does not exist)")
    # os.path.splitext's suffixes (no name starts with a dot: hidden files are not listed)
    suffixes = {
        rel[dot:].lower() if (dot := rel.rfind(".")) > rel.rfind("/") else "" for rel, _, _ in files
    }
    formats = {TABLE_SUFFIXES.get(s) for s in suffixes}
    if layout == "table" or (layout == "auto" and suffixes <= TABLE_SUFFIXES.keys()):
        if len(formats) != 1 or None in formats:
            raise SourceError(
                f"source {url} must hold table files of one kind for layout 'table' "
                f"(found {', '.join(sorted(s or '(none)' for s in suffixes))})"
            )
        filesystem, _ = arrow_filesystem(url, storage_options)
        paths = [u.split("://", 1)[1] for _, u, _ in files]
        return REGISTRY["table"].load("table")(url, formats.pop(), paths, filesystem)
    if layout == "auto":
        in_class_dirs = all(rel.count("/") == 1 for rel, _, _ in files)
        layout = "imagefolder" if in_class_dirs and suffixes <= CLASS_SUFFIXES else "files"
        if layout == "files":
            _refuse_strays(url, files)
    source = REGISTRY[layout].load(layout)(url, files, hidden)
    source.storage_options = dict(storage_options or {})
    return source


def _fits_image_folder(rel: str) -> bool:
    return rel.count("/") == 1 and os.path.splitext(rel)[1].lower() in CLASS_SUFFIXES


def _refuse_strays(path: str, files: list[tuple[str, str, int]]) -> None:
    """A tree that is an ImageFolder but for a few files (a README, a nested folder) is not silently
    packed as plain files, without classes: the error names the first stray file."""
    fits = sum(_fits_image_folder(rel) for rel, _, _ in files)
    strays = [rel for rel, _, _ in files if not _fits_image_folder(rel)]
    if fits >= 2 and len(strays) <= max(2, len(files) // 10):
        raise SourceError(
            f"{os.path.join(path, strays[0])} does not fit the ImageFolder layout (root/<class>/<image>) that "
            f"{fits} other files follow ({len(strays)} stray file{'s' if len(strays) != 1 else ''}); remove "
            "the strays, or pass --layout files to pack every file without classes"
        )


__all__ = [
    "LAYOUTS",
    "REGISTRY",
    "SAMPLE_LAYOUTS",
    "detect_layout",
    "FileSample",
    "FolderSource",
    "SourceKind",
    "TableSource",
    "open_source",
    "sample_permutation",
]
