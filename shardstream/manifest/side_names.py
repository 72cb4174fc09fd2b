"""The names of everything shardstream writes beside a dataset's data files: one hidden folder.

A dataset's folder holds its data files (shards, or Parquet files read in place), ``_manifest.json``,
and ``.shardstream/``: the sample index of each shard (``<shard's folder>/.shardstream/<shard>.idx``),
the version files (``.shardstream/versions/000002.json``), a large manifest's shard table
(``.shardstream/shards-<16 hex>.arrow``) and the side files a manifest names (a split's
``.shardstream/selection-…npy``, the recorded ``.shardstream/image_sizes-…npy``). A ``.``-prefixed
folder because every folder reader skips such names (Hugging Face ``datasets``, pyarrow, pandas, Spark,
shell and webdataset globs), while ``_`` is skipped by pyarrow and Spark but not by ``datasets``; and a
name no other tool writes (Megatron-Energon and DALI keep ``<shard>.tar.idx`` beside the tar).

Datasets written before (manifest format 3 and older) keep their files where they were: ``<shard>.idx``
beside the shard, ``_versions/``, ``_shards-…``, ``_selection-…``, ``_image_sizes-…``. Readers take
both: a shard's index is the first of :func:`index_names` that exists and matches the manifest's
sha256 (one failed lookup for an old dataset), and the other names are stored in the manifest itself.

Side files are named ``<prefix><16 hex of the content's sha256>-<16 hex of the run><suffix>``: the
content's digest says what a file holds; the run's own random part keeps two runs that write the same
content (two packs of one folder into one place at once, an overwrite with the same images) from
sharing one file, which the losing run, or the winner's clean-up of what it replaced, would remove from
under the other's manifest. Names without the run's part (written before it) still read.
"""

from __future__ import annotations

import posixpath
import re
import uuid

NAMESPACE = ".shardstream"  # the folder of shardstream's own files, beside a dataset's data
INDEX_SUFFIX = ".idx"
VERSIONS = f"{NAMESPACE}/versions"
OLD_VERSIONS = "_versions"  # manifest format 3 and older


def index_name(shard_path: str) -> str:
    """Where a shard's sample index (or a Parquet file's row-group index) is written: the ``.shardstream``
    folder beside it (``data/x.parquet`` -> ``data/.shardstream/x.parquet.idx``)."""
    folder, name = posixpath.split(shard_path)
    return posixpath.join(folder, NAMESPACE, name + INDEX_SUFFIX)


def old_index_name(shard_path: str) -> str:
    """Where datasets of manifest format 3 and older keep a shard's index: beside it (``x.tar.idx``)."""
    return shard_path + INDEX_SUFFIX


def index_names(shard_path: str) -> tuple[str, str]:
    """Where a reader looks for a shard's index, in order: its own folder's ``.shardstream``, then beside
    it (datasets written before)."""
    return index_name(shard_path), old_index_name(shard_path)


def version_name(version: int, old: bool = False) -> str:
    """Version ``version``'s manifest head: ``.shardstream/versions/000003.json`` (``old``: where datasets
    of manifest format 3 and older keep it, ``_versions/000003.json``)."""
    return f"{OLD_VERSIONS if old else VERSIONS}/{version:06d}.json"


def side_name(prefix: str, suffix: str, digest: str) -> str:
    """A new side file's name for content of sha256 ``digest`` (hex), unique to this run."""
    return f"{NAMESPACE}/{prefix}{digest[:16]}-{uuid.uuid4().hex[:16]}{suffix}"


def side_name_fits(name: object, prefix: str, suffix: str, digest: object) -> bool:
    """Whether ``name`` is a side file name of ``prefix`` and ``suffix`` for content of sha256 ``digest``:
    in ``.shardstream/``, or beside the manifest with a leading ``_`` (datasets written before)."""
    if not isinstance(name, str) or not isinstance(digest, str) or len(digest) != 64:
        return False
    found = side_file_pattern(prefix, suffix).fullmatch(name)
    return found is not None and found[1] == digest[:16]


def side_file_pattern(prefix: str, suffix: str) -> re.Pattern[str]:
    """What names of side files of ``prefix`` and ``suffix`` look like, new or old (for a clean-up)."""
    return re.compile(
        rf"^(?:{re.escape(NAMESPACE)}/|_){re.escape(prefix)}([0-9a-f]{{16}})(?:-[0-9a-f]{{16}})?"
        rf"{re.escape(suffix)}$"
    )


__all__ = [
    "INDEX_SUFFIX",
    "NAMESPACE",
    "OLD_VERSIONS",
    "VERSIONS",
    "index_name",
    "index_names",
    "old_index_name",
    "side_file_pattern",
    "side_name",
    "side_name_fits",
    "version_name",
]
