"""The shard table of large manifests: written before the head, checked on load, same dataset either way."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest

from shardstream.errors import ManifestError
from shardstream.manifest import Manifest, load_manifest, shard_name, write_manifest
from shardstream.manifest.schema import FORMAT_VERSION, MANIFEST_NAME
from shardstream.manifest.table import HexColumn, encode_table, table_reference
from shardstream.storage import Store
from tests.folders import folder_files


def _manifest(n: int = 50, index: bool = True) -> Manifest:
    sha = [hashlib.sha256(str(i).encode()).hexdigest() if i % 7 else "" for i in range(n)]
    idx = (
        [hashlib.sha256(f"i{i}".encode()).hexdigest() if i % 3 else "" for i in range(n)]
        if index
        else None
    )
    return Manifest(
        "tar",
        [f"part/shard-{i:06d}.tar" for i in range(n)],
        np.arange(n) + 1,
        np.arange(n) * 100 + 7,
        sha,
        fields=[{"name": "jpg", "type": "bytes", "samples": 3}],
        classes=["a", "b"],
        created={"by": "test"},
        index_sha256=idx,
    )


def _write(tmp_path, m: Manifest, threshold: int = 10) -> tuple[Store, str | None]:
    store = Store(str(tmp_path))
    return store, write_manifest(store, m, table_threshold=threshold)


def _put(folder, name: str, data: bytes) -> None:
    """``data`` as the file ``name`` of ``folder`` (a table's name is in ``.shardstream/``)."""
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


@pytest.mark.parametrize("index", [True, False])
def test_round_trip_through_a_table_keeps_every_column_and_the_fingerprint(tmp_path, index):
    m = _manifest(index=index)
    store, name = _write(tmp_path, m)
    assert name is not None and (tmp_path / name).exists()
    # the table is shardstream's own file: in .shardstream/, nothing beside the head
    assert name.startswith(".shardstream/shards-") and name.endswith(".arrow")
    assert folder_files(tmp_path) == sorted([MANIFEST_NAME, name])
    head = json.loads((tmp_path / MANIFEST_NAME).read_text())
    assert head["shards"] == {
        "table": name,
        "sha256": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest(),
        "rows": 50,
    }
    assert head["num_shards"] == 50 and head["classes"] == ["a", "b"]
    # older shardstreams say "upgrade" instead of misreading it (or looking for it beside the head)
    assert head["shardstream_manifest"] == FORMAT_VERSION == 4
    loaded = load_manifest(store)
    assert isinstance(loaded.sha256, HexColumn)
    assert loaded.paths == m.paths and loaded.sha256 == m.sha256 and list(loaded.sha256) == m.sha256
    assert (loaded.stored_counts == m.stored_counts).all() and (loaded.nbytes == m.nbytes).all()
    assert loaded.index_sha256 == m.index_sha256
    assert (
        loaded.sha256[0] == ""
        and loaded.sha256[1] == m.sha256[1]
        and loaded.sha256[-1] == m.sha256[-1]
    )
    assert loaded.fingerprint == m.fingerprint
    assert loaded.fields == m.fields and loaded.num_samples == m.num_samples


def test_below_the_threshold_the_manifest_stays_one_json_file(tmp_path):
    m = _manifest()
    store, name = _write(tmp_path, m, threshold=51)
    assert name is None and folder_files(tmp_path) == [MANIFEST_NAME]
    assert json.loads((tmp_path / MANIFEST_NAME).read_text())["shardstream_manifest"] == 4
    assert load_manifest(store).sha256 == m.sha256


def test_a_table_loaded_manifest_saves_again_as_either_form(tmp_path):
    m = _manifest()
    (tmp_path / "a").mkdir()
    store, name_a = _write(tmp_path / "a", m)
    loaded = load_manifest(store)
    again = Manifest.from_json(loaded.to_json())  # the old one-file form, from hex columns
    assert (
        again.sha256 == m.sha256
        and again.index_sha256 == m.index_sha256
        and again.fingerprint == m.fingerprint
    )
    (tmp_path / "b").mkdir()
    store_b, name_b = _write(tmp_path / "b", loaded)
    assert name_b == name_a  # same columns, same table bytes, same name
    assert load_manifest(store_b).fingerprint == m.fingerprint


def test_a_changed_table_is_refused_before_it_is_parsed(tmp_path):
    store, name = _write(tmp_path, _manifest())
    data = bytearray((tmp_path / name).read_bytes())
    data[-20] ^= 1
    (tmp_path / name).write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="does not match its sha256"):
        load_manifest(store)


def test_a_missing_table_names_itself(tmp_path):
    store, name = _write(tmp_path, _manifest())
    (tmp_path / name).unlink()
    with pytest.raises(ManifestError, match=f"{name}, which is missing"):
        load_manifest(store)


_SHA = "0123456789abcdef" + "0" * 48  # starts as the names below: only the name is wrong


@pytest.mark.parametrize(
    "ref",
    [
        {"table": "../_shards-0123456789abcdef.arrow", "sha256": "0" * 64, "rows": 1},
        {"table": "../.shardstream/shards-0123456789abcdef.arrow", "sha256": _SHA, "rows": 1},
        {"table": ".shardstream/../shards-0123456789abcdef.arrow", "sha256": _SHA, "rows": 1},
        {"table": "x/.shardstream/shards-0123456789abcdef.arrow", "sha256": _SHA, "rows": 1},
        # neither where format 4 keeps it nor where format 2 did
        {"table": "shards-0123456789abcdef.arrow", "sha256": _SHA, "rows": 1},
        {"table": ".shardstream/_shards-0123456789abcdef.arrow", "sha256": _SHA, "rows": 1},
        {
            "table": ".shardstream/shards-0123456789abcdef.arrow",
            "sha256": "0" * 64,
            "rows": 1,
        },  # sha does not start as the name
        {
            "table": ".shardstream/shards-0123456789abcdef.arrow",
            "sha256": "0123456789abcdef" + "0" * 48,
            "rows": -1,
        },
        {
            "table": "_shards-0123456789abcdef.arrow",  # a format-2 head's name: the same checks
            "sha256": "0123456789abcdef" + "0" * 48,
            "rows": -1,
        },
        {
            "table": ".shardstream/shards-0123456789abcdef.arrow",
            "sha256": "0123456789abcdef" + "0" * 48,
            "rows": 1,
            "x": 1,
        },
    ],
)
def test_a_bad_table_reference_is_refused(ref):
    head = json.loads(_manifest().to_json())
    head["shards"] = ref
    with pytest.raises(ManifestError, match="shard table"):
        Manifest.from_json(json.dumps(head), "m.json", lambda name: b"")


def test_a_format_2_head_reads_its_table_beside_it(tmp_path):
    """A dataset written before format 4 keeps its table as ``_shards-<16 hex>.arrow`` beside the head."""
    m = _manifest()
    data = encode_table(m.paths, m.stored_counts, m.nbytes, m.sha256, m.index_sha256)
    ref = table_reference(data, m.num_shards)
    old = "_" + ref["table"].removeprefix(".shardstream/")
    assert old.startswith("_shards-")
    head = json.loads(m.to_json({**ref, "table": old}))
    head["shardstream_manifest"] = 2
    (tmp_path / old).write_bytes(data)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(head))
    loaded = load_manifest(Store(str(tmp_path)))
    assert loaded.paths == m.paths and loaded.sha256 == m.sha256 and loaded.table == old
    assert loaded.index_sha256 == m.index_sha256 and loaded.fingerprint == m.fingerprint
    assert loaded.format == 2


def _head_for(tmp_path, columns: dict) -> Store:
    """A head naming a hand-made (hostile) table with ``columns``."""
    table = pa.table(columns)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    ref = table_reference(data, table.num_rows)
    _put(tmp_path, ref["table"], data)
    (tmp_path / MANIFEST_NAME).write_bytes(_manifest(table.num_rows).to_json(ref))
    return Store(str(tmp_path))


def _columns(n: int = 3, **change) -> dict:
    columns = {
        "path": pa.array([f"s{i}.tar" for i in range(n)]),
        "samples": pa.array([1] * n, pa.int64()),
        "bytes": pa.array([5] * n, pa.int64()),
        "sha256": pa.array([b"\0" * 32] * n, pa.binary(32)),
    }
    columns.update(change)
    return columns


@pytest.mark.parametrize(
    "change, message",
    [
        ({"path": pa.array(["s0.tar", "../up.tar", "s2.tar"])}, "'..'"),
        ({"path": pa.array(["s0.tar", "s0.tar", "s2.tar"])}, "each shard is listed once"),
        ({"path": pa.array(["s0.tar", None, "s2.tar"])}, "null"),
        ({"samples": pa.array([1, -1, 1], pa.int64())}, "negative"),
        ({"bytes": pa.array([1, 2**53, 1], pa.int64())}, "too large"),
        ({"samples": pa.array([1, 2, 3], pa.int32())}, "columns"),
        ({"sha256": pa.array(["x"] * 3)}, "columns"),
        ({"extra": pa.array([1, 2, 3])}, "columns"),
    ],
)
def test_a_hostile_table_gets_the_same_schema_checks(tmp_path, change, message):
    store = _head_for(tmp_path, _columns(**change))
    with pytest.raises(ManifestError, match=message):
        load_manifest(store)


def test_a_table_whose_rows_disagree_with_the_head_is_refused(tmp_path):
    store = _head_for(tmp_path, _columns())
    head = json.loads((tmp_path / MANIFEST_NAME).read_text())
    head["shards"]["rows"] = 4
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(head))
    with pytest.raises(ManifestError, match="has 3 rows, the head says 4"):
        load_manifest(store)


def test_an_unreadable_table_with_a_matching_sha_is_refused(tmp_path):
    data = b"not arrow at all"
    ref = table_reference(data, 1)
    _put(tmp_path, ref["table"], data)
    (tmp_path / MANIFEST_NAME).write_bytes(_manifest(1).to_json(ref))
    with pytest.raises(ManifestError, match="not a readable Arrow file"):
        load_manifest(Store(str(tmp_path)))


def test_hex_column_behaves_like_the_list():
    sha = _manifest(20).sha256
    raw = encode_table(
        [f"s{i}" for i in range(20)], np.ones(20, np.int64), np.ones(20, np.int64), sha, None
    )
    table = pa.ipc.open_file(pa.py_buffer(raw)).read_all()
    from shardstream.manifest.table import _hex_column

    col = _hex_column(table.column("sha256"))
    assert len(col) == 20 and col[3] == sha[3] and col[-1] == sha[-1] and col[2:5] == sha[2:5]
    assert list(col) == sha and col == sha and sha == col and col != sha[:-1]
    with pytest.raises(IndexError):
        col[20]


def test_numbered_paths_are_stored_as_a_pattern_and_other_paths_as_a_column(tmp_path):
    from shardstream.manifest.table import expand_pattern, path_pattern

    numbered = _manifest(30).paths
    assert path_pattern(numbered) == {
        "prefix": "part/shard-",
        "width": 6,
        "start": 0,
        "suffix": ".tar",
    }
    assert expand_pattern(path_pattern(numbered), 30) == numbered
    other = [f"x/{name}.tar" for name in ("a", "b9", "b10", "c")]
    assert path_pattern(other) is None and path_pattern(["s9.tar", "s10.tar"]) is None
    run = [
        shard_name(i, "tar", "0123456789abcde9") for i in range(30)
    ]  # a pack's: a number and its run's token
    assert path_pattern(run) == {
        "prefix": "shard-",
        "width": 6,
        "start": 0,
        "suffix": "-0123456789abcde9.tar",
    }
    assert expand_pattern(path_pattern(run), 30) == run
    m = Manifest("tar", other, np.ones(4, np.int64), np.ones(4, np.int64), [""] * 4)
    (tmp_path / "o").mkdir()
    store, name = _write(tmp_path / "o", m, threshold=1)
    assert "path" in pa.ipc.open_file(str(tmp_path / "o" / name)).schema.names
    assert load_manifest(store).paths == other
    (tmp_path / "n").mkdir()
    store, name = _write(tmp_path / "n", _manifest(30), threshold=1)
    assert "path" not in pa.ipc.open_file(str(tmp_path / "n" / name)).schema.names
    assert load_manifest(store).paths == numbered


@pytest.mark.parametrize(
    "pattern",
    [
        '{"prefix": "../", "width": 2, "start": 0, "suffix": ".tar"}',
        '{"prefix": "s", "width": 1, "start": 5, "suffix": ".tar"}',  # 12 rows: 5..16 outgrow one digit
        '{"prefix": "s", "width": 0, "start": 0, "suffix": ".tar"}',
        '{"prefix": "s", "width": 2, "start": -1, "suffix": ".tar"}',
        '{"prefix": 1, "width": 2, "start": 0, "suffix": ".tar"}',
        "not json",
    ],
)
def test_a_hostile_path_pattern_is_refused(tmp_path, pattern):
    columns = _columns(12)
    del columns["path"]
    table = pa.table(columns, metadata={"path_pattern": pattern})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    ref = table_reference(data, 12)
    _put(tmp_path, ref["table"], data)
    (tmp_path / MANIFEST_NAME).write_bytes(_manifest(12).to_json(ref))
    with pytest.raises(ManifestError, match="path pattern|'..'"):
        load_manifest(Store(str(tmp_path)))


def test_a_table_loaded_manifest_pickles_for_worker_processes(tmp_path):
    import pickle

    m = _manifest()
    store, _ = _write(tmp_path, m)
    copy = pickle.loads(pickle.dumps(load_manifest(store)))
    assert (
        copy.sha256 == m.sha256
        and copy.index_sha256 == m.index_sha256
        and copy.fingerprint == m.fingerprint
    )
