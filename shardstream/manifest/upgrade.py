"""``upgrade``: a dataset of an older format brought to this one, as its next version, no shard changed.

A dataset written before manifest format 4 keeps its sample indexes beside its shards (``<shard>.idx``,
where other tools' indexes go too), its version files in ``_versions/`` and its shard table and side
files as ``_``-prefixed files beside the manifest; its indexes hold no per-member checksums (nor do those
of a dataset packed with ``--no-index``, which has none). ``upgrade`` reads each of its own tar and
Parquet shards whose index lacks them once, writes its index again into ``.shardstream/`` (as a pack of
today writes it, with each value's checksum), names its side files and shard table there, and publishes
all of it as the next version
(an exclusive create of that version: a publish by another writer meanwhile makes it stop, to be run
again). Shards a merge or split reads from other datasets' folders keep the indexes those datasets have
(upgrade those datasets themselves). The files of the older layout stay for the older versions, which
stay readable; ``shardstream gc`` removes them with those versions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import Any

from ..formats import TAR_COMPRESSION
from ..formats.compression import decompress
from ..formats.tar import build_index
from ..formats.tar_index import MAGIC_CHECKED
from ..storage import Store
from .files import dataset_store, write_durably
from .image_sizes import read_image_sizes, select_shards
from .sample_set import samples_of
from .schema import FORMAT_VERSION, Manifest, creation_info
from .selection import encode_selection
from .side_names import index_name
from .verify import stored_index
from .versions import publish_next, read_version


@dataclass
class UpgradeResult:
    """What an upgrade did: the version it published, and the indexes it wrote."""

    url: str
    manifest: Manifest
    indexes: int  # sample or row-group indexes written into .shardstream/
    skipped: int  # shards read from other datasets' folders, left with their own indexes
    already: bool = False  # the dataset was of this format: nothing was published


def upgrade(
    url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> UpgradeResult:
    """Bring the dataset at ``url``, written by an older shardstream (or packed with ``index=False``: no
    per-sample checksums), to this format as its next version:
    its sample indexes (with per-sample checksums) and side files written into ``.shardstream/``, no
    shard changed (``shardstream upgrade``). A dataset of this format already is left as it is.

    Args:
        url: the dataset's folder or URL.
        storage_options: fsspec options for ``url``.

    Returns:
        What was published (``result.manifest``), the indexes written, the shards of other datasets
        left as they are, and whether it was of this format already.
    """
    store = dataset_store(os.fspath(url), storage_options)
    m = read_version(store)
    digests = list(m.index_sha256 or [""] * m.num_shards)
    written = skipped = 0
    for i, path in enumerate(m.paths):
        if path.startswith("../") or "://" in path:
            skipped += 1
            continue
        if m.format >= FORMAT_VERSION and _has_checksums(store, m, i):
            continue
        data = _index_of(store, m, i)
        if data is not None:
            write_durably(store, index_name(path), data)
            digests[i] = hashlib.sha256(data).hexdigest()
            written += 1
    if m.format >= FORMAT_VERSION and not written:
        return UpgradeResult(store.url, m, 0, skipped, already=True)
    new = dataclasses.replace(
        m,
        index_sha256=digests if any(digests) else None,
        selection=_moved_selection(m),
        image_sizes=_moved_sizes(store, m),
        created=creation_info(operation="upgrade", source=store.url, upgraded_from=m.format),
        format=FORMAT_VERSION,
        table=None,
    )
    publish_next(store, new, built_on=m.version)
    return UpgradeResult(store.url, new, written, skipped)


def _index_of(store: Store, m: Manifest, i: int) -> bytes | None:
    """Shard ``i``'s index as a pack of today writes it, with each value's checksum (None for shards
    without one: tokens; Arrow shards carry theirs in their record batches, written by the pack)."""
    from ..formats import parquet as parquet_format  # pyarrow, once needed

    path, where = m.paths[i], store.url_of(m.paths[i])
    if m.shard_format == "parquet":
        data = store.read_bytes(path, int(m.nbytes[i]))
        return parquet_format.build_row_index(data, where, checksums=True)[0].to_bytes()
    if m.shard_format not in TAR_COMPRESSION:
        return None
    data = store.read_bytes(path, int(m.nbytes[i]))
    plain = decompress(data, TAR_COMPRESSION[m.shard_format], where)
    return build_index(plain, where, checked=True, compressed=plain is not data)


def _has_checksums(store: Store, m: Manifest, i: int) -> bool:
    """Whether shard ``i`` of a dataset of this format has an index with each value's checksum (or
    needs none: token and Arrow shards)."""
    if m.shard_format not in TAR_COMPRESSION and m.shard_format != "parquet":
        return True
    if not m.index_sha256 or not m.index_sha256[i]:
        return False
    _, raw = stored_index(store, m.paths[i], m.index_sha256[i])
    if raw is None:  # missing, or not the one the manifest names
        return False
    if m.shard_format == "parquet":
        from ..formats import parquet as parquet_format  # pyarrow, once needed

        where, rows, size = store.url_of(m.paths[i]), int(m.stored_counts[i]), int(m.nbytes[i])
        return parquet_format.parse_row_index(raw, where, rows, size).checksums is not None
    return raw[: len(MAGIC_CHECKED)] == MAGIC_CHECKED


def _moved_selection(m: Manifest) -> Any:
    """A split's selection under its name in ``.shardstream/`` (the same samples)."""
    if m.selection is None:
        return None
    samples = samples_of(m)
    return encode_selection([samples.stored_rows_of(i) for i in range(m.num_shards)])[1]


def _moved_sizes(store: Store, m: Manifest) -> Any:
    """The recorded image sizes under their name in ``.shardstream/`` (the same sizes)."""
    if m.image_sizes is None:
        return None
    sizes = read_image_sizes(
        m.image_sizes.reference, lambda n: bytes(store.read_bytes(n)), m.paths, m.stored_counts
    )
    return select_shards(sizes, range(m.num_shards))


__all__ = ["UpgradeResult", "upgrade"]
