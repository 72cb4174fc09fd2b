"""Folder sources: a tree of files grouped into samples the WebDataset way (``KEY.EXT``), or an
ImageFolder tree (``root/<class>/<file>``) whose class folders become an integer ``cls`` field.

Listing is deterministic: names are sorted, hidden files and folders (a leading
``.``) are skipped and counted, symbolic links are followed (with loop detection),
and anything that cannot be read stops the pack with an error naming the path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import SourceError
from ..formats.media_header import MEDIA_EXTENSIONS
from ..storage import describe_os_error

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff", ".ppm", ".pgm"}
# video and audio: class folders of them are ImageFolder trees too (each sample's cls, the classes)
MEDIA_SUFFIXES = {f".{ext}" for ext in MEDIA_EXTENSIONS}
# what each sample of a class folder holds: an image, a video or an audio recording
CLASS_SUFFIXES = IMAGE_SUFFIXES | MEDIA_SUFFIXES
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
    # a folder in object storage: how workers reach its files
    storage_options: dict[str, Any] | None = None

    @property
    def total_bytes(self) -> int:
        return sum(size for s in self.samples for _, _, size in s.files)


def walk(root: str) -> tuple[list[tuple[str, str, int]], int]:
    """(relative posix path, path, size) of every non-hidden file under ``root``, sorted; hidden count."""
    out: list[tuple[str, str, int]] = []
    hidden = 0
    seen: set[str] = set()

    def visit(folder: str, rel: str) -> None:
        nonlocal hidden
        real = os.path.realpath(folder)
        if real in seen:
            raise SourceError(
                f"{folder}: symbolic links form a loop back to {real}; remove the link"
            )
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
                    raise SourceError(
                        f"cannot read {entry.path}: it is a broken symbolic link; fix or remove it"
                    )
                else:
                    raise SourceError(
                        f"cannot pack {entry.path}: not a regular file or folder; remove it"
                    )
            except OSError as exc:
                raise SourceError(f"cannot read {entry.path}: {describe_os_error(exc)}") from exc
        seen.discard(real)

    visit(root, "")
    return out, hidden


def split_name(relpath: str) -> tuple[str, str]:
    """(key, field) as WebDataset splits a file name; a file without extension becomes ``bin``.
    The field keeps the name's case; :func:`group` lowercases it."""
    slash = relpath.rfind("/") + 1
    dot = relpath.find(".", slash)
    if dot == -1:
        return relpath, NO_EXTENSION_FIELD
    return relpath[:dot], relpath[dot + 1 :]


def group(files: list[tuple[str, str, int]]) -> list[FileSample]:
    """Files into samples, sorted by key, each one's fields sorted (one pass and one sort)."""
    keyed: list[tuple[str, str, str, int]] = []
    for relpath, path, size in files:
        slash = relpath.rfind("/") + 1  # split_name, inline: this runs once per file of the tree
        dot = relpath.find(".", slash)
        key, ext = (
            (relpath, NO_EXTENSION_FIELD) if dot == -1 else (relpath[:dot], relpath[dot + 1 :])
        )
        if not ext or ext[-1] == ".":
            raise SourceError(f"cannot pack {path}: its name ends with '.'; rename it")
        # fields as webdataset names them: ImageNet's .JPEG is batch["jpeg"]
        keyed.append((key, ext.lower(), path, size))
    keyed.sort(key=lambda k: (k[0], k[1]))  # stable: two files of one field stay in listing order
    samples: list[FileSample] = []
    fields: list[tuple[str, str, int]] = []
    last_key = last_path = None
    for key, ext, path, size in keyed:
        if key != last_key:
            fields = [(ext, path, size)]
            samples.append(FileSample(key, fields))
        elif ext == fields[-1][0]:
            raise SourceError(
                f"{last_path} and {path} both give field {ext!r} of sample {key!r} (field names are "
                f"lower case; a file without extension is stored as '{NO_EXTENSION_FIELD}'); rename one of them"
            )
        else:
            fields.append((ext, path, size))
        last_key, last_path = key, path
    return samples


def image_folder(path: str, files: list[tuple[str, str, int]], hidden: int) -> FolderSource:
    """An ImageFolder tree: every file in a class folder; class indices in sorted order, as torchvision's."""
    bad = next((rel for rel, _, _ in files if rel.count("/") != 1), None)
    if bad is not None:
        raise SourceError(
            f"{os.path.join(path, bad)} is not in a class folder: an ImageFolder tree is "
            "root/<class>/<file>; use --layout files for other trees"
        )
    if "://" in path:  # a bucket has no empty folders: its classes are the folders that hold files
        classes = sorted({rel.split("/", 1)[0] for rel, _, _ in files})
    else:
        classes = sorted(
            e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith(".")
        )
    samples = group(files)
    index = {c: i for i, c in enumerate(classes)}
    # not images (or videos, or recordings) alone: each sample
    if not {f".{ext}" for s in samples for ext, _, _ in s.files} <= CLASS_SUFFIXES:
        imageless = [
            s for s in samples if not any(f".{ext}" in CLASS_SUFFIXES for ext, _, _ in s.files)
        ]
        # class folders of images with strays among them
        if imageless and len(imageless) < len(samples):
            raise SourceError(
                f"{imageless[0].files[0][1]}: sample {imageless[0].key!r} has no image, video or audio "
                "file, unlike the other samples of this ImageFolder; remove the file, or pack with "
                "--layout files"
            )
        for s in samples:
            if any(ext == "cls" for ext, _, _ in s.files):
                raise SourceError(
                    f"{s.files[0][1]}: sample {s.key!r} already has a 'cls' file; use --layout files"
                )
    for s in samples:
        s.label = index[s.key[: s.key.index("/")]]
    return FolderSource(path, "imagefolder", samples, classes, hidden)


def file_tree(path: str, files: list[tuple[str, str, int]], hidden: int) -> FolderSource:
    """Any tree: files grouped into samples by key, one field per extension."""
    return FolderSource(path, "files", group(files), None, hidden)
