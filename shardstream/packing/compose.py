"""``merge`` and ``split``: new datasets made of other datasets' shards, read where they are, never copied.

A merged or split dataset's manifest names folders beside its own (``roots``: ``../a``) and lists the
source shards under them, with their counts, sizes and checksums carried over; ``split`` adds a selection
of each shard's samples (:mod:`shardstream.manifest.selection`). Sources that share the destination's
root (one local file system, or one bucket with the same storage options) are named by relative path, so
the whole tree can be moved or copied together; others by full URL (``s3://bucket/a``, or
``file:///data/a`` from a bucket), declared in ``roots``, which a reader follows only where it trusts
the location (``StorageSettings.trusted_roots``). Sources with other class lists are unified: the merge
lists their union and each shard's label map (:mod:`shardstream.manifest.relabel`); no shard is rewritten. Both publish through a claim of the destination, like a
pack (:mod:`.destination`): the manifest appears last and atomically.

A sample's part in a split is a hash of its key and the seed (BLAKE2b, 64 bits, against the parts'
cumulative fractions), so the parts are disjoint, together hold every sample, and a sample stays in its
part when the source is appended to and split again. Splitting reads every shard's keys once (its
sample index, or its tar headers, or an Arrow shard's ``__key__`` column; Arrow shards without keys use
``<shard path>#<row>``): O(samples) once; reading a part afterwards costs its selection, 4 bytes per
selected sample, loaded when it opens.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ShardstreamError
from ..formats import TAR_COMPRESSION, tar
from ..formats.compression import decompress
from ..manifest import Manifest, creation_info, dataset_store, load_manifest
from ..manifest.combine import difference
from ..manifest.image_sizes import ImageSizes, join_image_sizes, read_image_sizes, select_shards
from ..manifest.locate import open_stored
from ..manifest.media_facts import facts_of_shards, recorded_media
from ..manifest.relabel import Relabel, unify
from ..manifest.sample_set import samples_of
from ..manifest.selection import encode_selection
from ..storage import Store
from ..storage.routed import root_url
from .destination import prepare_destination

__all__ = ["merge", "part_of_keys", "split"]


def _relative(source: Store, dest: Store) -> str:
    """The folder of ``source`` as ``dest``'s manifest names it: relative (``../a``) when they share a root,
    else its full URL (``s3://bucket/a``, ``file:///data/a``), which readers follow only where trusted."""
    if (
        source.protocol != dest.protocol
        or (not source.local and source.storage_options != dest.storage_options)
        or (not source.local and source.root.split("/")[0] != dest.root.split("/")[0])
    ):
        return root_url(source)  # another store, or another bucket
    if source.local:
        rel = os.path.relpath(source.root, dest.root).replace(os.sep, "/")
    else:
        rel = posixpath.relpath(source.root, dest.root)
    if rel == "." or not rel.startswith(".."):
        raise ShardstreamError(
            f"{dest.url} is {'the same folder as' if rel == '.' else 'a folder above'} {source.url}; "
            "write the new dataset beside its sources, not over or around them"
        )
    return rel


def _rebased(m: Manifest, rel: str) -> tuple[list[str], list[str]]:
    """(paths, roots) of ``m``'s shards as seen from a folder where ``m``'s is ``rel`` (relative, or a full
    URL); shards ``m`` names by full URL keep it."""
    paths = [_joined(rel, p) for p in m.paths]
    roots = {_joined(rel, r) for r in (m.roots or [])}
    if not all(
        p.startswith("../") or "://" in p for p in m.paths
    ):  # some in the source's own folder
        roots.add(rel)
    return paths, sorted(roots)


def _joined(base: str, name: str) -> str:
    """``name`` (relative to a folder) relative to where that folder is ``base``; a full URL as it is."""
    if "://" in name:
        return name
    if "://" not in base:
        return posixpath.normpath(f"{base}/{name}")
    scheme, rest = base.split("://", 1)
    joined = posixpath.normpath(posixpath.join(rest, name))
    outside = joined.startswith("..") or (
        scheme != "file" and joined.split("/")[0] != rest.split("/")[0]
    )
    if outside:
        raise ShardstreamError(
            f"{base}/{name} climbs out of its {'file system' if scheme == 'file' else 'bucket'}; "
            "merge the datasets it reads instead"
        )
    return f"{scheme}://{joined}"


def _publish(dest: Store, manifest: Manifest, overwrite: bool) -> Manifest:
    claim = prepare_destination(dest, overwrite, fsync=True, appendable=False)
    with claim.guard():
        return claim.publish(manifest)


def _check_dest(dest: Store, sources: Sequence[Store]) -> None:
    if any(s.url == dest.url for s in sources):
        raise ShardstreamError(f"{dest.url} is one of the sources; write the new dataset elsewhere")


def merge(
    sources: Sequence[str | os.PathLike[str]],
    dest: str | os.PathLike[str],
    *,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Manifest:
    """A dataset at ``dest`` made of the shards of ``sources`` (their latest versions), in order, read
    where they are: no shard is copied. Shard format, Arrow schema and fields must agree (a one-line
    error names the difference). Class lists may differ: the merge lists their union (the first
    source's classes in order, then each next source's new ones in order) and records, per source, the
    map of its labels to the union (``relabel``), which readers apply to every sample's ``cls``.

    Args:
        sources: the datasets to merge (folders or fsspec URLs), in order.
        dest: the merged dataset's folder: beside the sources (on their store: relative paths), or
            anywhere else (full URLs, read only where trusted; see the module).
        storage_options: fsspec options for the sources and ``dest``.
        overwrite: replace a dataset already at ``dest``.

    Returns:
        The published manifest.
    """
    if len(sources) < 1:
        raise ShardstreamError("merge needs at least one source dataset")
    stores = [dataset_store(os.fspath(s), storage_options) for s in sources]
    target = Store(os.fspath(dest), storage_options)
    _check_dest(target, stores)
    manifests = [load_manifest(s) for s in stores]
    first = manifests[0]
    paths: list[str] = []
    roots: set[str] = set()
    for store, m in zip(stores, manifests):
        problem = difference(first, m, same_classes=False) if m is not first else None
        if problem is not None:
            raise ShardstreamError(
                f"cannot merge {store.url} with {stores[0].url}: {problem.replace('its ', 'the first ', 1)}"
            )
        rebased, more = _rebased(m, _relative(store, target))
        paths += rebased
        roots |= set(more)
    selection = None
    if any(m.selection is not None for m in manifests):
        per_shard = [rows for m in manifests for rows in _rows(m)]
        selection = encode_selection(per_shard)[1]
    manifest = Manifest(
        shard_format=first.shard_format,
        paths=paths,
        stored_counts=np.concatenate([m.stored_counts for m in manifests]),
        nbytes=np.concatenate([m.nbytes for m in manifests]),
        sha256=[d for m in manifests for d in m.sha256],
        fields=_merged_fields(manifests),
        arrow_schema=first.arrow_schema,
        created=creation_info(operation="merge", source=", ".join(s.url for s in stores)),
        index_sha256=_index_column(manifests),
        roots=sorted(roots),
        selection=selection,
        image_sizes=_joined_sizes(stores, manifests),
        **_unified_classes(manifests),
        media=facts_of_shards(
            [
                (recorded_media(s, m), m.stored_counts, range(m.num_shards))
                for s, m in zip(stores, manifests)
            ]
        ),
    )
    return _publish(target, manifest, overwrite)


def _recorded_sizes(store: Store, m: Manifest) -> ImageSizes | None:
    """The image sizes ``m`` (in ``store``) recorded at pack time, or None."""
    if m.image_sizes is None:
        return None
    read = lambda name: bytes(store.read_bytes(name))  # noqa: E731
    return read_image_sizes(m.image_sizes.reference, read, m.paths, m.stored_counts)


def _joined_sizes(stores: Sequence[Store], manifests: Sequence[Manifest]) -> ImageSizes | None:
    """A merge's recorded image sizes: every source's, in order (None unless every source has them), so
    that a ``Bucketed`` plans a merge's epoch up front as it does its sources'."""
    found = [_recorded_sizes(store, m) for store, m in zip(stores, manifests)]
    if not found or any(sizes is None for sizes in found):
        return None
    joined = select_shards(found[0], range(len(found[0].counts)))  # a side file of the merge's own
    for sizes in found[1:]:
        joined = join_image_sizes(joined, sizes)  # type: ignore[arg-type]
    return joined


def _unified_classes(manifests: list[Manifest]) -> dict[str, Any]:
    """``classes`` and ``relabel`` of the merge of ``manifests``: the union of their class lists (the
    first's in order, then each next one's new classes in order) and, where a source's labels then mean
    other indexes, each shard's map to the union; equal lists need no map."""
    if manifests[0].classes is None:
        return {"classes": None, "relabel": None}
    classes, maps = unify([m.classes or [] for m in manifests])
    per_shard: list[tuple[int, ...]] = []
    for m, to_union in zip(manifests, maps):
        own = m.relabel.shard_maps() if m.relabel is not None else [None] * m.num_shards
        per_shard += [to_union if s is None else tuple(to_union[v] for v in s) for s in own]
    if all(s == tuple(range(len(s))) for s in per_shard):
        return {"classes": classes, "relabel": None}
    return {"classes": classes, "relabel": Relabel.of_shards(per_shard)}


def _rows(m: Manifest) -> list[np.ndarray]:
    """Per shard of ``m``, the stored samples ``m`` reads."""
    samples = samples_of(m)
    return [samples.stored_rows_of(i).astype(np.uint32) for i in range(m.num_shards)]


def _merged_fields(manifests: list[Manifest]) -> list[dict[str, Any]]:
    out = [dict(f) for f in manifests[0].fields]
    for m in manifests[1:]:
        counts = {f["name"]: f.get("samples") for f in m.fields}
        for f in out:
            if "samples" in f and counts.get(f["name"]) is not None:
                f["samples"] += counts[f["name"]]
    return out


def _index_column(manifests: list[Manifest]) -> list[str] | None:
    if all(m.index_sha256 is None for m in manifests):
        return None
    return [d for m in manifests for d in (m.index_sha256 or [""] * m.num_shards)]


def part_of_keys(keys: Sequence[str], fractions: Sequence[float], seed: int) -> np.ndarray:
    """Each key's part: a 64-bit BLAKE2b hash of the seed and the key, against the cumulative fractions."""
    salt = int(seed).to_bytes(8, "little", signed=True)
    hashes = np.array(
        [
            int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8, salt=salt).digest(), "little")
            for k in keys
        ],
        dtype=np.uint64,
    )
    unit = hashes.astype(np.float64) / float(1 << 64)
    bounds = np.cumsum(fractions)[:-1]
    return np.searchsorted(bounds, unit, side="right")


def _shard_keys(store: Store, m: Manifest, shard: int) -> tuple[list[str], list[Any] | None]:
    """The keys of every stored sample of ``m``'s shard ``shard`` (read once, whole), and each one's
    field names (tar shards; ``None`` for tables, whose fields are columns)."""
    name = m.paths[shard]
    data = store.read_bytes(name, int(m.nbytes[shard]))
    if m.shard_format == "arrow":
        from ..formats import arrow

        table = arrow.read_table(data, store.url_of(name))
        if "__key__" in table.column_names:
            return [str(k) for k in table.column("__key__").to_pylist()], None
        return [f"{name}#{row}" for row in range(table.num_rows)], None
    if m.shard_format not in TAR_COMPRESSION:
        raise ShardstreamError(
            f"split reads tar and Arrow shards; {store.url} holds {m.shard_format} shards"
        )
    plain = decompress(data, TAR_COMPRESSION[m.shard_format], store.url_of(name))
    keys, fields = tar.index_samples(plain, store.url_of(name))
    if len(keys) != int(m.stored_counts[shard]):
        raise ShardstreamError(
            f"{store.url_of(name)} holds {len(keys)} samples, the manifest says "
            f"{int(m.stored_counts[shard])}; verify the dataset"
        )
    return keys, fields


def split(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    parts: Mapping[str, float],
    *,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    overwrite: bool = False,
    trusted_roots: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Manifest]:
    """One dataset per part under ``dest`` (``dest/train``, ``dest/val``), each selecting the samples of
    ``source``'s shards (its latest version) whose key hashes into that part (see the module's
    documentation); no shard is copied. ``parts``: name -> fraction, the fractions adding up to 1.

    Args:
        source: the dataset to split (a folder or an fsspec URL).
        dest: the folder that gets one dataset per part.
        parts: part name -> fraction of the samples (adding up to 1).
        seed: the seed of the key hash that assigns each sample its part.
        storage_options: fsspec options for ``source`` and ``dest``.
        overwrite: replace datasets already at the parts' folders.
        trusted_roots: where ``source`` (a merge across stores) may name shards by full URL, each
            location with its fsspec options (as ``StorageSettings.trusted_roots``); the parts name
            them the same way.

    Returns:
        The published manifests by part.
    """
    names, fractions = _check_parts(parts)
    store, m = open_stored(os.fspath(source), storage_options, trusted_roots=trusted_roots)
    root = Store(os.fspath(dest), storage_options)
    chosen: list[list[np.ndarray]] = [[] for _ in names]
    fields: list[Counter[str]] = [Counter() for _ in names]  # each part's samples of each field
    sizes, media = _recorded_sizes(store, m), recorded_media(store, m)
    for shard, rows in enumerate(_rows(m)):
        keys, members = _shard_keys(store, m, shard)
        part = part_of_keys([keys[int(r)] for r in rows], fractions, seed)
        for k in range(len(names)):
            chosen[k].append(rows[part == k])
            if members is not None:
                fields[k].update(f for r in chosen[k][-1].tolist() for f in members[r])
    out = {}
    for k, name in enumerate(names):
        target = Store(posixpath.join(root.url, name), storage_options)
        _check_dest(target, [store])
        part = _part((m, store, sizes), target, chosen[k], fields[k], name, seed)
        kept = [i for i, r in enumerate(chosen[k]) if len(r)]  # the shards the part lists
        part.media = facts_of_shards([(media, m.stored_counts, kept)])
        out[name] = _publish(target, part, overwrite)
    return out


def _check_parts(parts: Mapping[str, float]) -> tuple[list[str], list[float]]:
    names = list(parts)
    fractions = [float(parts[n]) for n in names]
    if not names or any(not f > 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ShardstreamError(
            f"split parts must have fractions above 0 that add up to 1, not {dict(parts)}; e.g. "
            "--into train=0.98 val=0.02"
        )
    bad = [n for n in names if not n or "/" in n or n.startswith((".", "_"))]
    if bad:
        raise ShardstreamError(f"{bad[0]!r} cannot name a part: it is a folder under DEST")
    return names, fractions


def _part(  # one part's pieces
    source: tuple[Manifest, Store, ImageSizes | None],
    target: Store,
    rows: list[np.ndarray],
    fields: Counter[str],
    name: str,
    seed: int,
) -> Manifest:
    """The manifest of one part of ``source`` (its manifest, store and recorded image sizes): the shards
    it selects samples of, its selection, its fields with their counts among its samples (``fields``;
    tables have none) and the recorded image sizes of its shards."""
    m, store, sizes = source
    keep = [i for i, r in enumerate(rows) if len(r)]
    paths, roots = _rebased(m, _relative(store, target))
    index = m.index_sha256
    return Manifest(
        shard_format=m.shard_format,
        paths=[paths[i] for i in keep],
        stored_counts=m.stored_counts[keep],
        nbytes=m.nbytes[keep],
        sha256=[m.sha256[i] for i in keep],
        fields=[
            {**f, "samples": fields[f["name"]]} if "samples" in f else dict(f) for f in m.fields
        ],
        classes=m.classes,
        arrow_schema=m.arrow_schema,
        created=creation_info(operation="split", source=store.url, part=name, seed=int(seed)),
        index_sha256=None if index is None else [index[i] for i in keep],
        roots=roots,
        selection=encode_selection([rows[i] for i in keep])[1],
        relabel=None
        if m.relabel is None
        else Relabel.of_shards([m.relabel.shard_maps()[i] for i in keep]),
        image_sizes=None if sizes is None else select_shards(sizes, keep),
    )
