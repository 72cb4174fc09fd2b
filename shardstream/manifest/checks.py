"""Whole-column checks of a manifest's shard paths and checksums, joined into strings a few thousand
at a time, so that a manifest of a million shards is checked in well under a second."""

from __future__ import annotations

import re
from typing import Any

# Shard paths: no C0/C1 control character, DEL, backslash or lone surrogate, no percent-encoded
# '.', '/', '\' or NUL (HTTP servers decode them); the same rules as bytes for the joined check.
_BAD_PATH_CHAR = re.compile(r"[\x00-\x1f\x7f-\x9f\\\ud800-\udfff]")
_PATH_BYTES = bytes(sorted(set(range(0x20, 0x100)) - {0x5C, 0x7F})) + b"\n"
_C1_UTF8, _ENCODED_UTF8 = re.compile(rb"\xc2[\x80-\x9f]"), re.compile(rb"%(?:2[eEfF]|5[cC]|00)")
_CHUNK = 1 << 14  # columns are checked in pieces that stay in the CPU's cache
_NEWLINES = b"\n" * _CHUNK


def path_problem(path: object) -> str | None:
    """What keeps ``path`` from being a shard path (relative, '/'-separated, inside the dataset's
    folder, no control character or backslash, nothing an HTTP server decodes), or None."""
    if not isinstance(path, str):
        return f"is {kind_of(path)}, not a string"
    if not path:
        return "is empty"
    bad = _BAD_PATH_CHAR.search(path)
    if bad is not None:
        return (
            "contains a backslash"
            if bad.group() == "\\"
            else f"contains the character U+{ord(bad.group()):04X}"
        )
    if "://" in path or path.startswith("/"):
        return (
            f"is {'a URL' if '://' in path else 'absolute'}, not a path inside the dataset's folder"
        )
    if _ENCODED_UTF8.search(path.encode()):
        return "contains a percent-encoded '.', '/', '\\' or NUL"
    segments = path.split("/")
    if ".." in segments or "." in segments:
        return "has a '.' or '..' segment; shard paths stay inside the dataset's folder"
    return "has an empty segment ('//' or a trailing '/')" if "" in segments else None


def paths_fine(paths: list[Any]) -> bool:
    """Whether all ``paths`` pass :func:`path_problem`, checked as joined strings of a few thousand."""
    import numpy as np

    for start in range(0, len(paths), _CHUNK):
        part = paths[start : start + _CHUNK]
        try:
            raw = "\n".join(part).encode("utf-8")
        except (TypeError, UnicodeEncodeError):  # not a string, or a lone surrogate
            return False
        if raw.count(b"\n") != len(part) - 1 or raw.translate(None, _PATH_BYTES):
            return False
        if b"\xc2" in raw and _C1_UTF8.search(raw) or b"%" in raw and _ENCODED_UTF8.search(raw):
            return False
        framed = np.frombuffer(b"\n" + raw + b"\n", np.uint8)
        # every segment lies between two of these
        ends = np.flatnonzero((framed == 10) | (framed == 47))
        size = np.diff(ends)
        short = size <= 3
        at, size = ends[:-1][short], size[short]
        if (size == 1).any() or (
            (framed[at + 1] == 46) & ((size == 2) | (framed[at + 2] == 46))
        ).any():
            return False
    return True


def checksums_fine(sha: list[Any]) -> list[str] | None:
    """``sha`` in lower case if each is 64 hex digits, checked as joined strings; else None."""
    out: list[str] = []
    for start in range(0, len(sha), _CHUNK):
        part = sha[start : start + _CHUNK]
        lines = _NEWLINES[: len(part) - 1]
        try:
            joined = "\n".join(part)
            raw = joined.encode("ascii")
        except (TypeError, UnicodeEncodeError):
            return None
        if len(raw) != 65 * len(part) - 1 or raw[64::65] != lines:  # 64 characters each
            return None
        rest = raw.translate(None, b"0123456789abcdef")
        if rest != lines:
            if rest.translate(None, b"ABCDEF") != lines:
                return None
            part = joined.lower().split("\n")  # upper case: accepted, kept lower
        out += part
    return out


def kind_of(value: object) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), f"a {type(value).__name__}")
