"""Sample fields into stored bytes: keys and field names checked, values encoded by extension."""

from __future__ import annotations

import io
import json
import re
from typing import Any

from ..errors import EncodeError

# C0 and C1 control characters and DEL: terminals act on them, and tar tools print them raw.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _text_problem(name: str) -> str | None:
    control = _CONTROL.search(name)
    if control is not None:
        return f"contains the control character U+{ord(control.group()):04X}"
    return _unicode_problem(name)


def _unicode_problem(name: str) -> str | None:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate?)"
    return None


def key_problem(key: object, fmt: str) -> str | None:
    """What keeps ``key`` from being a sample key of ``fmt`` shards (None when it is fine).

    In tar shards a key is the start of member names, which ``tar -xf`` and ``tarfile`` turn
    into paths: it must be a relative path that stays inside the folder it is extracted to
    (no leading '/', no empty, '.' or '..' segment, no backslash), without control characters,
    and its last segment must hold no '.', since readers split the field name off at the first.
    """
    if not isinstance(key, str) or not key:
        return "must be a non-empty string"
    if not fmt.startswith("tar"):
        # Arrow: any other text
        return "contains a NUL character" if "\0" in key else _unicode_problem(key)
    if key.startswith("__"):
        return "starts with '__', which tar readers (webdataset, shardstream) take for metadata and skip"
    if (
        key.isprintable()
        and "." not in key
        and "\\" not in key
        and "//" not in key
        and key[0] != "/"
        and key[-1] != "/"
    ):
        return None  # the common case, in a few string scans; the rules in detail below
    problem = _text_problem(key)
    if problem is not None:
        return problem
    if "\\" in key:
        return "contains a backslash, which Windows tools take for a folder separator"
    if key.startswith("/"):
        return "starts with '/', so extracting the shard would write outside the target folder"
    segments = key.split("/")
    if ".." in segments:
        return "has a '..' segment, so extracting the shard would write outside the target folder"
    if "" in segments or "." in segments:
        return (
            "has an empty or '.' segment ('//', '/./' or a trailing '/'), which tar tools rewrite"
        )
    if "." in segments[-1]:
        return (
            "has a '.' after its last '/', and tar readers take the first '.' there as the start of "
            "the field name"
        )
    return None


def field_problem(name: object) -> str | None:
    """What keeps ``name`` from being a field name of tar shards (the part of a member name after the key)."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    if "/" in name or "\\" in name:
        return "contains a '/' or a backslash, which tar tools take for a folder separator"
    return _text_problem(name)


def check_name(name: str, what: str) -> None:
    """Refuse a field name of a tar shard that tar tools could not store or extract as it is."""
    problem = field_problem(name)
    if problem is not None:
        raise EncodeError(f"{what} {name!r} {problem}; rename it")


def check_key(key: str, fmt: str) -> str:
    """A sample key that is safe to extract and that WebDataset readers split the same way we do."""
    problem = key_problem(key, fmt)
    if problem is not None:
        raise EncodeError(f"sample key {key!r} {problem}; rename the key")
    return key


def encode_field(key: str, field: str, value: Any) -> bytes | memoryview:
    """The bytes stored for ``field`` of sample ``key`` in a tar shard.

    bytes-likes are stored as they are; ``str`` as UTF-8; numbers as text; dicts and lists
    as JSON (for ``*json`` fields); numpy arrays as ``.npy`` (for ``*npy``); torch tensors
    with ``torch.save`` (for ``*pth``/``*pt``); PIL images encoded by the field's extension.
    """
    try:
        return _encode(key, field, value)
    except EncodeError:
        raise
    except Exception as exc:  # encoders (json, numpy, torch, Pillow) raise many types
        raise EncodeError(
            f"sample {key!r}, field {field!r}: cannot encode the {type(value).__name__}: {exc}"
        ) from exc


def _encode(key: str, field: str, value: Any) -> bytes | memoryview:
    if isinstance(value, (bytes, bytearray)):
        return value
    if isinstance(value, memoryview):
        return value.cast("B") if value.c_contiguous else value.tobytes()
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bool, int, float)):
        return str(value).encode()
    ext = field.rsplit(".", 1)[-1].lower()
    if type(value).__module__ == "numpy":  # imported only when given numpy values
        import numpy as np

        if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_, np.void)):
            return str(value.item()).encode()
    if isinstance(value, (dict, list, tuple)) and ext == "json":
        return json.dumps(value, ensure_ascii=False).encode("utf-8")
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray" and ext == "npy":
        import numpy as np

        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if type(value).__module__.startswith("torch") and ext in ("pth", "pt"):
        import torch

        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    if type(value).__module__.startswith("PIL.") and hasattr(value, "save"):
        kind = {
            "jpg": "JPEG",
            "jpeg": "JPEG",
            "png": "PNG",
            "webp": "WEBP",
            "bmp": "BMP",
            "tiff": "TIFF",
        }.get(ext)
        if kind:
            buf = io.BytesIO()
            value.save(buf, format=kind)
            return buf.getvalue()
    raise EncodeError(
        f"sample {key!r}, field {field!r}: cannot store a {type(value).__name__} under this name; "
        "give bytes or str, a dict/list in a '.json' field, a numpy array in '.npy', a tensor in "
        "'.pth', or a PIL image in '.jpg'/'.png'"
    )


def value_type(value: Any) -> str:
    """What the manifest records for a tar field's value, so that readers can give back the type that
    was written (tar members are only bytes): ``"int"``, ``"float"``, ``"bool"``, ``"str"`` or ``"bytes"``."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    return "str" if isinstance(value, (str, np.str_)) else "bytes"


def merge_types(known: dict[str, str], fields: dict[str, Any]) -> None:
    """Record each field's :func:`value_type` in ``known``; a field seen with two types becomes bytes."""
    for name, value in fields.items():
        kind = value_type(value)
        if known.setdefault(name, kind) != kind:
            known[name] = "bytes"
