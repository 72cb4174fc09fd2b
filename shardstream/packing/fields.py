"""Sample fields into stored bytes: keys and field names checked, values encoded by extension."""

from __future__ import annotations

import io
import json
from typing import Any

from ..errors import EncodeError


def check_name(name: str, what: str) -> None:
    if "\0" in name:
        raise EncodeError(f"{what} {name!r} contains a NUL character, which tar names cannot hold; remove it")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError(f"{what} {name!r} is not valid Unicode (a lone surrogate?); fix the name") from None


def check_key(key: str, fmt: str) -> str:
    """A sample key that WebDataset readers split the same way we do."""
    if not isinstance(key, str) or not key:
        raise EncodeError(f"sample key {key!r} must be a non-empty string")
    check_name(key, "sample key")
    if fmt.startswith("tar"):
        base = key.rsplit("/", 1)[-1]
        if "." in base or not base:
            raise EncodeError(
                f"sample key {key!r}: the part after the last '/' must be non-empty and contain no '.', "
                "since tar readers take the first '.' as the start of the field name; rename the key"
            )
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
        raise EncodeError(f"sample {key!r}, field {field!r}: cannot encode the {type(value).__name__}: {exc}") from exc


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
        kind = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP", "tiff": "TIFF"}.get(ext)
        if kind:
            buf = io.BytesIO()
            value.save(buf, format=kind)
            return buf.getvalue()
    raise EncodeError(
        f"sample {key!r}, field {field!r}: cannot store a {type(value).__name__} under this name; "
        "give bytes or str, a dict/list in a '.json' field, a numpy array in '.npy', a tensor in "
        "'.pth', or a PIL image in '.jpg'/'.png'"
    )
