"""``verify``: every shard present, of the right size and checksum, and every sample parses and matches
its per-sample checksums where the dataset has them; with ``decode``, every image, label, JSON and numpy
field decodes too. The report says which shards have per-sample checksums."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardstreamError, StorageError, sample_name
from ..formats import TAR_COMPRESSION, count_samples, iter_shard_samples
from ..formats.checksums import NAME
from ..sizes import count as counted
from ..storage import Store
from .image_sizes import read_image_sizes
from .locate import open_stored
from .media_facts import recorded_media
from .schema import Manifest
from .side_names import index_names


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`: one problem line per damaged shard, and per shard whether it has
    per-sample checksums (``checksums``: True, False, or None where that could not be read)."""

    url: str
    manifest: Manifest
    problems: list[str] = field(default_factory=list)
    checksums: list[bool | None] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def checksums_line(self) -> str:
        """One line: whether the dataset's shards have per-sample checksums, and the fix if not."""
        have = sum(1 for c in self.checksums if c)
        known = sum(1 for c in self.checksums if c is not None)
        unread = len(self.checksums) - known
        if self.manifest.shard_format == "tokens":
            return "per-sample checksums: none (token shards are checked by their sha256 alone)"
        if known and have == known:
            matched = "every value matched" if self.ok else "the damage is listed"
            some = f" of the {known:,} whose checks could be read" if unread else ""
            return f"per-sample checksums ({NAME}): every shard{some} has them; {matched}"
        fix = f"'shardstream upgrade {self.url}' adds them"
        if not known:
            return "per-sample checksums: unknown (no shard could be read)"
        if have == 0:
            return (
                "per-sample checksums: none (packed or indexed by shardstream 0.5.0 or earlier, or "
                f"packed with --no-index); {fix}"
            )
        return f"per-sample checksums: {have:,} of {known:,} shards have them; {fix}"


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
    return check_one(store, manifest, i, decode)[0]


def check_one(
    store: Store, manifest: Manifest, i: int, decode: bool = False
) -> tuple[str | None, bool | None]:
    """(What is wrong with shard ``i`` or None, whether it has per-sample checksums: None where that could
    not be read)."""
    name = manifest.paths[i]
    where = store.url_of(name)
    try:
        data = store.read_bytes(name)
    except ShardstreamError as exc:
        return str(exc), None
    size = len(data)
    if size != manifest.nbytes[i]:
        return (
            f"{where}: {size} bytes, the manifest says {manifest.nbytes[i]} (truncated or replaced)",
            None,
        )
    digest = hashlib.sha256(data).hexdigest()
    if manifest.sha256[i] and digest != manifest.sha256[i]:  # "" is no checksum
        expected = manifest.sha256[i]
        problem = f"{where}: checksum mismatch (sha256 {digest[:16]}..., the manifest says {expected[:16]}...)"
        # where the damage is, when the per-sample checksums say
        found, checked = _contents(store, manifest, data, i, False)
        if found is not None and "differs from" in found:
            problem += f"; {found.removeprefix(f'{where}: ')}"
        return problem, checked
    return _contents(store, manifest, data, i, decode)


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


def _contents(
    store: Store, manifest: Manifest, data: Any, i: int, decode: bool
) -> tuple[str | None, bool | None]:
    """:func:`check_one` of shard ``i``'s bytes ``data`` once its size and sha256 were checked."""
    where = store.url_of(manifest.paths[i])
    checked: list[bool | None] = [None]  # what the checks below found
    try:
        if manifest.shard_format == "tokens":
            return _token_problem(manifest, data, where, i), False
        if manifest.shard_format == "parquet":
            return _parquet_problem(store, manifest, data, i, decode, checked), checked[0]
        if manifest.shard_format == "arrow":
            count, problem = _arrow_problem(data, where, checked)
        else:
            count, problem = _tar_problem(store, manifest, data, i, checked)
        if problem is None and count == manifest.stored_counts[i] and decode:
            problem = _undecodable(manifest, data, where)
    except ShardstreamError as exc:
        return str(exc), checked[0]
    if problem is None and count != manifest.stored_counts[i]:
        problem = f"{where}: {count} samples, the manifest says {manifest.stored_counts[i]}"
    return problem, checked[0]


def _arrow_problem(data: Any, where: str, checked: list[bool | None]) -> tuple[int, str | None]:
    """(rows, the first value that differs from its record batch's checksums or None) of an Arrow shard;
    ``checked[0]``: whether it has checksums."""
    from ..formats.arrow import read_checked

    table, damaged = read_checked(data, where)
    checked[0] = damaged is not None
    if not damaged:
        return table.num_rows, None
    row = min(damaged)
    keys = table.column("__key__") if "__key__" in table.column_names else None
    key = keys[row].as_py() if keys is not None else None
    more = f" ({len(damaged):,} rows differ)" if len(damaged) > 1 else ""
    return table.num_rows, (
        f"{where}: {sample_name(row, key)}: field {', '.join(map(repr, damaged[row]))} differs from its record "
        f"batch's checksums{more}; restore the shard from a good copy or re-pack it"
    )


def _tar_problem(
    store: Store, manifest: Manifest, data: Any, i: int, checked: list[bool | None]
) -> tuple[int, str | None]:
    """(samples, what is wrong with them or their index, or None) of tar shard ``i`` (``data``: as stored);
    ``checked[0]``: whether its index has member checksums."""
    from ..formats.compression import decompress

    where = store.url_of(manifest.paths[i])
    plain = decompress(data, TAR_COMPRESSION[manifest.shard_format], where)
    count = count_samples("tar", plain, where)
    checked[0] = False
    if count != manifest.stored_counts[i] or not manifest.index_sha256:
        return count, None
    if not manifest.index_sha256[i]:
        return count, None
    return count, _index_problem(store, manifest, plain, i, plain is not data, checked)


def _index_problem(
    store: Store,
    manifest: Manifest,
    plain: Any,
    i: int,
    compressed: bool = False,
    checked: list[bool | None] | None = None,
) -> str | None:
    """What is wrong with tar shard ``i``'s sample index (its checksum, a sample or member it places other
    than the tar's headers do, a sample's sha256 or a member's checksum it holds), or None; ``plain``: the
    shard's tar (decompressed: ``compressed``)."""
    from ..formats import tar as tar_format
    from ..formats.tar_index import parse_index

    name, raw = stored_index(store, manifest.paths[i], manifest.index_sha256[i])
    where = store.url_of(name)
    shard = store.url_of(manifest.paths[i])
    if raw is None:
        return f"{where}: {_NO_INDEX}; re-pack the dataset (or 'shardstream index --overwrite')"
    index = parse_index(raw, where, int(manifest.stored_counts[i]), len(plain))
    if index.compressed != compressed:
        return f"{where}: an index of {'a compressed' if index.compressed else 'an uncompressed'} tar; re-pack the dataset"
    found = index.samples(where)
    if found != tar_format.index_samples(plain, shard):
        return f"{where}: it places samples or members other than the shard's headers do; re-pack the dataset"
    view = memoryview(plain)
    if checked is not None:
        checked[0] = index.checksums is not None
    problem = None if index.checksums is None else _member_problem(view, index, found, shard)
    if problem is not None:  # (it names the field, where a sample's sha256 would not)
        return problem
    for j in range(len(index) if index.has_digests else 0):  # no sample spans or digests to check
        start, end = index.span(j)
        index.check(j, view[start:end], where, found[0][j])
    return None


def _member_problem(view: memoryview, index: Any, found: Any, shard: str) -> str | None:
    """The first member whose data differ from its checksum in the index, named, or None."""
    from ..formats.checksums import checksum, mismatch

    sums = index.checksums.tolist()
    j = 0
    for position, (key, fields) in enumerate(zip(*found)):
        for ext, (offset, size) in fields.items():
            if checksum(view[offset : offset + size]) != sums[j]:
                return str(mismatch(shard, position, key, ext))
            j += 1
    return None


def _parquet_problem(
    store: Store,
    manifest: Manifest,
    data: Any,
    i: int,
    decode: bool,
    checked: list[bool | None] | None = None,
) -> str | None:
    """What is wrong with Parquet shard ``i`` (a file read in place): its footer's row count, its
    row-group index (checksum, parsed as a row-group index, agreeing with the footer), a row group
    that does not read or (version 2 index) whose values differ from their checksums; with ``decode``, a
    field that does not decode. None if it is sound. ``checked[0]``: whether its index has checksums."""
    import dataclasses

    from ..formats import parquet as parquet_format

    where = store.url_of(manifest.paths[i])
    built, metadata = parquet_format.build_row_index(data, where)
    rows = int(manifest.stored_counts[i])
    if metadata.num_rows != rows:
        return f"{where}: {counted(metadata.num_rows, 'row')}, the manifest says {rows}"
    index = None
    if checked is not None:
        checked[0] = False
    if manifest.index_sha256 and manifest.index_sha256[i]:
        name, raw = stored_index(store, manifest.paths[i], manifest.index_sha256[i])
        at = store.url_of(name)
        if raw is None:
            return f"{at}: {_NO_INDEX}; re-create it with 'shardstream index --overwrite'"
        index = parquet_format.parse_row_index(raw, at, rows, len(data))
        # the row groups' sha256 aside: a row group that differs is named below, by its values if it can be
        if dataclasses.replace(index, checksums=None, sha256=built.sha256) != built:
            return (
                f"{at}: its footer or row groups differ from the file's; re-create it with "
                "'shardstream index'"
            )
    sums = index.checksums if index is not None else None
    if checked is not None:
        checked[0] = sums is not None
    file = parquet_format.open_file(data, where, metadata, page_checksums=sums is None)
    first = 0
    for group in range(metadata.num_row_groups):
        table = parquet_format.read_group(file, group, where)
        if sums is not None:
            problem = _group_problem(table, sums[group], where, group, first)
            if problem is not None:
                return problem
        if index is not None and index.sha256[group] != built.sha256[group]:
            return (
                f"{at}: row group {group} differs from its sha256 in the row-group index; the file "
                "was changed after indexing: re-create it with 'shardstream index'"
            )
        first += table.num_rows
    return _undecodable(manifest, data, where) if decode else None


def _group_problem(table: Any, doc: Any, where: str, group: int, first: int) -> str | None:
    """The first row of row group ``group`` of a Parquet file (read as ``table``; its first row is row
    ``first`` of the file) whose values differ from its checksums (``doc``, from the row-group index),
    named, or None."""
    from ..formats.arrow_checksums import damaged_rows, parse_checksums

    sums, per_row = parse_checksums(
        doc, table.num_columns, table.num_rows, f"{where} (row group {group})"
    )
    damaged = damaged_rows(table, sums, per_row)
    if not damaged:
        return None
    row = min(damaged)
    key = table.column("__key__")[row].as_py() if "__key__" in table.column_names else None
    return (
        f"{where}: {sample_name(first + row, key)}: field {', '.join(map(repr, damaged[row]))} differs from its "
        f"checksum in the row-group index (row group {group}); restore the file from a good copy"
    )


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
            lambda i: check_one(store, manifest, i, decode), range(manifest.num_shards)
        )
        for i, (problem, checked) in enumerate(results):
            if problem:
                report.problems.append(problem)
            report.checksums.append(checked)
            if on_shard:
                on_shard(int(manifest.nbytes[i]))
    for problem in (_sizes_problem(store, manifest), _media_problem(store, manifest)):
        if problem:
            report.problems.append(problem)
    return report


def _media_problem(store: Store, manifest: Manifest) -> str | None:
    """What is wrong with the recorded media facts the manifest names (their file, its sha256, its
    counts per shard), or None."""
    try:
        recorded_media(store, manifest)
    except ShardstreamError as exc:
        return f"{store.url}: {exc}"
    return None


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
