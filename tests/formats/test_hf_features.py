"""Hugging Face features in Arrow shards packed from folders: images stored as ``Image`` structs and read
back as the bytes they were, labels as ``ClassLabel``; the metadata read as untrusted input. What
``datasets`` itself makes of the shards is in tests/interop/test_hugging_face.py."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.ipc
import pytest

from shardstream import ShardDataset, ShardMap, ShardWriter, merge, pack
from shardstream.dataset.samples.decode import IMAGE_EXTENSIONS as DECODED_AS_IMAGES
from shardstream.errors import CorruptShardError, ManifestError
from shardstream.formats import arrow as A
from shardstream.formats import hf_features as H
from shardstream.formats import iter_shard_samples
from shardstream.manifest import load_manifest
from shardstream.storage import Store
from tests.sample_datasets import make_files


def features(schema: pa.Schema) -> dict:
    return json.loads(schema.metadata[b"huggingface"])["info"]["features"]


def test_the_image_fields_are_the_ones_shardstream_decodes_as_images():
    assert H.IMAGE_EXTENSIONS == DECODED_AS_IMAGES
    assert H.is_image("jpg") and H.is_image("seg.PNG") and not H.is_image("png.txt")


def test_a_folder_schema_says_images_labels_and_the_rest():
    schema = H.folder_schema(["txt", "jpg", "seg.png", "jpg"], ["cat", "dog"])
    assert schema.names == ["__key__", "jpg", "seg.png", "txt", "cls"]
    assert schema.field("jpg").type == H.FILE_STRUCT == schema.field("seg.png").type
    assert schema.field("txt").type == pa.binary() and schema.field("cls").type == pa.int64()
    assert features(schema) == {
        "__key__": {"dtype": "string", "_type": "Value"},
        "jpg": {"_type": "Image"},
        "seg.png": {"_type": "Image"},
        "txt": {"dtype": "binary", "_type": "Value"},
        "cls": {"names": ["cat", "dog"], "_type": "ClassLabel"},
    }
    assert H.in_struct(schema) == ["jpg", "seg.png"]
    # what readers see: the binary columns of before
    assert H.unwrapped_schema(schema).field("jpg").type == pa.binary()
    assert "cls" not in H.folder_schema(["jpg"], None).names


def test_wrap_and_unwrap_give_back_the_bytes_and_the_missing_values():
    schema = H.folder_schema(["jpg"], None)
    values = [b"\xff\xd8one", None, b"", b"three"]
    table = pa.table({"__key__": list("abcd"), "jpg": H.wrap(values)}, schema=schema)
    assert table.column("jpg").to_pylist()[0] == {"bytes": b"\xff\xd8one", "path": None}
    assert table.column("jpg").null_count == 1
    back = H.unwrap(table)
    assert back.schema.field("jpg").type == pa.binary()
    assert back.column("jpg").to_pylist() == values


def shard_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    w = A.ArrowShardWriter(buf, table.schema)
    w.add_batch(table)
    w.close()
    return buf.getvalue()


def test_a_struct_column_that_the_metadata_does_not_name_stays_a_struct():
    """An Image column of a table packed as it is (a Hugging Face dataset's): rows as the table has them."""
    table = pa.table(
        {"__key__": ["a"], "image": H.wrap([b"png"])},
        schema=pa.schema([("__key__", pa.string()), ("image", H.FILE_STRUCT)]),
    )
    data = shard_bytes(table)
    assert A.read_table(data).column("image").to_pylist() == [{"bytes": b"png", "path": None}]
    assert list(iter_shard_samples("arrow", data)) == [
        {"__key__": "a", "image": {"bytes": b"png", "path": None}}
    ]


@pytest.mark.parametrize(
    "ours",
    [
        b"not json",
        b'{"bytes_in_struct": "jpg"}',
        b'{"bytes_in_struct": ["txt"]}',  # a binary column
        b'{"bytes_in_struct": ["nothere"]}',
        b"{}",
    ],
)
def test_metadata_that_names_no_struct_column_is_damage(ours):
    schema = pa.schema(
        [("__key__", pa.string()), ("jpg", H.FILE_STRUCT), ("txt", pa.binary())],
        metadata={b"shardstream": ours},
    )
    table = pa.table({"__key__": ["a"], "jpg": H.wrap([b"x"]), "txt": [b"t"]}, schema=schema)
    data = shard_bytes(table)
    with pytest.raises(CorruptShardError, match="shard: its schema's shardstream metadata"):
        A.read_table(data)
    with pytest.raises(CorruptShardError, match="shardstream metadata"):
        list(A.iter_rows(data))


def image_folder(root, classes=("ant", "bee"), n=3):
    files = {}
    for c, name in enumerate(classes):
        for i in range(n):
            files[f"{name}/{i}.jpg"] = bytes([0xFF, 0xD8, c, i]) * (i + 1)
            files[f"{name}/{i}.txt"] = f"{name} {i}".encode()
    return make_files(root, files), files


def test_a_folder_packed_into_arrow_shards_reads_back_as_before(tmp_path):
    src, files = image_folder(tmp_path / "src")
    dest = tmp_path / "ds"
    result = pack(
        src,
        dest,
        format="arrow",
        samples_per_shard=4,
        layout="imagefolder",
        progress=False,
        shuffle=False,
    )
    m = result.manifest
    # the manifest says what readers see
    assert {f["name"]: f["type"] for f in m.fields} == {
        "__key__": "string",
        "jpg": "binary",
        "txt": "binary",
        "cls": "int64",
    }
    schema = pa.ipc.open_file(str(dest / m.paths[0])).schema
    assert features(schema)["cls"] == {"names": ["ant", "bee"], "_type": "ClassLabel"}
    assert features(schema)["jpg"] == {"_type": "Image"}
    sm = ShardMap(str(dest), decode=None)
    got = {sm[i]["__key__"]: sm[i] for i in range(len(sm))}
    assert sorted(got) == ["ant/0", "ant/1", "ant/2", "bee/0", "bee/1", "bee/2"]
    for key, sample in got.items():
        assert sample["jpg"] == files[f"{key}.jpg"] and sample["txt"] == files[f"{key}.txt"]
        assert sample["cls"] == ["ant", "bee"].index(key.split("/")[0])
    streamed = list(ShardDataset(str(dest), decode=None, shuffle=False))
    assert [bytes(s["jpg"]) for s in streamed] == [got[s["__key__"]]["jpg"] for s in streamed]


def test_an_append_keeps_the_datasets_schema(tmp_path):
    src, _ = image_folder(tmp_path / "src")
    more, _ = image_folder(tmp_path / "more", n=2)
    dest = tmp_path / "ds"
    pack(src, dest, format="arrow", layout="imagefolder", progress=False)
    pack(more, dest, format="arrow", layout="imagefolder", append=True, progress=False)
    m = load_manifest(Store(str(dest)))
    schemas = {pa.ipc.open_file(str(dest / p)).schema.serialize().to_pybytes() for p in m.paths}
    assert len(m.paths) == 2 and len(schemas) == 1
    assert len(ShardMap(str(dest))) == 10


def test_an_append_to_arrow_shards_of_binary_images_stays_binary(tmp_path):
    """A dataset packed before images went into Image structs: the new shards are like its own."""
    src, files = image_folder(tmp_path / "src", n=2)
    dest = tmp_path / "ds"
    before = pa.schema(
        [("__key__", pa.string()), ("jpg", pa.binary()), ("txt", pa.binary()), ("cls", pa.int64())]
    )
    with ShardWriter(str(dest), format="arrow", schema=before, classes=["ant", "bee"]) as w:
        w.write({"__key__": "old/0", "jpg": b"\xff\xd8old", "txt": b"old", "cls": 1})
    pack(
        src, dest, format="arrow", layout="imagefolder", append=True, progress=False, shuffle=False
    )
    m = load_manifest(Store(str(dest)))
    new = pa.ipc.open_file(str(dest / m.paths[1])).schema
    assert new.field("jpg").type == pa.binary() and b"huggingface" not in (new.metadata or {})
    sm = ShardMap(str(dest), decode=None)
    assert [sm[i]["jpg"] for i in range(len(sm))] == [b"\xff\xd8old"] + [
        files[f"{k}.jpg"] for k in ("ant/0", "ant/1", "bee/0", "bee/1")
    ]


def test_arrow_packs_of_other_classes_merge_and_are_relabelled(tmp_path):
    """Each pack's ClassLabel names its own classes: the features differ, the columns do not."""
    src, _ = image_folder(tmp_path / "src", classes=("ant", "bee"), n=2)
    other, _ = image_folder(tmp_path / "other", classes=("bee", "cow"), n=1)
    for folder, dest in ((src, "a"), (other, "b")):
        pack(folder, tmp_path / dest, format="arrow", layout="imagefolder", progress=False)
    merged = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "ab")
    assert merged.classes == ["ant", "bee", "cow"]
    sm = ShardMap(str(tmp_path / "ab"), decode=None)
    labels = {sm[i]["__key__"]: sm[i]["cls"] for i in range(len(sm))}
    assert labels == {"ant/0": 0, "ant/1": 0, "bee/0": 1, "bee/1": 1, "cow/0": 2}


def test_an_append_of_other_columns_is_still_refused(tmp_path):
    src, _ = image_folder(tmp_path / "src", n=2)
    dest = tmp_path / "ds"
    pack(src, dest, format="arrow", layout="imagefolder", progress=False)
    more = make_files(tmp_path / "more", {"ant/9.png": b"\x89PNG", "bee/9.png": b"\x89PNG"})
    with pytest.raises(ManifestError, match="its Arrow schema differs"):
        pack(more, dest, format="arrow", layout="imagefolder", append=True, progress=False)
