"""``pack``: the public way in, one keyword per setting; what it does is chosen by a table.

The keywords become one frozen :class:`~shardstream.packing.options.PackOptions`; its
:attr:`~shardstream.packing.options.PackOptions.request` names what the pack is asked to do, and
:data:`REQUESTS` the module that does it (by dotted path, imported when first used, as fsspec's
registry): ``fn``'s samples of a list of inputs (:mod:`.function`), a folder split by class
(:mod:`.split`), text tokenized (:mod:`.tokens`), or a source packed (:mod:`.driver`, whose own
table picks the writer by the source's kind and the shard format).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

from .driver import PackResult
from .options import PackOptions
from .rules import DEFAULT_SHARD_SIZE

# what a pack is asked to do -> the function that does it, (source, dest, options) -> result
REQUESTS = {
    "inputs": "shardstream.packing.function:pack_inputs",
    "split": "shardstream.packing.split:pack_split",
    "text": "shardstream.packing.tokens:pack_text",
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
    ``text_field``, ``eos``, ``eos_id``, ``vocab_size``, ``dtype``, ``per_file``) go to
    :func:`shardstream.packing.tokens.pack_tokens`.
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
    ``index`` (default True): write each uncompressed tar shard's sample index (``<shard>.idx``):
    readers open a shard from it without parsing its headers, and fetch an epoch's first samples from
    object storage by ranged reads. ``False`` writes the tars alone.
    """
    options = PackOptions(
        format=format,
        shard_size=shard_size,
        samples_per_shard=samples_per_shard,
        compression=compression,
        workers=workers,
        layout=layout,
        overwrite=overwrite,
        storage_options=storage_options,
        progress=progress,
        fsync=fsync,
        shuffle=shuffle,
        seed=seed,
        split_by=split_by,
        fn=fn,
        fields=fields,
        field_name=field_name,
        decode_value=decode_value,
        engine=engine,
        ray_address=ray_address,
        source_options=source_options,
        index=index,
        token_options=token_options,
    )
    return pack_with(source, dest, options)


def pack_with(source: Any, dest: str | os.PathLike[str], options: PackOptions) -> PackResult:
    """Pack ``source`` into ``dest`` with ``options``: by the function :data:`REQUESTS` names for its request."""
    module, _, name = REQUESTS[options.request].partition(":")
    return getattr(importlib.import_module(module), name)(source, dest, options)


__all__ = ["REQUESTS", "PackOptions", "pack", "pack_with"]
