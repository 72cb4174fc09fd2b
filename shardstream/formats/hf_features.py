"""Hugging Face ``datasets`` features in an Arrow shard's schema, so that ``load_dataset`` decodes a
folder's images and labels as shardstream does.

``datasets`` takes a column's feature from the schema's ``huggingface`` metadata (JSON
``{"info": {"features": {...}}}``) only where the column's Arrow type is the feature's storage type.
A ``ClassLabel``'s is ``int64``, so the labels' column stays as it is; an ``Image``'s is
``struct<bytes: binary, path: string>``, so image columns are stored in that struct (``path`` null,
the bytes unchanged). The schema's ``shardstream`` metadata names those columns, and :func:`unwrap`
gives them back as the binary columns they were: what a shardstream reader returns does not change.
A column only ever counts as one of these when the metadata names it and its type is the struct;
everything here reads the metadata as untrusted input.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from ..errors import CorruptShardError

# What datasets' Image stores: the encoded file's bytes and its path (null here).
FILE_STRUCT = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
# The fields that shardstream's decoder reads as images (dataset.decode.IMAGE_EXTENSIONS; a test holds
# them equal): Pillow decodes each of them, as datasets' Image does.
IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif", "tif", "tiff"}
)
HF_KEY = b"huggingface"
OURS_KEY = b"shardstream"
_IN_STRUCT = "bytes_in_struct"


def is_image(field: str) -> bool:
    """Whether a field holds images: its extension (the part after its last dot) says so."""
    return field.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS


def _feature(type_: pa.DataType) -> dict[str, Any]:
    if type_ == FILE_STRUCT:
        return {"_type": "Image"}
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return {"dtype": "string", "_type": "Value"}
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        return {"dtype": "binary", "_type": "Value"}
    return {"dtype": str(type_), "_type": "Value"}


def folder_schema(fields: Iterable[str], classes: Sequence[str] | None) -> pa.Schema:
    """The Arrow schema of a folder's samples: ``__key__`` (string), each field in name order (images
    in the ``Image`` struct, the others binary), then ``cls`` (int64) when the folder's classes label
    them; its metadata holds the ``datasets`` features (``cls`` a ``ClassLabel`` of ``classes``) and
    the names of the columns stored in the struct."""
    names = sorted(set(fields))
    columns = [pa.field("__key__", pa.string())] + [
        pa.field(n, FILE_STRUCT if is_image(n) else pa.binary()) for n in names
    ]
    features = {f.name: _feature(f.type) for f in columns}
    if classes is not None:
        columns.append(pa.field("cls", pa.int64()))
        features["cls"] = {"names": list(classes), "_type": "ClassLabel"}
    metadata = {
        HF_KEY: json.dumps({"info": {"features": features}}, ensure_ascii=False),
        OURS_KEY: json.dumps({_IN_STRUCT: [n for n in names if is_image(n)]}),
    }
    return pa.schema(columns, metadata=metadata)


def in_struct(schema: pa.Schema, name: str = "shard") -> list[str]:
    """The columns whose bytes the schema stores in the ``Image`` struct (as its metadata names them);
    a name that is not such a column is damage, a :class:`CorruptShardError`."""
    raw = (schema.metadata or {}).get(OURS_KEY)
    if raw is None:
        return []
    try:
        listed = json.loads(raw)[_IN_STRUCT]
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptShardError(
            f"{name}: its schema's shardstream metadata is not readable ({exc}); re-create it"
        ) from None
    if not isinstance(listed, list) or not all(
        isinstance(n, str)
        and schema.get_field_index(n) >= 0
        and schema.field(n).type == FILE_STRUCT
        for n in listed
    ):
        raise CorruptShardError(
            f"{name}: its schema's shardstream metadata names columns that do not hold bytes in a "
            f"{{bytes, path}} struct ({listed!r}); re-create it"
        )
    return listed


def unwrapped_schema(schema: pa.Schema, name: str = "shard") -> pa.Schema:
    """``schema`` with its struct-stored columns as the binary columns a reader sees."""
    for column in in_struct(schema, name):
        i = schema.get_field_index(column)
        schema = schema.set(i, pa.field(column, pa.binary()))
    return schema


def unwrap(table: pa.Table, name: str = "shard") -> pa.Table:
    """``table`` with each struct-stored column replaced by its bytes (a null sample stays null): what
    the column held before it was packed."""
    import pyarrow.compute as pc

    for column in in_struct(table.schema, name):
        i = table.schema.get_field_index(column)
        table = table.set_column(i, column, pc.struct_field(table.column(i), [0]))
    return table


def wrap(values: Sequence[Any]) -> pa.Array:
    """Bytes (``None`` for none) as ``Image`` structs with a null path."""
    data = pa.array(values, pa.binary())
    paths = pa.nulls(len(data), pa.string())
    return pa.StructArray.from_arrays(
        [data, paths], fields=list(FILE_STRUCT), mask=data.is_null() if data.null_count else None
    )


__all__ = [
    "FILE_STRUCT",
    "IMAGE_EXTENSIONS",
    "folder_schema",
    "in_struct",
    "is_image",
    "unwrap",
    "unwrapped_schema",
    "wrap",
]
