"""``verify``: every shard present, of the right size and checksum, and every sample parses;
with ``decode``, every image, label, JSON and numpy field decodes too."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardstreamError, StorageError, sample_name
from ..formats import count_samples, iter_shard_samples
from ..sizes import count as counted
from ..storage import Store
from .image_sizes import read_image_sizes
from .locate import open_stored
from .schema import Manifest
from .side_names import index_names


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`: one problem line per damaged shard."""

    url: str
    manifest: Manifest
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


_IMAGES = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif", "tif", "tiff"}
)


def decode_field(name: str, data: bytes) -> None:
    """Decode one stored field by its extension as a reader would (images fully, labels, JSON,
    numpy); raises if it does not. Other extensions are not checked."""
    ext = name.rsplit(".", 1)[-1].lower()
    if ext in _IMAGES:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            image.load()
    elif ext in ("cls", "cls2", "index", "id"):
        int(data)
    elif ext in ("txt", "text"):
        data.decode("utf-8")
    elif ext == "json":
        json.loads(data)
    elif ext == "npy":
        import numpy as np

        np.load(io.BytesIO(data), allow_pickle=False)


def _undecodable(manifest: Manifest, data: bytes, where: str) -> str | None:
    """The first field of the shard that does not decode, named by sample, or None."""
    for offset, sample in enumerate(iter_shard_samples(manifest.shard_format, data, where)):
        for name, value in sample.items():
            if name.startswith("__") or not isinstance(value, (bytes, bytearray)):
                continue
            try:
                decode_field(name, bytes(value))
            except Exception as exc:  # decoders raise many types
                return (
                    f"{where}: {sample_name(offset, sample.get('__key__'))}: field {name!r} does not decode "
                    f"({type(exc).__name__}: {exc}); replace or drop the file and pack again"
                )
    return None


def check_shard(store: Store, manifest: Manifest, i: int, decode: bool = False) -> str | None:
    """A description of what is wrong with shard ``i``, or None if it is sound (with ``decode``,
    every field decodes)."""
    name = manifest.paths[i]
    where = store.url_of(name)
    try:
        data = store.read_bytes(name)
        size = len(data)
        if size != manifest.nbytes[i]:
            return f"{where}: {size} bytes, the manifest says {manifest.nbytes[i]} (truncated or replaced)"
        digest = hashlib.sha256(data).hexdigest()
        if manifest.sha256[i] and digest != manifest.sha256[i]:  # "" is no checksum
            expected = manifest.sha256[i]
            return f"{where}: checksum mismatch (sha256 {digest[:16]}..., the manifest says {expected[:16]}...)"
        if manifest.shard_format == "tokens":
            return _token_problem(manifest, data, where, i)
        if manifest.shard_format == "parquet":
            return _parquet_problem(store, manifest, data, i, decode)
        count = count_samples(manifest.shard_format, data, where)
        if (
            count == manifest.stored_counts[i]
            and manifest.index_sha256
            and manifest.index_sha256[i]
        ):
            problem = _index_problem(store, manifest, data, i)
            if problem is not None:
                return problem
        if count == manifest.stored_counts[i] and decode:
            return _undecodable(manifest, data, where)
    except ShardstreamError as exc:
        return str(exc)
    if count != manifest.stored_counts[i]:
        return f"{where}: {count} samples, the manifest says {manifest.stored_counts[i]}"
    return None


_NO_INDEX = "missing, or not the index the manifest names (its sha256 differs)"


def stored_index(store: Store, path: str, digest: str) -> tuple[str, bytes | None]:
    """The stored index of the shard at ``path`` whose sha256 is ``digest``, and its name: in
    ``.shardstream/`` beside the shard, or beside it (formats before 4); ``None`` (and the first name)
    where neither is the one the manifest names."""
    for name in index_names(path):
        try:
            raw = bytes(store.read_bytes(name))
        except StorageError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                continue
            raise
        if hashlib.sha256(raw).hexdigest() == digest:
            return name, raw
    return index_names(path)[0], None


def _index_problem(store: Store, manifest: Manifest, data: Any, i: int) -> str | None:
    """What is wrong with tar shard ``i``'s sample index (its checksum, or a sample or member it places
    other than the tar's headers do), or None."""
    from ..formats import tar as tar_format
    from ..formats.tar_index import parse_index

    name, raw = stored_index(store, manifest.paths[i], manifest.index_sha256[i])
    where = store.url_of(name)
    if raw is None:
        return f"{where}: {_NO_INDEX}; re-pack the dataset (or 'shardstream index --overwrite')"
    index = parse_index(raw, where, int(manifest.stored_counts[i]), len(data))
    found = index.samples(where)
    if found != tar_format.index_samples(data, store.url_of(manifest.paths[i])):
        return f"{where}: it places samples or members other than the shard's headers do; re-pack the dataset"
    for j in range(0 if index.grouped else len(index)):  # version 2: no sample spans to check
        start, end = index.span(j)
        index.check(j, memoryview(data)[start:end], where, found[0][j])
    return None


def _parquet_problem(
    store: Store, manifest: Manifest, data: Any, i: int, decode: bool
) -> str | None:
    """What is wrong with Parquet shard ``i`` (a file read in place): its footer's row count, its
    row-group index (checksum, parsed as a row-group index, agreeing with the footer), a row group
    that does not read; with ``decode``, a field that does not decode. None if it is sound."""
    from ..formats import parquet as parquet_format

    where = store.url_of(manifest.paths[i])
    built, metadata = parquet_format.build_row_index(data, where)
    rows = int(manifest.stored_counts[i])
    if metadata.num_rows != rows:
        return f"{where}: {counted(metadata.num_rows, 'row')}, the manifest says {rows}"
    if manifest.index_sha256 and manifest.index_sha256[i]:
        name, raw = stored_index(store, manifest.paths[i], manifest.index_sha256[i])
        at = store.url_of(name)
        if raw is None:
            return f"{at}: {_NO_INDEX}; re-create it with 'shardstream index --overwrite'"
        if parquet_format.parse_row_index(raw, at, rows, len(data)) != built:
            return (
                f"{at}: its footer or row groups differ from the file's; re-create it with "
                "'shardstream index'"
            )
    file = parquet_format.open_file(data, where, metadata)
    for group in range(metadata.num_row_groups):
        parquet_format.read_group(file, group, where)
    return _undecodable(manifest, data, where) if decode else None


def _token_problem(manifest: Manifest, data: Any, where: str, i: int) -> str | None:
    """What is wrong inside token shard ``i`` (header, document offsets, ids past the vocabulary), or None."""
    from ..formats.tokens import TokenShard

    shard = TokenShard(data, where, manifest.tokens["dtype"], int(manifest.stored_counts[i]))
    shard.check()
    vocab = manifest.tokens["vocab_size"]
    if len(shard.tokens) and int(shard.tokens.max()) >= vocab:
        at = int((shard.tokens >= vocab).argmax())
        return (
            f"{where}: token {at} has id {int(shard.tokens[at])}, past the vocabulary size {vocab} the "
            "manifest states; re-pack it with the tokenizer that made it"
        )
    return None


def verify(
    url: str,
    storage_options: dict[str, Any] | None = None,
    workers: int = 4,
    on_shard: Callable[[int], None] | None = None,
    decode: bool = False,
    trusted_roots: dict[str, dict[str, Any]] | None = None,
    version: int | None = None,
) -> VerifyReport:
    """Check every shard of the dataset at ``url`` against its manifest; with ``decode``, also decode
    every image, label, text, JSON and numpy field (a non-image ``.jpg`` is reported by sample).

    ``on_shard(nbytes)`` is called as each shard is done (for progress). ``trusted_roots``: where a
    merged dataset may name shards by full URL (as ``StorageSettings.trusted_roots``); ``version``:
    the dataset's version to check (default: the latest).
    """
    store, manifest = open_stored(
        url, storage_options, version=version, trusted_roots=trusted_roots
    )
    report = VerifyReport(store.url, manifest)
    with ThreadPoolExecutor(max(1, workers)) as pool:
        results = pool.map(
            lambda i: check_shard(store, manifest, i, decode), range(manifest.num_shards)
        )
        for i, problem in enumerate(results):
            if problem:
                report.problems.append(problem)
            if on_shard:
                on_shard(int(manifest.nbytes[i]))
    problem = _sizes_problem(store, manifest)
    if problem:
        report.problems.append(problem)
    return report


def _sizes_problem(store: Store, manifest: Manifest) -> str | None:
    """What is wrong with the recorded image sizes the manifest names (their file, its sha256, its
    counts per shard), or None."""
    if manifest.image_sizes is None:
        return None
    try:
        read_image_sizes(
            manifest.image_sizes.reference, store.read_bytes, manifest.paths, manifest.stored_counts
        )
    except ShardstreamError as exc:
        return f"{store.url}: {exc}"
    return None
