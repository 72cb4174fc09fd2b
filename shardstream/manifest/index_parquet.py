"""``index`` for Parquet files: a manifest whose shards are the Parquet files themselves, no copy.

Sources are files, globs (``data/*.parquet``, local or on object storage) or folders (a Hugging
Face Hub or ``save_to_disk`` layout: every ``.parquet`` file under it, one split at a time). Every
file is read once: its rows, size and sha256 go to the manifest, its schema (the same for every
file) to the manifest's fields, and its row groups' spans and sha256 to ``.shardstream/<file>.idx`` beside it, whose own
sha256 the manifest keeps, so readers fetch single row groups from object storage and check them.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import posixpath
import re
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import DatasetExistsError, ShardstreamError
from ..formats import TAR_COMPRESSION, shard_format_of
from ..formats import parquet as parquet_format
from ..formats.arrow import describe_schema, schema_to_text
from ..storage import Store, is_url
from .files import write_durably
from .index_tars import IndexResult, common_folder, publish_index, relative_name
from .schema import MANIFEST_NAME, Manifest, creation_info
from .side_names import index_name

SUFFIX = ".parquet"
_GLOB = re.compile(r"[*?\[]")
_SPLITS = ("train", "test", "validation", "valid", "dev", "eval")


def is_parquet(sources: Sequence[str], storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``sources`` name Parquet files, a glob of them, or a folder of them and no tars: what
    ``index`` reads in place."""
    if any(str(s).rstrip("/").lower().endswith(SUFFIX) for s in sources):
        return True
    if len(sources) != 1 or _GLOB.search(str(sources[0])) or "{" in str(sources[0]):
        return False
    store = Store(str(sources[0]), storage_options)
    if not store.is_dir():
        return False
    names = store.list_files(recursive=True)
    return any(n.endswith(SUFFIX) for n in names) and not any(
        shard_format_of(n) in TAR_COMPRESSION for n in names
    )


def expand_parquet(
    sources: Sequence[str], storage_options: dict[str, Any] | None = None
) -> list[str]:
    """The Parquet file URLs that files, globs and folders name, in order (a folder's sorted)."""
    urls: list[str] = []
    for source in map(str, sources):
        if _GLOB.search(source):
            found = _glob(source, storage_options)
            if not found:
                raise ShardstreamError(f"{source} matches no Parquet file")
            urls += found
            continue
        store = Store(source, storage_options)
        if store.is_dir():
            urls += _folder(store)
        else:
            urls.append(source)
    if len(set(urls)) != len(urls):
        raise ShardstreamError("the same Parquet file is named twice; give each file once")
    return urls


def _glob(pattern: str, storage_options: dict[str, Any] | None) -> list[str]:
    if not is_url(pattern):
        return sorted(p for p in glob.glob(pattern, recursive=True) if p.endswith(SUFFIX))
    fixed = pattern[: _GLOB.search(pattern).start()]  # type: ignore[union-attr]
    folder = fixed.rsplit("/", 1)[0]
    store = Store(folder, storage_options)
    names = store.list_files(recursive=True)
    return [store.url_of(n) for n in names if fnmatch.fnmatchcase(store.url_of(n), pattern)]


def _folder(store: Store) -> list[str]:
    """Every Parquet file under a folder; refused when they belong to several splits."""
    names = [
        n
        for n in store.list_files(recursive=True)
        if n.endswith(SUFFIX) and not any(p.startswith(".") for p in n.split("/"))
    ]
    if not names:
        raise ShardstreamError(f"folder {store.url} holds no .parquet files")
    splits = sorted({s for s in map(_split_of, names) if s is not None})
    if len(splits) > 1:
        split = "train" if "train" in splits else splits[0]
        example = next(n for n in names if _split_of(n) == split)
        pattern = posixpath.join(store.url, posixpath.dirname(example), f"{split}*{SUFFIX}")
        if f"/{split}/" in f"/{example}":
            pattern = posixpath.join(store.url, example.split(f"{split}/")[0], split)
        raise ShardstreamError(
            f"{store.url} holds Parquet files of several splits ({', '.join(splits)}); index one "
            f"split at a time, e.g. shardstream index '{pattern}'"
        )
    return [store.url_of(n) for n in names]


def _split_of(name: str) -> str | None:
    """The split a Hub-layout file belongs to: a folder named for it, or a file name starting with it."""
    parts = name.split("/")
    for part in parts[:-1]:
        if part in _SPLITS:
            return part
    head = re.split(r"[-_.]", parts[-1], maxsplit=1)[0]
    return head if head in _SPLITS else None


def index_parquet(
    sources: Sequence[str],
    output: str | None = None,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    on_shard: Callable[[int], None] | None = None,
) -> IndexResult:
    """Publish a manifest (in ``output``; by default the folder given, or the one holding every file) whose shards are the
    Parquet files ``sources`` as they are, and each file's row-group index next to it."""
    if (
        output is not None
        and not overwrite
        and Store(output, storage_options).exists(MANIFEST_NAME)
    ):
        raise DatasetExistsError(
            f"{output} already has a {MANIFEST_NAME}; pass --overwrite to replace it"
        )
    urls = expand_parquet(sources, storage_options)
    if output is None:  # a folder given holds the manifest; else the folder holding every file
        folder = len(sources) == 1 and Store(str(sources[0]), storage_options).is_dir()
        output = str(sources[0]) if folder else common_folder(urls)
    root = Store(output, storage_options)
    if not overwrite and root.exists(MANIFEST_NAME):
        raise DatasetExistsError(
            f"{root.url} already has a {MANIFEST_NAME}; pass --overwrite to replace it"
        )
    names = [relative_name(u, root) for u in urls]
    samples, nbytes, digests, indexes = [], [], [], []
    schema = None
    for name in names:
        where = root.url_of(name)
        data = root.read_bytes(name)
        index, metadata = parquet_format.build_row_index(data, where, checksums=True)
        found = metadata.schema.to_arrow_schema().remove_metadata()
        if schema is None:
            schema, first = found, where
        elif not found.equals(schema):
            raise ShardstreamError(
                f"{where} has another schema than {first} ({found} against {schema}); index files "
                "of one table"
            )
        raw = index.to_bytes()
        write_durably(root, index_name(name), raw)
        samples.append(metadata.num_rows)
        nbytes.append(len(data))
        digests.append(hashlib.sha256(data).hexdigest())
        indexes.append(hashlib.sha256(raw).hexdigest())
        if on_shard:
            on_shard(len(data))
    assert schema is not None
    manifest = Manifest(
        shard_format="parquet",
        paths=names,
        stored_counts=samples,
        nbytes=nbytes,
        sha256=digests,
        fields=describe_schema(schema),
        arrow_schema=schema_to_text(schema),
        created=creation_info(source="index", operation="index", indexed=len(names)),
        index_sha256=indexes,
    )
    publish_index(root, manifest)
    return IndexResult(manifest, root.url)


__all__ = ["expand_parquet", "index_parquet", "is_parquet"]
