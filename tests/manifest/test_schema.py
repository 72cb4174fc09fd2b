"""The manifest: JSON round trip, sample lookup, validation with errors naming the source."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from shardstream.errors import ManifestError
from shardstream.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    Manifest,
    dataset_store,
    load_manifest,
    shard_name,
    write_manifest,
)
from shardstream.storage import Store

SOURCE = "s3://bucket/my-dataset/_manifest.json"


def make_manifest(samples=(3, 0, 5, 2), **kw) -> Manifest:
    n = len(samples)
    args = dict(
        shard_format="tar",
        paths=[shard_name(i, "tar") for i in range(n)],
        samples=list(samples),
        nbytes=[10_240 * (i + 1) for i in range(n)],
        sha256=[f"{i:064x}" for i in range(n)],
    )
    args.update(kw)
    return Manifest(**args)


def doc_of(manifest: Manifest) -> dict:
    return json.loads(manifest.to_json())


def test_round_trip_keeps_everything():
    m = make_manifest(
        fields=[{"name": "jpg", "type": "bytes", "samples": 10}],
        classes=["cat", "dog", "éléphant"],
        arrow_schema="c2NoZW1h",
        created={"by": "test", "source": "/données/ici"},
        paths=["a/shard-000000.tar", "b/été.tar", "c/x.tar", "d/y.tar"],
    )
    back = Manifest.from_json(m.to_json(), SOURCE)
    assert back.shard_format == "tar"
    assert back.paths == m.paths
    assert back.sha256 == m.sha256
    assert back.fields == m.fields
    assert back.classes == m.classes
    assert back.arrow_schema == m.arrow_schema
    assert back.created == m.created
    for column in (back.samples, back.nbytes):
        assert isinstance(column, np.ndarray)
        assert column.dtype == np.int64
    np.testing.assert_array_equal(back.samples, [3, 0, 5, 2])
    np.testing.assert_array_equal(back.nbytes, m.nbytes)
    assert back.to_json() == m.to_json()


def test_from_json_accepts_str_and_bytes():
    m = make_manifest()
    assert Manifest.from_json(m.to_json().decode()).paths == m.paths
    assert Manifest.from_json(m.to_json()).paths == m.paths


def test_to_json_is_utf8_and_records_totals():
    m = make_manifest(paths=["été/0.tar", "1.tar", "2.tar", "3.tar"])
    data = m.to_json()
    assert "été".encode() in data  # not \u escapes
    assert data.endswith(b"\n")
    doc = json.loads(data)
    assert doc["shardstream_manifest"] == FORMAT_VERSION
    assert doc["num_shards"] == 4
    assert doc["num_samples"] == 10
    assert doc["total_bytes"] == 10_240 * (1 + 2 + 3 + 4)
    assert doc["shards"]["samples"] == [3, 0, 5, 2]


def test_counts_and_totals():
    m = make_manifest()
    assert m.num_shards == 4
    assert m.num_samples == 10
    assert m.total_bytes == 102_400
    assert isinstance(m.num_samples, int)
    assert isinstance(m.total_bytes, int)


def test_empty_manifest():
    m = make_manifest(samples=())
    back = Manifest.from_json(m.to_json())
    assert back.num_shards == 0
    assert back.num_samples == 0
    with pytest.raises(IndexError):
        back.locate(0)


def test_shard_name_is_deterministic_and_zero_padded():
    assert shard_name(0, "tar") == "shard-000000.tar"
    assert shard_name(12, "tar.zst") == "shard-000012.tar.zst"
    assert shard_name(999_999, "arrow") == "shard-999999.arrow"


def test_locate_every_sample_skipping_empty_shards():
    m = make_manifest(samples=(0, 3, 0, 0, 2, 1))
    expected = [(1, 0), (1, 1), (1, 2), (4, 0), (4, 1), (5, 0)]
    assert [m.locate(i) for i in range(m.num_samples)] == expected


def test_locate_matches_brute_force():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, size=50)
    m = make_manifest(samples=tuple(int(c) for c in counts))
    flat = [(s, j) for s, c in enumerate(counts) for j in range(c)]
    assert [m.locate(i) for i in range(m.num_samples)] == flat


@pytest.mark.parametrize("index", [-1, 10, 11, 10**12])
def test_locate_out_of_range(index):
    m = make_manifest()
    with pytest.raises(IndexError, match=f"sample {index} is out of range.*10 samples"):
        m.locate(index)


def _with(doc: dict, **changes) -> bytes:
    doc = json.loads(json.dumps(doc))
    for dotted, value in changes.items():
        target = doc
        *path, last = dotted.split("__")
        for p in path:
            target = target[p]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return json.dumps(doc).encode()


_DELETE = object()


def _bad_manifests() -> list:
    good = doc_of(make_manifest())
    return [
        pytest.param(b"{not json", "is not valid JSON", id="bad-json"),
        pytest.param(b"\xff\xfe\x00garbage", "is not valid JSON", id="not-utf8"),
        pytest.param(b"", "is not valid JSON", id="empty"),
        pytest.param(b"[1, 2, 3]", "is not a shardstream manifest", id="a-list"),
        pytest.param(b'{"name": "some other json"}', "is not a shardstream manifest", id="other-json"),
        pytest.param(_with(good, shardstream_manifest=FORMAT_VERSION + 1), "upgrade shardstream", id="newer"),
        pytest.param(_with(good, shardstream_manifest="1"), "manifest version '1'", id="version-str"),
        pytest.param(_with(good, shards=_DELETE), "is damaged", id="no-shards"),
        pytest.param(_with(good, shards=[1, 2]), "is damaged", id="shards-list"),
        pytest.param(_with(good, shards__sha256=_DELETE), "is damaged", id="no-sha"),
        pytest.param(_with(good, shards__samples=["x", "y", "z", "w"]), "is damaged", id="samples-text"),
        pytest.param(_with(good, shard_format=_DELETE), "is damaged", id="no-format"),
        pytest.param(_with(good, shard_format="zip"), "unknown shard format 'zip'", id="bad-format"),
        pytest.param(_with(good, shards__path=["a.tar"]), "different lengths", id="paths-short"),
        pytest.param(_with(good, shards__sha256=["0" * 64] * 5), "different lengths", id="sha-long"),
        pytest.param(_with(good, shards__bytes=[1, 2, 3]), "different lengths", id="bytes-short"),
        pytest.param(_with(good, shards__samples=[3, -1, 5, 2], num_samples=9), "negative", id="neg-samples"),
        pytest.param(_with(good, shards__bytes=[1, 2, -3, 4]), "negative", id="neg-bytes"),
        pytest.param(_with(good, num_samples=11), "num_samples does not agree", id="num-samples"),
    ]


@pytest.mark.parametrize(("data", "message"), _bad_manifests())
def test_invalid_manifests_raise_manifest_error_naming_the_source(data, message):
    with pytest.raises(ManifestError) as info:
        Manifest.from_json(data, SOURCE)
    text = str(info.value)
    assert SOURCE in text
    assert message in text


def test_manifest_without_num_samples_is_accepted():
    data = _with(doc_of(make_manifest()), num_samples=_DELETE)
    assert Manifest.from_json(data, SOURCE).num_samples == 10


def test_load_manifest_from_folder_without_one(tmp_path):
    (tmp_path / "shard-000000.tar").write_bytes(bytes(1024))
    store = Store(tmp_path)
    with pytest.raises(ManifestError) as info:
        load_manifest(store)
    text = str(info.value)
    assert str(tmp_path) in text
    assert MANIFEST_NAME in text
    assert "shardstream index" in text


def test_load_manifest_from_missing_folder(tmp_path):
    with pytest.raises(ManifestError, match="shardstream index"):
        load_manifest(Store(tmp_path / "nothing" / "here"))


def test_load_manifest_memory_store_without_one():
    store = Store(f"memory://manifest-test-{uuid.uuid4().hex}/ds")
    store.write_bytes("shard-000000.tar", bytes(1024))
    with pytest.raises(ManifestError, match="shardstream index") as info:
        load_manifest(store)
    assert store.url in str(info.value)


def test_load_manifest_names_the_damaged_file(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("{truncated", encoding="utf-8")
    with pytest.raises(ManifestError) as info:
        load_manifest(Store(tmp_path))
    assert str(tmp_path / MANIFEST_NAME) in str(info.value)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_write_then_load(tmp_path, where):
    url = str(tmp_path / "ds") if where == "local" else f"memory://manifest-test-{uuid.uuid4().hex}/ds"
    store = Store(url)
    m = make_manifest(classes=["a", "b"])
    write_manifest(store, m)
    assert store.list_files() == [MANIFEST_NAME]
    back = load_manifest(store)
    assert back.paths == m.paths
    assert back.classes == ["a", "b"]
    np.testing.assert_array_equal(back.samples, m.samples)


def test_dataset_store_accepts_the_manifest_url(tmp_path):
    assert dataset_store(str(tmp_path / "ds" / MANIFEST_NAME)).root == str(tmp_path / "ds")
    assert dataset_store(str(tmp_path / "ds")).root == str(tmp_path / "ds")
    assert dataset_store("memory://bucket/ds/_manifest.json").url == "memory://bucket/ds"


def test_a_million_shards_round_trip():
    n = 1_000_000
    samples = np.arange(n, dtype=np.int64) % 1000 + 1
    nbytes = samples * 25_000 + 1024
    m = Manifest(
        shard_format="tar.zst",
        paths=[f"shard-{i:06d}.tar.zst" for i in range(n)],
        samples=samples,
        nbytes=nbytes,
        sha256=[f"{i:064x}" for i in range(n)],
    )
    data = m.to_json()
    # Per shard: a ~24-byte path, two numbers and a 64-hex-digit sha256; nothing grows faster.
    assert len(data) < 128 * n
    back = Manifest.from_json(data, "big")
    assert back.num_shards == n
    for column, expected in ((back.samples, samples), (back.nbytes, nbytes)):
        assert isinstance(column, np.ndarray)
        assert column.dtype == np.int64
        assert column.shape == (n,)
        np.testing.assert_array_equal(column, expected)
    assert back.paths[-1] == "shard-999999.tar.zst"
    assert back.sha256[123_456] == f"{123_456:064x}"
    assert back.num_samples == int(samples.sum())
