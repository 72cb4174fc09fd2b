"""The manifest: JSON round trip, sample lookup, validation with errors naming the source."""

from __future__ import annotations

import json
import re
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
from shardstream.manifest.sample_set import samples_of
from shardstream.packing.writer import ShardWriter
from shardstream.storage import Store

SOURCE = "s3://bucket/my-dataset/_manifest.json"


def make_manifest(samples=(3, 0, 5, 2), **kw) -> Manifest:
    n = len(samples)
    args = dict(
        shard_format="tar",
        paths=[shard_name(i, "tar") for i in range(n)],
        stored_counts=list(samples),
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
    for column in (back.stored_counts, back.nbytes):
        assert isinstance(column, np.ndarray)
        assert column.dtype == np.int64
    np.testing.assert_array_equal(back.stored_counts, [3, 0, 5, 2])
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
    # every manifest written now is format 4 (its indexes and versions are in .shardstream/): older
    # readers refuse it rather than look for them where they are not
    assert doc["shardstream_manifest"] == FORMAT_VERSION == 4
    assert doc["num_shards"] == 4
    assert doc["num_samples"] == 10
    assert doc["total_bytes"] == 10_240 * (1 + 2 + 3 + 4)
    assert doc["shards"]["samples"] == [3, 0, 5, 2]


@pytest.mark.parametrize("fmt", [1, 2, 3])
def test_a_manifest_of_an_older_format_reads_and_says_its_format(fmt):
    """Datasets written before format 4 read as they are (and their format says where their files are)."""
    m = make_manifest(classes=["a", "b"])
    doc = json.loads(m.to_json())
    doc["shardstream_manifest"] = fmt
    back = Manifest.from_json(json.dumps(doc))
    assert back.format == fmt and m.format == FORMAT_VERSION
    assert (
        back.paths == m.paths and back.fingerprint == m.fingerprint and back.classes == ["a", "b"]
    )


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
        samples_of(back).locate(0)


def test_shard_name_is_deterministic_and_zero_padded():
    assert shard_name(0, "tar") == "shard-000000.tar"
    assert shard_name(12, "tar.zst") == "shard-000012.tar.zst"
    assert shard_name(999_999, "arrow") == "shard-999999.arrow"
    # a pack run's own names
    assert shard_name(3, "tar", "0123456789abcdef") == "shard-000003-0123456789abcdef.tar"
    with pytest.raises(ValueError, match="16 lower-case hex digits"):
        shard_name(3, "tar", "../x")


def test_the_run_token_in_shard_names_is_not_part_of_the_fingerprint():
    """Two packs of the same source name their shards with their own tokens: one fingerprint (resume states of
    one stay valid on the other); manifests written before run tokens keep theirs."""
    plain = make_manifest()
    runs = [
        make_manifest(paths=[shard_name(i, "tar", token) for i in range(4)])
        for token in ("0123456789abcdef", "fedcba9876543210")
    ]
    assert plain.fingerprint == runs[0].fingerprint == runs[1].fingerprint
    assert make_manifest(paths=[f"a{p}" for p in plain.paths]).fingerprint != plain.fingerprint
    assert (
        make_manifest(sha256=[f"{i + 1:064x}" for i in range(4)], paths=runs[0].paths).fingerprint
        != plain.fingerprint
    )


def test_locate_every_sample_skipping_empty_shards():
    m = make_manifest(samples=(0, 3, 0, 0, 2, 1))
    expected = [(1, 0), (1, 1), (1, 2), (4, 0), (4, 1), (5, 0)]
    assert [samples_of(m).locate(i) for i in range(m.num_samples)] == expected


def test_locate_matches_brute_force():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, size=50)
    m = make_manifest(samples=tuple(int(c) for c in counts))
    flat = [(s, j) for s, c in enumerate(counts) for j in range(c)]
    samples = samples_of(m)
    assert [samples.locate(i) for i in range(m.num_samples)] == flat
    assert [samples.locate(i - m.num_samples) for i in range(m.num_samples)] == flat
    shards, offsets = samples.locate_many(np.arange(-m.num_samples, m.num_samples))
    assert list(zip(shards.tolist(), offsets.tolist())) == flat + flat


@pytest.mark.parametrize("index", [-11, 10, 11, 10**12])
def test_locate_out_of_range(index):
    m = make_manifest()
    with pytest.raises(IndexError, match=f"sample {index} is out of range.*10 samples"):
        samples_of(m).locate(index)


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
        pytest.param(
            b'{"name": "some other json"}', "is not a shardstream manifest", id="other-json"
        ),
        pytest.param(
            _with(good, shardstream_manifest=FORMAT_VERSION + 1), "upgrade shardstream", id="newer"
        ),
        pytest.param(
            _with(good, shardstream_manifest="1"), "manifest version '1'", id="version-str"
        ),
        pytest.param(_with(good, shards=_DELETE), "is damaged", id="no-shards"),
        pytest.param(_with(good, shards=[1, 2]), "is damaged", id="shards-list"),
        pytest.param(_with(good, shards__sha256=_DELETE), "is damaged", id="no-sha"),
        pytest.param(
            _with(good, shards__samples=["x", "y", "z", "w"]), "is damaged", id="samples-text"
        ),
        pytest.param(_with(good, shard_format=_DELETE), "is damaged", id="no-format"),
        pytest.param(
            _with(good, shard_format="zip"), "unknown shard format 'zip'", id="bad-format"
        ),
        pytest.param(_with(good, shards__path=["a.tar"]), "different lengths", id="paths-short"),
        pytest.param(
            _with(good, shards__sha256=["0" * 64] * 5), "different lengths", id="sha-long"
        ),
        pytest.param(_with(good, shards__bytes=[1, 2, 3]), "different lengths", id="bytes-short"),
        pytest.param(
            _with(good, shards__samples=[3, -1, 5, 2], num_samples=9), "negative", id="neg-samples"
        ),
        pytest.param(_with(good, shards__bytes=[1, 2, -3, 4]), "negative", id="neg-bytes"),
        pytest.param(
            _with(good, num_samples=11), "num_samples 11 does not agree", id="num-samples"
        ),
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
    url = (
        str(tmp_path / "ds")
        if where == "local"
        else f"memory://manifest-test-{uuid.uuid4().hex}/ds"
    )
    store = Store(url)
    m = make_manifest(classes=["a", "b"])
    write_manifest(store, m)
    assert store.list_files(recursive=True) == [
        MANIFEST_NAME
    ]  # nothing else, .shardstream/ neither
    back = load_manifest(store)
    assert back.paths == m.paths
    assert back.classes == ["a", "b"]
    np.testing.assert_array_equal(back.stored_counts, m.stored_counts)


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
        stored_counts=samples,
        nbytes=nbytes,
        sha256=[f"{i:064x}" for i in range(n)],
    )
    data = m.to_json()
    # Per shard: a ~24-byte path, two numbers and a 64-hex-digit sha256; nothing grows faster.
    assert len(data) < 128 * n
    back = Manifest.from_json(data, "big")
    assert back.num_shards == n
    for column, expected in ((back.stored_counts, samples), (back.nbytes, nbytes)):
        assert isinstance(column, np.ndarray)
        assert column.dtype == np.int64
        assert column.shape == (n,)
        np.testing.assert_array_equal(column, expected)
    assert back.paths[-1] == "shard-999999.tar.zst"
    assert back.sha256[123_456] == f"{123_456:064x}"
    assert back.num_samples == int(samples.sum())


# -- the schema: what a manifest from someone else may not do (issue 10, findings 4 and 15) ----------------


def _refused(data: bytes | str, *expected: str) -> str:
    """The one-line ManifestError that ``data`` gets, checked to name the source and ``expected``."""
    with pytest.raises(ManifestError) as info:
        Manifest.from_json(data, SOURCE)
    text = str(info.value)
    assert SOURCE in text and "\n" not in text, text
    for part in expected:
        assert part in text, text
    return text


GOOD_SHA = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    "digest",
    [
        "/tmp/shardstream-x/"
        + "p" * 45,  # a path of 64 characters: the cache took it for a file name
        "../../../../../../../../tmp/" + "a" * 36,  # '..' made .part files outside the cache
        "g" * 64,
        "a" * 63,
        "a" * 65,
        " " + "a" * 63,
        "a" * 63 + "\n",
        "é" * 64,
        "0x" + "a" * 62,
        7,
        None,
        ["a" * 64],
    ],
)
def test_a_checksum_that_is_not_64_hex_digits_is_refused(digest):
    doc = doc_of(make_manifest())
    doc["shards"]["sha256"][1] = digest
    text = _refused(json.dumps(doc), "shard 1 ('shard-000001.tar')", "64 hex digits")
    if isinstance(digest, str):
        assert repr(digest[:20])[1:-1] in text  # the value, escaped


def test_a_checksum_that_is_a_path_is_refused_when_made_in_code_too():
    with pytest.raises(ManifestError, match=r"invalid manifest: shard 0 .*64 hex digits"):
        make_manifest(samples=(1,), sha256=["/tmp/x/" + "p" * 57])


def test_a_checksum_path_never_reaches_the_cache():
    """The repro of the issue: such a value made ShardFetcher return a file outside its cache."""
    import tempfile

    url = f"memory://schema-{uuid.uuid4().hex}/ds"
    with ShardWriter(url, samples_per_shard=1) as w:
        w.write({"__key__": "a", "txt": "a"})
    store = Store(url)
    with tempfile.TemporaryDirectory(prefix="ss-", dir="/tmp") as outside:
        planted = outside + "/" + "p" * (63 - len(outside))
        with open(planted + ".shard", "wb") as f:  # what the cache would have opened
            f.write(bytes(store.read_bytes(w.manifest.paths[0])))
        doc = json.loads(bytes(store.read_bytes(MANIFEST_NAME)))
        doc["shards"]["sha256"] = [planted]
        store.write_bytes(MANIFEST_NAME, json.dumps(doc).encode())
        with pytest.raises(ManifestError, match="64 hex digits"):
            load_manifest(store)


def test_upper_case_checksums_are_accepted_and_kept_lower_case():
    m = make_manifest(sha256=[GOOD_SHA.upper(), GOOD_SHA, "ABCDEF" * 10 + "abcd", GOOD_SHA.upper()])
    assert m.sha256 == [GOOD_SHA, GOOD_SHA, "abcdef" * 10 + "abcd", GOOD_SHA]
    doc = doc_of(make_manifest())
    doc["shards"]["sha256"] = [s.upper() for s in doc["shards"]["sha256"]]
    doc["shards"]["sha256"][2] = "Ab" * 32
    back = Manifest.from_json(json.dumps(doc), SOURCE)
    assert back.sha256 == [f"{i:064x}" for i in (0, 1)] + ["ab" * 32, f"{3:064x}"]
    assert b"AB" not in back.to_json()


def test_upper_case_checksums_verify_and_download(tmp_path):
    """Upper-case hex failed every verify (compared as text) and every download (the cache key was
    lower-cased, the comparison was not)."""
    from shardstream.manifest.verify import verify
    from shardstream.storage.cache import DiskCache
    from shardstream.storage.fetch import ShardFetcher

    url = f"memory://schema-{uuid.uuid4().hex}/ds"
    with ShardWriter(url, samples_per_shard=2) as w:
        for i in range(5):
            w.write({"__key__": f"k{i}", "txt": f"sample {i}"})
    store = Store(url)
    doc = json.loads(bytes(store.read_bytes(MANIFEST_NAME)))
    doc["shards"]["sha256"] = [s.upper() for s in doc["shards"]["sha256"]]
    store.write_bytes(MANIFEST_NAME, json.dumps(doc).encode())
    assert verify(url).ok
    m = load_manifest(store)
    data = ShardFetcher(store, m, DiskCache(tmp_path / "cache", limit=1 << 20)).fetch(2)
    assert bytes(data) == bytes(store.read_bytes(m.paths[2]))


def test_an_empty_checksum_means_none():
    doc = doc_of(make_manifest())
    doc["shards"]["sha256"][2] = ""
    assert Manifest.from_json(json.dumps(doc), SOURCE).sha256[2] == ""
    assert make_manifest(sha256=[""] * 4).sha256 == [""] * 4


BAD_PATHS = [
    ("../secret.tar", "'..' segment"),
    ("a/../../x.tar", "'..' segment"),
    ("..", "'..' segment; shard paths"),
    ("/etc/passwd", "absolute"),
    ("/other-bucket/x.tar", "absolute"),
    ("s3://other-bucket/x", "a URL"),
    ("gs://b/x.tar", "a URL"),
    ("file:///etc/passwd", "a URL"),
    ("a\\..\\x.tar", "backslash"),
    ("C:\\x.tar", "backslash"),
    ("", "empty"),
    (".", "'.' or '..' segment"),
    ("./a.tar", "'.' or '..'"),
    ("a/./b.tar", "'.' or '..'"),
    ("a//b.tar", "empty segment"),
    ("a/", "empty segment"),
    ("a\x00b.tar", "U+0000"),
    ("a\nb.tar", "U+000A"),
    ("a\x1b[2Jb.tar", "U+001B"),
    ("a\x7f.tar", "U+007F"),
    ("a\x85b.tar", "U+0085"),
    ("\ud800.tar", "U+D800"),
    ("%2e%2e/x.tar", "percent-encoded"),
    ("a%2Fb.tar", "percent-encoded"),
    ("a%5cb", "percent-encoded"),
    ("a%00.tar", "percent-encoded"),
    (5, "not a string"),
    (None, "not a string"),
    (["a.tar"], "not a string"),
]


@pytest.mark.parametrize(("path", "problem"), BAD_PATHS, ids=[repr(p) for p, _ in BAD_PATHS])
def test_a_shard_path_outside_the_dataset_is_refused(path, problem):
    doc = doc_of(make_manifest())
    doc["shards"]["path"][3] = path
    text = _refused(json.dumps(doc), "shard 3: path", problem)
    assert "\x1b" not in text and "\x00" not in text
    with pytest.raises(ManifestError, match="invalid manifest: shard 3: path"):
        make_manifest(paths=["a.tar", "b.tar", "c.tar", path])


GOOD_PATHS = [
    "a/b/c.tar",
    "été/中.tar",
    "shard 1.tar",
    "...tar",
    "..a/b..",
    "a/.hidden.tar",
    "100%.tar",
    "a%20b.tar",
    "\u202eevil.tar",
    "C:x.tar",
    "a:b/c.tar",
    "~/x.tar",
    "a?b#c.tar",
    "x" * 5000,
]


def test_shard_paths_that_stay_inside_are_kept_as_they_are():
    m = make_manifest(samples=(1,) * len(GOOD_PATHS), paths=GOOD_PATHS)
    assert Manifest.from_json(m.to_json(), SOURCE).paths == GOOD_PATHS


@pytest.mark.parametrize("shard", ["../secret.tar", "/ABS"])
def test_a_local_dataset_cannot_read_outside_its_folder(tmp_path, shard):
    from shardstream.dataset import ShardDataset

    url = tmp_path / "ds"
    with ShardWriter(str(url)) as w:
        w.write({"__key__": "a", "txt": "inside"})
    (tmp_path / "secret.tar").write_bytes((url / w.manifest.paths[0]).read_bytes())
    doc = json.loads((url / MANIFEST_NAME).read_text())
    doc["shards"]["path"] = [shard if shard != "/ABS" else str(tmp_path / "secret.tar")]
    (url / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="shard 0: path"):
        load_manifest(Store(url))
    with pytest.raises(ManifestError, match="shard 0: path"):
        ShardDataset(str(url))


def test_a_bucket_dataset_cannot_name_another_bucket():
    """posixpath.join(root, '/other/x') is '/other/x': on S3 another bucket."""
    url = f"memory://schema-{uuid.uuid4().hex}/ds"
    with ShardWriter(url) as w:
        w.write({"__key__": "a", "txt": "inside"})
    store = Store(url)
    other = Store(f"memory://other-{uuid.uuid4().hex}")
    other.write_bytes("x.tar", bytes(store.read_bytes(w.manifest.paths[0])))
    for path in ("/" + other.root.strip("/") + "/x.tar", other.url + "/x.tar"):
        doc = json.loads(bytes(store.read_bytes(MANIFEST_NAME)))
        doc["shards"]["path"] = [path]
        store.write_bytes(MANIFEST_NAME, json.dumps(doc).encode())
        with pytest.raises(ManifestError, match="shard 0: path"):
            load_manifest(store)


@pytest.mark.parametrize(
    "paths", [["a.tar", "b.tar", "a.tar", "c.tar"], ["a.tar", "a.tar", "b.tar", "c.tar"]]
)
def test_a_shard_listed_twice_is_refused(paths):
    doc = doc_of(make_manifest())
    doc["shards"]["path"] = paths
    _refused(
        json.dumps(doc),
        "shard 2: path 'a.tar' is shard 0's too"
        if paths[2] == "a.tar"
        else "shard 1: path 'a.tar' is shard 0's too",
    )


def _doc(**top) -> dict:
    doc = doc_of(make_manifest())
    doc.update(top)
    return doc


def _shards(**columns) -> dict:
    doc = doc_of(make_manifest())
    doc["shards"].update(columns)
    return doc


HOSTILE = [
    # JSON that Python's parser takes, but no manifest may hold
    pytest.param(
        b'{"shardstream_manifest": 1, "shardstream_manifest": 1}',
        "appears twice",
        id="duplicate-key",
    ),
    pytest.param(json.dumps(_shards(samples=[3, float("nan"), 5, 2])), "NaN", id="nan"),
    pytest.param(json.dumps(_doc(created={"x": float("inf")})), "Infinity", id="infinity"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "nested too deeply", id="deep-nesting"),
    pytest.param(
        '{"shardstream_manifest": 1, "x": ' + "9" * 5000 + "}", "not valid JSON", id="5000-digits"
    ),
    # wrong types and ranges in the shard columns
    pytest.param(
        json.dumps(_shards(samples=[3, True, 5, 2])),
        "shard 1 ('shard-000001.tar'): samples is True",
        id="bool-for-int",
    ),
    pytest.param(
        json.dumps(_shards(samples=[3, 1.0, 5, 2])),
        "samples is 1.0, not a whole number",
        id="float",
    ),
    pytest.param(
        json.dumps(_shards(bytes=[1, 2, 1e300, 4])).replace("1e+300", "1e400"),
        "bytes is inf",
        id="1e400",
    ),
    pytest.param(json.dumps(_shards(samples=[3, "1", 5, 2])), "samples is '1'", id="str-for-int"),
    pytest.param(json.dumps(_shards(samples=[3, [1], 5, 2])), "samples is a list", id="nested"),
    pytest.param(json.dumps(_shards(samples=[3, None, 5, 2])), "samples is None", id="null"),
    pytest.param(json.dumps(_shards(bytes=[1, 2, 2**63, 4])), "shard 2", id="beyond-int64"),
    pytest.param(json.dumps(_shards(bytes=[1, 2, 2**64 + 5, 4])), "shard 2", id="beyond-uint64"),
    pytest.param(json.dumps(_shards(bytes=[1, 2, -(2**63) - 1, 4])), "shard 2", id="below-int64"),
    pytest.param(json.dumps(_shards(bytes=[1, 2, 2**53, 4])), "2**53 or more", id="2**53"),
    pytest.param(
        json.dumps(_shards(bytes=[2**53 - 1, 2**53 - 1, 1, 1])), "add up to 2**53", id="sum-2**53"
    ),
    pytest.param(json.dumps(_shards(path="abcd")), "'path' is a string, not a list", id="path-str"),
    pytest.param(json.dumps(_shards(sha256={"a": 1})), "'sha256' is an object", id="sha-object"),
    pytest.param(
        json.dumps(_shards(samples=list(range(10**5)))),
        "different lengths (path 4, samples 100000",
        id="huge-column",
    ),
    # the document around them
    pytest.param(json.dumps(_doc(shardstream_manifest=0)), "manifest version 0", id="version-0"),
    pytest.param(
        json.dumps(_doc(shardstream_manifest=True)), "manifest version True", id="version-bool"
    ),
    pytest.param(
        json.dumps(_doc(shardstream_manifest=1.0)), "manifest version 1.0", id="version-float"
    ),
    pytest.param(
        json.dumps(_doc(shard_format=["tar"])), "unknown shard format a list", id="format-list"
    ),
    pytest.param(
        json.dumps(_doc(num_shards=True)), "num_shards True does not agree", id="num-shards-bool"
    ),
    pytest.param(
        json.dumps(_doc(total_bytes=1.5)), "total_bytes 1.5 does not agree", id="total-float"
    ),
    pytest.param(
        json.dumps(_doc(fields={"name": "x"})), "'fields' is an object", id="fields-object"
    ),
    pytest.param(json.dumps(_doc(fields=["jpg"])), "fields[0] is 'jpg'", id="field-str"),
    pytest.param(
        json.dumps(_doc(fields=[{"type": "bytes"}])),
        "not an object with a name",
        id="field-no-name",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "", "type": "bytes"}])), "field name ''", id="field-empty"
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "../../x", "type": "bytes"}])),
        "field name '../../x'",
        id="field-slash",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "a\\b", "type": "bytes"}])),
        "field name",
        id="field-backslash",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "x\x1b[2J", "type": "bytes"}])),
        r"field name 'x\x1b[2J'",
        id="field-escape",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "jpg"}])), "field 'jpg' is not", id="field-no-type"
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "jpg", "type": "bytes", "samples": -1}])),
        "field 'jpg'",
        id="field-samples",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "jpg", "type": "bytes", "samples": True}])),
        "field 'jpg'",
        id="field-samples-bool",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "jpg", "type": "bytes", "nullable": "yes"}])),
        "field 'jpg'",
        id="field-nullable",
    ),
    pytest.param(
        json.dumps(_doc(fields=[{"name": "jpg", "type": "bytes", "x": {"y": [1]}}])),
        "field 'jpg'",
        id="field-nested",
    ),
    pytest.param(json.dumps(_doc(classes="cat")), "'classes' is a string", id="classes-str"),
    pytest.param(json.dumps(_doc(classes=["cat", 1])), "classes[1] is 1", id="classes-int"),
    pytest.param(
        json.dumps(_doc(classes=["cat", "a\x00b"])), r"classes[1] is 'a\x00b'", id="classes-nul"
    ),
    pytest.param(
        json.dumps(_doc(classes=["\ud800"])), r"classes[0] is '\ud800'", id="classes-surrogate"
    ),
    pytest.param(json.dumps(_doc(created=[1])), "'created' is a list", id="created-list"),
    pytest.param(
        json.dumps(_doc(created={"at": {"nested": 1}})), "'created' is not", id="created-nested"
    ),
    pytest.param(json.dumps(_doc(arrow_schema=5)), "'arrow_schema' is a number", id="schema-int"),
    pytest.param(
        json.dumps(_doc(arrow_schema="not base64!")),
        "arrow_schema is a string, not base64",
        id="schema",
    ),
]


@pytest.mark.parametrize(("data", "message"), HOSTILE)
def test_hostile_json_is_a_one_line_manifest_error(data, message):
    _refused(data, message)


def test_fields_of_arrow_datasets_are_column_names():
    fields = [
        {"name": "a/b", "type": "int64", "nullable": True},
        {"name": "", "type": "string", "nullable": False},
        {"name": "x\x1b[2J", "type": "string", "nullable": False},
    ]
    m = make_manifest(
        shard_format="arrow", paths=[shard_name(i, "arrow") for i in range(4)], fields=fields
    )
    assert Manifest.from_json(m.to_json(), SOURCE).fields == fields


def test_a_manifest_made_in_code_is_checked_and_normalized():
    def make_manifest(**kw):
        args = dict(
            shard_format="tar",
            paths=["a.tar", "b.tar", "c.tar", "d.tar"],
            stored_counts=[1, 2, 3, 4],
            nbytes=[1, 2, 3, 4],
            sha256=[GOOD_SHA] * 4,
        )
        return Manifest(**{**args, **kw})

    m = make_manifest(
        paths=("a.tar", "b.tar", "c.tar", "d.tar"),
        stored_counts=np.array([1, 2, 3, 4], dtype=np.uint32),
        sha256=(GOOD_SHA.upper(),) * 4,
    )
    assert m.paths == ["a.tar", "b.tar", "c.tar", "d.tar"] and m.stored_counts.dtype == np.int64
    assert m.sha256 == [GOOD_SHA] * 4
    for bad, message in (
        (dict(stored_counts=np.array([1.0, 2, 3, 4])), "float64 values"),
        (dict(stored_counts=[1, 2, np.uint64(2**64 - 1), 4]), "shard 2"),
        (dict(stored_counts=np.array([[1, 2, 3, 4]])), "not a list"),
        (dict(shard_format="zip"), "unknown shard format 'zip'"),
        (dict(fields=None), "'fields' is null"),
        (dict(created={"x": float("nan")}), "'created' is not"),
        (dict(paths=["a.tar", "b.tar"]), "different lengths (path 2, samples 4"),
    ):
        with pytest.raises(ManifestError, match="invalid manifest: .*" + re.escape(message)):
            make_manifest(**bad)
