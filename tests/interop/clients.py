"""What the client tests share: a small image folder (the truth), how a client's samples are checked against
it, and what shardstream itself must still read and keep in its own namespace after a client ran."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = ["ant", "bee", "cat"]
PER_CLASS = 8
SAMPLES = len(CLASSES) * PER_CLASS


def make_images(root: Path) -> dict[str, dict[str, Any]]:
    """An ImageFolder tree of JPEGs of varied sizes under ``root``; returns the truth:
    ``{key: {"jpg": bytes, "cls": class index}}`` (classes in sorted order, as packs number them)."""
    from PIL import Image

    rng = np.random.default_rng(40)
    truth = {}
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(PER_CLASS):
            h, w = (int(x) for x in rng.integers(12, 40, size=2))
            pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, "JPEG", quality=90)
            (root / name / f"img_{i:03d}.jpg").write_bytes(buf.getvalue())
            truth[f"{name}/img_{i:03d}"] = {"jpg": buf.getvalue(), "cls": c}
    return truth


def as_bytes(value: Any) -> bytes | None:
    """A client's value of an image field as bytes: bytes-likes, file objects, Hugging Face Image structs
    (``{"bytes", "path"}``), numpy arrays of bytes."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, dict) and "bytes" in value:
        return as_bytes(value["bytes"])
    if hasattr(value, "getvalue"):
        return value.getvalue()
    if hasattr(value, "read"):
        return value.read()
    if isinstance(value, np.ndarray):
        return value.tobytes()
    raise TypeError(f"not bytes: {type(value).__name__}")


def as_label(value: Any) -> int:
    """A label as an int: bytes or text of digits (a tar's ``.cls`` member), or a number."""
    if not isinstance(value, (int, np.integer, str)):
        value = as_bytes(value)
    if isinstance(value, bytes):
        value = value.decode()
    return int(value)


def check_samples(
    samples: Any,
    truth: dict[str, dict[str, Any]],
    *,
    key: Any = "__key__",
    jpg: str = "jpg",
    cls: str = "cls",
) -> list[str]:
    """Assert that ``samples`` (dicts) are exactly the truth's: every key once, the image's bytes and the
    label equal. ``key``: the key's field, or a function of a sample. Returns the keys in the order read."""
    keys, got = [], {}
    for sample in samples:
        k = key(sample) if callable(key) else sample[key]
        keys.append(k)
        got[k] = (as_bytes(sample[jpg]), as_label(sample[cls]))
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} samples read twice"
    assert sorted(got) == sorted(truth), (
        f"missing {sorted(set(truth) - set(got))[:5]}, unknown {sorted(set(got) - set(truth))[:5]}"
    )
    wrong = [k for k in truth if got[k] != (truth[k]["jpg"], truth[k]["cls"])]
    assert wrong == [], f"{len(wrong)} samples differ in bytes or label, e.g. {wrong[:3]}"
    return keys


def shards_of(folder: Path) -> list[str]:
    """The full paths of the data files of the dataset in ``folder``, in manifest order."""
    from shardstream.manifest import load_manifest
    from shardstream.storage import Store

    return [str(folder / p) for p in load_manifest(Store(str(folder))).paths]


def outside_our_namespace(folder: Path) -> list[str]:
    """The entries of the dataset in ``folder`` that are neither its data files (or folders holding them)
    nor ``_``/``.``-prefixed: what a folder reader (Hugging Face, pyarrow, a glob) would take for data."""
    from shardstream.manifest import load_manifest
    from shardstream.storage import Store

    data = set(load_manifest(Store(str(folder))).paths)
    holders = {"/".join(p.split("/")[:i]) for p in data for i in range(1, p.count("/") + 1)}
    found = []
    for top, dirs, files in os.walk(folder):
        rel = os.path.relpath(top, folder).replace(os.sep, "/")
        rel = "" if rel == "." else rel + "/"
        for d in list(dirs):
            if d.startswith((".", "_")) or rel + d not in holders:
                dirs.remove(d)
                if not d.startswith((".", "_")):
                    found.append(rel + d + "/")
        found += [rel + f for f in files if rel + f not in data and not f.startswith((".", "_"))]
    return sorted(found)


def check_ours(folder: Path, truth: dict[str, dict[str, Any]], **fields: Any) -> None:
    """shardstream still verifies the dataset in ``folder`` and reads exactly its samples (ShardMap, every
    sample's stored bytes)."""
    from shardstream import ShardMap
    from shardstream.manifest.verify import verify

    report = verify(str(folder))
    assert report.ok, report.problems
    m = ShardMap(str(folder), decode=None)
    check_samples((m[i] for i in range(len(m))), truth, **fields)
