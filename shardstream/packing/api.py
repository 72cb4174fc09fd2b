"""``pack``: the public way in, one keyword per setting; what it does is chosen by a table.

The keywords become one frozen :class:`~shardstream.packing.options.PackOptions`; its
:attr:`~shardstream.packing.options.PackOptions.request` names what the pack is asked to do, and
:data:`REQUESTS` the module that does it (by dotted path, imported when first used, as fsspec's
registry): ``fn``'s samples of a list of inputs (:mod:`.function`), a folder split by class
(:mod:`.split`), text tokenized (:mod:`.tokens`), or a source packed (:mod:`.driver`, whose own
table picks the writer by the source's kind and the shard format).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from .driver import PackResult
from .options import TOKEN_OPTIONS, PackOptions
from .rules import DEFAULT_SHARD_SIZE

# what a pack is asked to do -> the function that does it, (source, dest, options) -> result
REQUESTS = {
    "inputs": "shardstream.packing.function:pack_inputs",
    "split": "shardstream.packing.split:pack_split",
    "text": "shardstream.packing.tokens:pack_tokens",
    "source": "shardstream.packing.driver:pack_source",
}


def pack(  # noqa: PLR0913 - the public pack: one keyword per setting, as the command's options
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    samples_per_shard: int | None = None,
    compression: str | None = None,
    workers: int | None = None,
    layout: str = "auto",
    overwrite: bool = False,
    append: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
    fsync: bool = True,
    shuffle: bool = True,
    seed: int = 0,
    split_by: str | None = None,
    fn: Callable[[Any], Any] | None = None,
    fields: Sequence[str] | None = None,
    field_name: str | None = None,
    decode_value: Callable[[bytes, bytes], Any] | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    source_options: dict[str, Any] | None = None,
    index: bool = True,
    image_sizes: bool = True,
    **token_options: Any,
) -> PackResult:
    """Pack ``source`` (a folder tree, or table files) into a dataset at ``dest``.

    Folders become tar shards by default (ImageFolder trees get an integer ``cls``
    field and the class names), tables become Arrow shards. The same input always
    gives the same shards, whatever ``workers`` is. The manifest is written last;
    if anything fails, none is written. With ``fsync`` (default) the shards and then the manifest
    are on disk before each appears, so a power loss never leaves a manifest without its shards.
    Sample keys in tar shards must stay inside the folder ``tar -xf`` extracts to (see
    :func:`~shardstream.packing.fields.key_problem`); a file whose key does not is refused.
    With ``shuffle`` (default), samples are written in a random order drawn from ``seed`` (keys are
    unchanged), so no shard holds one class; a table is then shuffled in memory (``shuffle=False``
    streams a table larger than memory, in its own order).
    ``format="tokens"`` tokenizes a text corpus into token shards: ``token_options`` (``tokenizer``,
    ``text_field``, ``eos``, ``eos_id``, ``vocab_size``, ``dtype``, ``per_file``) are a
    :class:`~shardstream.packing.options.TokenOptions`, for :func:`shardstream.packing.tokens.pack_tokens`.
    ``engine="ray"`` runs the shard jobs of a folder pack as Ray tasks (the cluster at ``ray_address``,
    else ``RAY_ADDRESS``, else a local instance), with the same output bytes as ``engine="local"``
    (:mod:`shardstream.packing.ray_engine`); for ``fn=`` and the sources read sample by sample, Ray
    tasks make the samples and this process writes the shards in order.
    ``split_by="cls"`` packs an ImageFolder tree as one dataset per class under ``dest`` plus a label
    index (see :func:`shardstream.packing.split.pack_split`), for class-balanced mixes.
    ``fn`` packs from a function: ``source`` is then a list of inputs and ``fn(input)`` returns or
    yields sample dicts, written in input order (:mod:`shardstream.packing.function`). HDF5, LMDB,
    NumPy, Hugging Face ``save_to_disk`` folders and existing shards are packed too: ``fields`` picks
    HDF5 datasets or ``.npy`` files, ``field_name`` names an LMDB value's field (default ``bin``), and
    ``decode_value(key, value)`` turns an LMDB value into a sample dict.
    ``index`` (default True): write each tar shard's sample index (``.shardstream/<shard>.idx``): each
    member's checksum, which every read checks, and where each sample lies, so readers open a shard
    without parsing its headers and fetch an epoch's first samples of uncompressed tars from object
    storage by ranged reads. ``False`` writes the tars alone (read without per-sample checksums).
    ``image_sizes`` (default True): record each image field's width and height, read from its header
    (never decoded), in a side file the manifest names (:mod:`shardstream.manifest.image_sizes`), so
    :class:`~shardstream.dataset.batches.bucketed.Bucketed` plans aspect-ratio buckets without reading a sample;
    and, with PyAV installed, each video and audio field's facts (duration, frame rate, size, sample
    rate, ...) from its container headers (:mod:`shardstream.manifest.media_facts`).
    ``append``: add the source's samples to the dataset at ``dest`` as its next version, in new shards
    (same shard format and fields; the earlier versions stay readable; see
    :mod:`shardstream.manifest.versions`); into an empty ``dest`` it packs version 1.

    Args:
        source: a folder tree, a table file or folder of them, an HDF5/LMDB/NumPy source, a Hugging
            Face ``save_to_disk`` folder, existing shards (any fsspec URL for folders and tables), or,
            with ``fn``, a list of inputs.
        dest: the dataset's folder (a local path or an fsspec URL such as ``s3://bucket/prefix``).
        format: ``"tar"``, ``"arrow"`` or ``"tokens"`` (default: tar for folders, Arrow for tables).
        shard_size: the most uncompressed bytes in a shard (``"256MB"`` = 256×10^6 bytes, or an int).
        samples_per_shard: the most samples in a shard (default: no limit).
        compression: ``"zstd"`` or ``"gzip"`` for whole tar shards (default: none), ``"zstd"``
            (default) or ``"lz4"`` for the buffers of Arrow shards; ``"none"``: uncompressed.
        workers: processes that write shards (default: all cores).
        layout: ``"auto"``, ``"imagefolder"``, ``"files"`` or ``"table"``: how to read a folder.
        overwrite: replace a dataset that is already at ``dest`` (it stays readable until the new
            manifest replaces it).
        storage_options: fsspec options for ``dest`` (and for ``source`` unless ``source_options``).
        progress: show a progress bar.
        fsync: flush shards and manifest to disk before each appears.
        shuffle: write samples in a random order drawn from ``seed``.
        seed: the seed of that order.
        split_by: ``"cls"``: one dataset per class and a labels file.
        fn: a function from one input of ``source`` to sample dicts (returned or yielded).
        fields: the HDF5 datasets or ``.npy`` files to pack (default: all).
        field_name: the field an LMDB value is stored under (default ``bin``).
        decode_value: ``(key, value) -> sample dict`` for LMDB values.
        engine: ``"local"`` (a process pool) or ``"ray"``.
        ray_address: the Ray cluster for ``engine="ray"`` (default: ``RAY_ADDRESS``, else a local Ray).
        source_options: fsspec options for ``source`` (default: ``storage_options``).
        index: write sample indexes (default True; False: the tars alone).
        image_sizes: record each image's width and height from its header, and each video's and
            recording's facts from its container headers (default True).
        append: add to the dataset at ``dest`` as its next version (not with ``overwrite``).
        **token_options: for ``format="tokens"``: ``tokenizer``, ``text_field``, ``eos``, ``eos_id``,
            ``vocab_size``, ``dtype``, ``per_file``.

    Returns:
        What was written: counts, sizes, time and the manifest (``result.summary()`` is one line).

    Raises:
        TypeError: a keyword that is neither a setting nor a token option (naming the likely one).
        UsageError: a setting this pack would ignore (e.g. ``compression`` with ``format="tokens"``).
    """
    # the parameters but source and dest: each names a PackOptions field
    settings = {k: v for k, v in locals().items() if k not in ("source", "dest", "token_options")}
    check_keywords(token_options)
    return pack_with(source, dest, PackOptions(**settings, token_options=token_options))


def check_keywords(extra: dict[str, Any]) -> None:
    """Raise :class:`TypeError` for a keyword of :func:`pack` that is neither a setting nor a token option,
    naming the closest real one, as Python does for an unknown keyword."""
    unknown = [name for name in extra if name not in TOKEN_OPTIONS]
    if not unknown:
        return
    known = [p for p in inspect.signature(pack).parameters if p not in ("source", "dest")]
    known = [p for p in known if p != "token_options"] + list(TOKEN_OPTIONS)
    close = difflib.get_close_matches(unknown[0], known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise TypeError(f"pack() got an unexpected keyword argument {unknown[0]!r}{hint}")


def pack_with(source: Any, dest: str | os.PathLike[str], options: PackOptions) -> PackResult:
    """Pack ``source`` into ``dest`` with ``options``: by the function :data:`REQUESTS` names for its request,
    once no setting it would ignore is given."""
    request = options.request
    options.check_request(request)
    module, _, name = REQUESTS[request].partition(":")
    return getattr(importlib.import_module(module), name)(source, dest, options)


__all__ = ["REQUESTS", "PackOptions", "pack", "pack_with"]
