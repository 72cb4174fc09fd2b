"""Hostile and damaged datasets for the command-line tests, and the rule for what may reach a terminal."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import unicodedata
from pathlib import Path

from shardstream.manifest import Manifest, creation_info
from shardstream.packing.writer import ShardWriter

# What a dataset may try to smuggle onto the reader's terminal.
TITLE = "\x1b]0;pwned\x07"  # OSC: sets the window title
CLEAR = "\x1b[2J"  # CSI: clears the screen
RLO = "\u202e"  # right-to-left override: shows "cat<RLO>gpj.exe" as "catexe.jpg"
HOSTILE_KEY = "a" + TITLE
# a right-to-left override in a field name (control characters cannot be one: a tar's member with one in
# its extension is left out, with a warning; lower case: tar field names are lower-cased on read)
HOSTILE_FIELD = "x" + RLO + "y"
HOSTILE_CLASSES = ["cat" + RLO + "gpj.exe", "dog" + TITLE, "plain é 中"]

_FORBIDDEN = {"Cc", "Cf", "Cs", "Zl", "Zp"}


def terminal_problems(output: bytes | str) -> list[str]:
    """The characters in ``output`` a terminal would act on or that hide text (control, format,
    bidi and lone surrogates; raw C1 bytes too), except newlines; empty when the output is safe."""
    text = output.decode("utf-8", "surrogateescape") if isinstance(output, bytes) else output
    return sorted(
        {
            repr(ch)
            for ch in text
            if ch != "\n" and ch not in "\u200c\u200d" and unicodedata.category(ch) in _FORBIDDEN
        }
    )


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    """A tar of ``members`` (name, data), written by Python's ``tarfile`` (PAX names where needed)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_manifest_json(
    root: Path,
    shard_format: str,
    paths: list[str],
    samples: list[int],
    data: list[bytes],
    fields: list[dict],
    classes: list[str] | None = None,
    source: str = "somewhere",
) -> None:
    """``root/_manifest.json`` as shardstream writes it, for any values at all: it is written here,
    not by shardstream, so that loading it is what decides whether such a manifest is accepted."""
    doc = json.loads(
        Manifest(
            shard_format=shard_format,
            paths=[f"p{i}" for i in range(len(paths))],
            stored_counts=samples,
            nbytes=[len(d) for d in data],
            sha256=[hashlib.sha256(d).hexdigest() for d in data],
        ).to_json()
    )
    doc["shards"]["path"] = paths
    doc.update(fields=fields, classes=classes, created=creation_info(source=source))
    (root / "_manifest.json").write_text(
        json.dumps(doc, ensure_ascii=False), encoding="utf-8", errors="surrogateescape"
    )


def tar_dataset(
    root: Path,
    shards: dict[str, list[tuple[str, bytes]]],
    classes: list[str] | None = None,
    source: str = "somewhere",
    listed: list[str] | None = None,
) -> Path:
    """A tar dataset at ``root`` whose shards (file name -> members) are written by ``tarfile``,
    with any member names, shard names, class names at all; the manifest lists the fields
    ``listed`` (default: all)."""
    root.mkdir(parents=True, exist_ok=True)
    samples, data = [], []
    fields: dict[str, int] = {}
    for name, members in shards.items():
        data.append(tar_bytes(members))
        (root / name).write_bytes(data[-1])
        keys = []
        for member, _ in members:
            key, _, ext = member.partition(".")
            if not keys or keys[-1] != key:
                keys.append(key)
            fields[ext] = fields.get(ext, 0) + 1
        samples.append(len(keys))
    write_manifest_json(
        root,
        "tar",
        list(shards),
        samples,
        data,
        [
            {"name": k, "type": "bytes", "samples": n}
            for k, n in sorted(fields.items())
            if listed is None or k in listed
        ],
        classes,
        source,
    )
    return root


def hostile_dataset(root: Path, shard: str = "shard-000000.tar") -> Path:
    """One tar shard of two samples: the first has a key that retitles the terminal, a field named
    to clear the screen holding an escape sequence (in the shard; the manifest lists only ``txt``),
    and a plain text field; class names with a bidi override and an escape; the creation source
    with an escape."""
    return tar_dataset(
        root,
        {
            shard: [
                (f"{HOSTILE_KEY}.txt", b"hello"),
                (f"{HOSTILE_KEY}.{HOSTILE_FIELD}", CLEAR.encode() + b"boom"),
                ("b.txt", "plain é 中\n".encode()),
            ]
        },
        classes=HOSTILE_CLASSES,
        source="src" + CLEAR,
        listed=["txt"],
    )


def hostile_arrow_dataset(root: Path) -> Path:
    """An Arrow dataset whose key, column name and a value carry escape sequences."""
    with ShardWriter(str(root), format="arrow") as writer:
        writer.write({"__key__": HOSTILE_KEY, HOSTILE_FIELD: CLEAR + "boom", "txt": "plain é 中"})
        writer.write({"__key__": "b", HOSTILE_FIELD: "v", "txt": "t"})
    return root
