"""What can be packed: a folder tree (ImageFolder or WebDataset-style) or a table.

Listing is deterministic: names are sorted, hidden files and folders (a leading
``.``) are skipped and counted, symbolic links are followed (with loop detection),
and anything that cannot be read stops the pack with an error naming the path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..errors import SourceError
from ..storage import describe_os_error

TABLE_SUFFIXES = {
    ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "json", ".ndjson": "json",
    ".arrow": "ipc", ".feather": "ipc", ".ipc": "ipc",
}
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}
LAYOUTS = ("auto", "imagefolder", "files", "table")
NO_EXTENSION_FIELD = "bin"


@dataclass
class FileSample:
    """One sample of a folder source: its key and (field, path, size) per file, sorted by field."""

    key: str
    files: list[tuple[str, str, int]]
    label: int | None = None  # ImageFolder class index, stored as the ``cls`` field


@dataclass
class FolderSource:
    root: str
    layout: str  # "imagefolder" or "files"
    samples: list[FileSample]
    classes: list[str] | None
    skipped_hidden: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(size for s in self.samples for _, _, size in s.files)


@dataclass
class TableSource:
    root: str
    format: str  # pyarrow.dataset format name
    files: list[str] = field(default_factory=list)

    def dataset(self):
        """A ``pyarrow.dataset`` over the files, with the union of their columns.

        Columns that only some files have are kept (null elsewhere); types that cannot be
        reconciled stop the pack naming the odd file.
        """
        import pyarrow as pa
        import pyarrow.dataset as pads

        schema = None
        for path in self.files:
            try:
                file_schema = pads.dataset(path, format=self.format).schema
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise SourceError(f"cannot read table {path}: {one_line(exc)}") from exc
            try:
                schema = file_schema if schema is None else pa.unify_schemas(
                    [schema, file_schema], promote_options="permissive")
            except (pa.ArrowException, TypeError) as exc:
                raise SourceError(
                    f"table {path} has columns whose types differ from the files before it: {one_line(exc)}"
                ) from exc
        return pads.dataset(self.files, format=self.format, schema=schema)


def one_line(exc: BaseException) -> str:
    """An exception's message on one printable line (pyarrow's span several)."""
    text = " ".join(str(exc).split())
    return "".join(ch for ch in text if ch.isprintable()) or type(exc).__name__


def _walk(root: str) -> tuple[list[tuple[str, str, int]], int]:
    """(relative posix path, path, size) of every non-hidden file under ``root``, sorted; hidden count."""
    out: list[tuple[str, str, int]] = []
    hidden = 0
    seen: set[str] = set()

    def visit(folder: str, rel: str) -> None:
        nonlocal hidden
        real = os.path.realpath(folder)
        if real in seen:
            raise SourceError(f"{folder}: symbolic links form a loop back to {real}; remove the link")
        seen.add(real)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise SourceError(f"cannot read folder {folder}: {describe_os_error(exc)}") from exc
        for entry in entries:
            if entry.name.startswith("."):
                hidden += 1
                continue
            relpath = f"{rel}{entry.name}"
            try:
                if entry.is_dir():
                    visit(entry.path, relpath + "/")
                elif entry.is_file():
                    out.append((relpath, entry.path, entry.stat().st_size))
                elif entry.is_symlink():
                    raise SourceError(f"cannot read {entry.path}: it is a broken symbolic link; fix or remove it")
                else:
                    raise SourceError(f"cannot pack {entry.path}: not a regular file or folder; remove it")
            except OSError as exc:
                raise SourceError(f"cannot read {entry.path}: {describe_os_error(exc)}") from exc
        seen.discard(real)

    visit(root, "")
    return out, hidden


def _split(relpath: str) -> tuple[str, str]:
    """(key, field) as WebDataset splits a file name; a file without extension becomes ``bin``."""
    slash = relpath.rfind("/") + 1
    dot = relpath.find(".", slash)
    if dot == -1:
        return relpath, NO_EXTENSION_FIELD
    return relpath[:dot], relpath[dot + 1 :]


def _group(files: list[tuple[str, str, int]]) -> list[FileSample]:
    samples: dict[str, dict[str, tuple[str, int]]] = {}
    for relpath, path, size in files:
        key, ext = _split(relpath)
        if ext.endswith(".") or not ext:
            raise SourceError(f"cannot pack {path}: its name ends with '.'; rename it")
        fields = samples.setdefault(key, {})
        if ext in fields:
            raise SourceError(
                f"{fields[ext][0]} and {path} both give field {ext!r} of sample {key!r} "
                f"(a file without extension is stored as '{NO_EXTENSION_FIELD}'); rename one of them"
            )
        fields[ext] = (path, size)
    return [
        FileSample(key, [(ext, p, n) for ext, (p, n) in sorted(fields.items())])
        for key, fields in sorted(samples.items())
    ]


def open_source(path: str, layout: str = "auto") -> FolderSource | TableSource:
    """Find out what ``path`` holds and list it; a :class:`SourceError` if it cannot be packed."""
    if layout not in LAYOUTS:
        raise SourceError(f"unknown layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    if "://" in path and not path.startswith("file://"):
        raise SourceError(f"{path}: pack reads sources from local folders and files; copy it here first")
    path = path[len("file://"):] if path.startswith("file://") else path
    if not os.path.exists(path):
        kind = "broken symbolic link" if os.path.islink(path) else "no such file or folder"
        raise SourceError(f"source {path} does not exist ({kind})")
    if os.path.isfile(path):
        suffix = os.path.splitext(path)[1].lower()
        if suffix not in TABLE_SUFFIXES or layout in ("imagefolder", "files"):
            raise SourceError(
                f"cannot pack the file {path}: give a folder, or a table file "
                f"({', '.join(sorted(TABLE_SUFFIXES))})"
            )
        return TableSource(path, TABLE_SUFFIXES[suffix], [path])
    files, hidden = _walk(path)
    if not files:
        extra = f" ({hidden} hidden entries skipped)" if hidden else ""
        raise SourceError(f"source folder {path} is empty: no files to pack{extra}")
    suffixes = {os.path.splitext(rel)[1].lower() for rel, _, _ in files}
    is_table = suffixes <= TABLE_SUFFIXES.keys()
    if layout == "table" or (layout == "auto" and is_table):
        formats = {TABLE_SUFFIXES.get(s) for s in suffixes}
        if not is_table or len(formats) != 1:
            raise SourceError(
                f"source folder {path} must hold table files of one kind for layout 'table' "
                f"(found {', '.join(sorted(s or '(none)' for s in suffixes))})"
            )
        return TableSource(path, formats.pop(), [p for _, p, _ in files])
    in_class_dirs = all(rel.count("/") == 1 for rel, _, _ in files)
    if layout == "auto":
        layout = "imagefolder" if in_class_dirs and suffixes <= IMAGE_SUFFIXES else "files"
    if layout == "imagefolder":
        if not in_class_dirs:
            bad = next(rel for rel, _, _ in files if rel.count("/") != 1)
            raise SourceError(
                f"{os.path.join(path, bad)} is not in a class folder: an ImageFolder tree is "
                "root/<class>/<file>; use --layout files for other trees"
            )
        classes = sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
        samples = _group(files)
        index = {c: i for i, c in enumerate(classes)}
        for s in samples:
            if any(ext == "cls" for ext, _, _ in s.files):
                raise SourceError(f"{s.files[0][1]}: sample {s.key!r} already has a 'cls' file; use --layout files")
            s.label = index[s.key.split("/", 1)[0]]
        return FolderSource(path, "imagefolder", samples, classes, hidden)
    return FolderSource(path, "files", _group(files), None, hidden)
