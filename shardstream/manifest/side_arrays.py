"""A checked NumPy side file: a flat array saved beside the manifest, named by its sha256 and checked against it.

The recorded image sizes (:mod:`.image_sizes`), media facts and media block digests (:mod:`.media_facts`)
are such files. Each is written once (``np.save``, no pickles), named by :func:`~.side_names.side_name`
from the sha256 of its bytes, and referenced from the manifest's head by ``{file, sha256, ...}``; a reader
checks the bytes against that sha256 before parsing them, since a dataset from someone else is untrusted.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ManifestError
from .side_names import side_name


def encode_array(array: np.ndarray, prefix: str, suffix: str) -> tuple[bytes, dict[str, str]]:
    """The side file of ``array`` and its reference (``{file, sha256}``) for the manifest's head."""
    sink = io.BytesIO()
    np.save(sink, array, allow_pickle=False)
    data = sink.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    return data, {"file": side_name(prefix, suffix, digest), "sha256": digest}


def load_array(ref: dict[str, Any], read: Callable[[str], bytes], fix: str) -> np.ndarray:
    """The array of the side file ``ref`` names (read with ``read``), after its sha256 is checked; a
    :class:`ManifestError` naming the file and ``fix`` otherwise."""
    name = ref["file"]
    data = bytes(read(name))
    if hashlib.sha256(data).hexdigest() != ref["sha256"]:
        raise ManifestError(
            f"{name} does not match its sha256 in the manifest (changed or damaged); {fix}"
        )
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ManifestError(f"{name} is not a NumPy array ({str(exc)[:80]}); {fix}") from None


__all__ = ["encode_array", "load_array"]
