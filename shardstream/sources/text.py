"""Text corpora and existing token files, as documents in a deterministic order, for token shards.

Text: JSONL (one JSON object per line, its ``text_field``), Parquet and Arrow IPC (a string
column), and plain text (``.txt``: one document per line, or per file). Tokens: Megatron-LM's
``prefix.bin``/``prefix.idx`` pairs (``MMIDIDX``; each sequence is a document) and nanoGPT-style
flat ``.bin`` files of one dtype (documents end at each ``eos_id``, else the file is one).
A path is a file or a folder (its files sorted by name), local or any fsspec URL.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SourceError

TEXT_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".txt": "text",
}
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
# Megatron's dtype codes (megatron/core/datasets/indexed_dataset.py, DType)
MEGATRON_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


@dataclass
class TextSource:
    """The files of a corpus (``layout``: jsonl, parquet, arrow, text, megatron or nanogpt), sorted."""

    root: str
    layout: str
    files: list[str]
    text_field: str = "text"
    per_file: bool = False  # plain text: one document per file, not per line
    dtype: str | None = None  # nanogpt: the files' token dtype
    eos_id: int | None = None  # nanogpt: documents end after each of these
    storage_options: dict[str, Any] = field(default_factory=dict)

    @property
    def tokenized(self) -> bool:
        """Holds token ids already (Megatron, nanoGPT), not text."""
        return self.layout in ("megatron", "nanogpt")

    def _open(self, path: str) -> Any:
        import fsspec

        return fsspec.open(path, "rb", **self.storage_options).open()

    def texts(self, batch: int = 1024) -> Iterator[list[str]]:
        """The documents' texts in order, ``batch`` at a time (fewer at the end of a file)."""
        reader = {
            "jsonl": self._jsonl,
            "parquet": self._parquet,
            "arrow": self._arrow,
            "text": self._text,
        }[self.layout]
        for path in self.files:
            yield from reader(path, batch)

    def _jsonl(self, path: str, batch: int) -> Iterator[list[str]]:
        out: list[str] = []
        with self._open(path) as f:
            for row, line in enumerate(f):
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line)
                except ValueError as exc:
                    raise SourceError(
                        f"{path}: line {row + 1} is not JSON ({exc}); fix or drop that line"
                    ) from None
                text = doc.get(self.text_field) if isinstance(doc, dict) else None
                if not isinstance(text, str):
                    what = (
                        "has no"
                        if not isinstance(doc, dict) or self.text_field not in doc
                        else "has a non-text"
                    )
                    keys = ", ".join(sorted(doc)[:8]) if isinstance(doc, dict) else "none"
                    raise SourceError(
                        f"{path}: line {row + 1} {what} {self.text_field!r} field (its keys: {keys}); "
                        "pass --text-field (text_field=) naming the text field, or fix that row"
                    )
                out.append(text)
                if len(out) == batch:
                    yield out
                    out = []
        if out:
            yield out

    def _columns(
        self, path: str, names: list[str], batches: Iterator[Any], batch: int
    ) -> Iterator[list[str]]:
        if self.text_field not in names:
            raise SourceError(
                f"{path}: no column {self.text_field!r} (columns: {', '.join(names[:8])}); pass "
                "--text-field (text_field=) naming the text column"
            )
        row = 0
        for record_batch in batches:
            values = record_batch.column(self.text_field).to_pylist()
            for j, value in enumerate(values):
                if not isinstance(value, str):
                    raise SourceError(
                        f"{path}: row {row + j} has no text in {self.text_field!r} ({value!r:.40}); "
                        "drop or fill that row, or pass --text-field naming a text column"
                    )
            row += len(values)
            for start in range(0, len(values), batch):
                yield values[start : start + batch]

    def _parquet(self, path: str, batch: int) -> Iterator[list[str]]:
        import pyarrow.parquet as pq

        with self._open(path) as f:
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            cols = [self.text_field] if self.text_field in names else None
            yield from self._columns(
                path, names, pf.iter_batches(batch_size=8192, columns=cols), batch
            )

    def _arrow(self, path: str, batch: int) -> Iterator[list[str]]:
        import pyarrow as pa

        with self._open(path) as f:
            data = f.read()
        try:
            reader: Any = pa.ipc.open_file(pa.py_buffer(data))
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:
            reader = pa.ipc.open_stream(pa.py_buffer(data))
            batches = iter(reader)
        yield from self._columns(path, reader.schema.names, batches, batch)

    def _text(self, path: str, batch: int) -> Iterator[list[str]]:
        with self._open(path) as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SourceError(
                f"{path}: not UTF-8 text (byte {exc.start}); convert it to UTF-8"
            ) from None
        docs = [text] if self.per_file else [line for line in text.split("\n") if line.strip()]
        for start in range(0, len(docs), batch):
            yield docs[start : start + batch]

    def token_chunks(self) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
        """Token sources: (tokens, document offsets from 0, vocabulary bound: max id + 1) per file."""
        for path in self.files:
            tokens, offsets = read_megatron(path) if self.layout == "megatron" else self._flat(path)
            yield tokens, offsets, int(tokens.max()) + 1 if len(tokens) else 1

    def _flat(self, path: str) -> tuple[np.ndarray, np.ndarray]:
        tokens = (
            np.memmap(path, np.dtype(self.dtype or "uint16"), mode="r")
            if os.path.getsize(path)
            else np.zeros(0, np.uint16)
        )
        ends = (
            np.flatnonzero(tokens == self.eos_id) + 1
            if self.eos_id is not None
            else np.zeros(0, np.int64)
        )
        if not len(ends) or ends[-1] != len(tokens):
            ends = np.append(ends, len(tokens))
        return tokens, np.concatenate([[0], ends]).astype(np.int64)


def read_megatron(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A Megatron ``prefix.bin``'s tokens (a memory map) and its sequences' offsets from ``prefix.idx``."""
    prefix = path[: -len(".bin")] if path.endswith(".bin") else path[: -len(".idx")]
    idx, binary = prefix + ".idx", prefix + ".bin"
    fix = "re-create the pair with Megatron's preprocess_data.py"
    with open(idx, "rb") as f:
        head = f.read(9 + 8 + 1 + 16)
        if len(head) < 34 or head[:9] != MEGATRON_MAGIC:
            raise SourceError(f"{idx}: not a Megatron MMIDIDX index; {fix}")
        version, code, count, _docs = struct.unpack("<QBQQ", head[9:])
    if version != 1 or code not in MEGATRON_DTYPES:
        raise SourceError(f"{idx}: unknown MMIDIDX version {version} or dtype code {code}; {fix}")
    dtype = np.dtype(MEGATRON_DTYPES[code])
    if dtype.kind not in "iu":
        raise SourceError(f"{idx}: holds {dtype} values, not token ids; {fix}")
    sizes = (
        np.memmap(idx, np.int32, mode="r", offset=34, shape=(count,))
        if count
        else np.zeros(0, np.int32)
    )
    pointers = (
        np.memmap(idx, np.int64, mode="r", offset=34 + 4 * count, shape=(count,))
        if count
        else np.zeros(0, np.int64)
    )
    size = os.path.getsize(binary) if os.path.exists(binary) else -1
    contiguous = count == 0 or (
        pointers[0] == 0
        and bool((np.diff(pointers) == sizes[:-1].astype(np.int64) * dtype.itemsize).all())
    )
    end = int(pointers[-1]) + int(sizes[-1]) * dtype.itemsize if count else 0
    if size != end or not contiguous:
        raise SourceError(
            f"{idx} does not match {binary} ({'no such file' if size < 0 else f'{size} bytes'}, the "
            f"index describes {end} bytes{'' if contiguous else ' out of order'}); {fix}"
        )
    tokens = np.memmap(binary, dtype, mode="r") if size else np.zeros(0, dtype)
    return tokens, np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])


def write_megatron(prefix: str, documents: list[np.ndarray], dtype: str = "uint16") -> None:
    """Write ``documents`` as a Megatron ``prefix.bin``/``prefix.idx`` pair (one sequence per document)."""
    np_dtype = np.dtype(dtype)
    code = {v: k for k, v in MEGATRON_DTYPES.items()}[np_dtype.type]
    sizes = np.array([len(d) for d in documents], np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64)]) * np_dtype.itemsize
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            f.write(np.asarray(doc, np_dtype).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(MEGATRON_MAGIC + struct.pack("<QBQQ", 1, code, len(sizes), len(sizes) + 1))
        f.write(sizes.tobytes() + pointers.astype(np.int64).tobytes())
        f.write(np.arange(len(sizes) + 1, dtype=np.int64).tobytes())


def open_text_source(
    path: str,
    *,
    text_field: str = "text",
    per_file: bool = False,
    dtype: str | None = None,
    eos_id: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> TextSource:
    """List the corpus at ``path`` (a file or a folder, local or an fsspec URL); a :class:`SourceError`
    if it holds nothing token shards can be packed from, or several kinds."""
    import fsspec

    path = path[len("file://") :] if path.startswith("file://") else path
    fs, root = fsspec.core.url_to_fs(path, **(storage_options or {}))
    if not fs.exists(root):
        raise SourceError(f"source {path} does not exist")
    local = "://" not in path
    found = (
        sorted(p for p in fs.find(root) if not os.path.basename(p).startswith("."))
        if fs.isdir(root)
        else [root]
    )
    files = [p if local else fs.unstrip_protocol(p) for p in found]
    suffixes = {os.path.splitext(p)[1].lower() for p in files}
    if suffixes <= {".bin", ".idx"} and files:
        if not local:
            raise SourceError(
                f"{path}: token files are read in place; copy them to a local folder first"
            )
        pairs = sorted({p[:-4] for p in files if os.path.exists(p[:-4] + ".idx")})
        if pairs:
            return TextSource(
                path, "megatron", [p + ".bin" for p in pairs], storage_options=storage_options or {}
            )
        if ".idx" in suffixes:
            raise SourceError(
                f"{path}: an .idx without its .bin; give Megatron prefix.bin/prefix.idx pairs"
            )
        if dtype not in ("uint16", "uint32", "int32"):
            raise SourceError(
                f"{path}: flat .bin token files need their dtype: pass --dtype uint16 (or uint32)"
            )
        return TextSource(
            path,
            "nanogpt",
            files,
            dtype=dtype,
            eos_id=eos_id,
            storage_options=storage_options or {},
        )
    kinds = {TEXT_SUFFIXES.get(s) for s in suffixes}
    if not files or None in kinds or len(kinds) != 1:
        raise SourceError(
            f"{path}: token shards are packed from files of one kind: JSONL, Parquet, Arrow, plain "
            f"text, Megatron .bin/.idx or flat .bin (found {', '.join(sorted(suffixes)) or 'nothing'})"
        )
    return TextSource(
        path, kinds.pop(), files, text_field, per_file, storage_options=storage_options or {}
    )
