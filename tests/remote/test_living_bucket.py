"""Datasets that live, in buckets: append on moto and on SeaweedFS (real S3 servers on 127.0.0.1), two
appends at once on moto, the exclusive publish of a version on both, and append refused on a store without
conditional writes (fake-gcs-server)."""

from __future__ import annotations

import threading

import pytest

import shardstream as ss
from shardstream.errors import StorageError
from shardstream.manifest import load_manifest
from shardstream.manifest.verify import verify
from shardstream.manifest.versions import commit_version
from shardstream.packing.destination import DestinationLost
from shardstream.storage import Store
from shardstream.storage.conditional import WriteConflict
from tests.packing.test_living import text_folder

from .test_concurrent_packs import seaweed  # noqa: F401 - the SeaweedFS server fixture


def read_all(url: str, options: dict, **kw) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    ds = ss.ShardDataset(url, shuffle=False, decode=None, storage_options=options, **kw)
    for sample in ds:
        assert sample["__key__"] not in out
        out[sample["__key__"]] = bytes(sample["txt"])
    return out


def append_and_read_back(tmp_path, url: str, options: dict) -> None:
    one, two = text_folder(tmp_path / "one", 4), text_folder(tmp_path / "two", 2, 100)
    kw = {"samples_per_shard": 3, "progress": False, "workers": 1, "storage_options": options}
    first = ss.pack(str(tmp_path / "one"), url, **kw)
    before = read_all(url, options)
    second = ss.pack(str(tmp_path / "two"), url, append=True, **kw)
    assert second.manifest.version == 2
    assert second.manifest.num_samples == len(one) + len(two)
    assert list(second.manifest.sha256[: first.manifest.num_shards]) == list(first.manifest.sha256)
    assert set(read_all(url, options)) == one | two
    assert read_all(url, options, version=1) == before
    assert load_manifest(url, version=1, storage_options=options).fingerprint == (
        first.manifest.fingerprint
    )
    assert verify(url, options).ok


def test_append_in_an_s3_bucket(s3_bucket, tmp_path):
    append_and_read_back(tmp_path, s3_bucket.url("ds"), s3_bucket.storage_options)


def seaweed_options(server) -> dict:
    return {"endpoint_url": server.endpoint, "key": server.access_key, "secret": server.secret_key}


def test_append_on_seaweedfs(seaweed, tmp_path):  # noqa: F811 - the fixture
    options = seaweed_options(seaweed)
    append_and_read_back(tmp_path, f"s3://{seaweed.new_bucket()}/ds", options)


@pytest.mark.parametrize("server", ["moto", "seaweedfs"])
def test_a_version_is_published_once_on_each_s3_server(server, request, s3_bucket):
    if server == "moto":
        store = Store(s3_bucket.url("v"), s3_bucket.storage_options)
    else:
        weed = request.getfixturevalue("seaweed")
        store = Store(f"s3://{weed.new_bucket()}/v", seaweed_options(weed))
    head = ss.Manifest("tar", ["s.tar"], [1], [1], [""], version=2).to_json()
    commit_version(store, head, 2)
    with pytest.raises(WriteConflict, match="already exists"):
        commit_version(store, head, 2)


def test_two_appends_at_once_in_a_bucket_never_lose_one(s3_bucket, tmp_path):
    url, options = s3_bucket.url("race"), s3_bucket.storage_options
    kw = {"samples_per_shard": 2, "progress": False, "workers": 1, "storage_options": options}
    text_folder(tmp_path / "base", 2)
    ss.pack(str(tmp_path / "base"), url, **kw)
    for trial in range(3):
        names = [f"r{trial}-{i}" for i in range(2)]
        new = [
            text_folder(tmp_path / n, 2, 100 + 10 * (2 * trial + i)) for i, n in enumerate(names)
        ]
        results: dict[str, str] = {}

        def run(name: str, results: dict[str, str] = results) -> None:
            try:
                ss.pack(str(tmp_path / name), url, append=True, **kw)
                results[name] = "ok"
            except DestinationLost as exc:
                results[name] = f"lost: {exc}"

        threads = [threading.Thread(target=run, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got = set(read_all(url, options))
        for name, added in zip(names, new):
            assert results[name] == "ok" or results[name].startswith("lost: "), results
            assert (added <= got) == (results[name] == "ok")
            if results[name] != "ok":  # the retry lands
                ss.pack(str(tmp_path / name), url, append=True, **kw)
                assert added <= set(read_all(url, options))
        assert verify(url, options).ok


def test_append_is_refused_where_writes_cannot_be_conditional(gcs_bucket, tmp_path):
    url, options = gcs_bucket.url("ds"), gcs_bucket.storage_options
    text_folder(tmp_path / "one", 2)
    kw = {"progress": False, "workers": 1, "storage_options": options}
    ss.pack(str(tmp_path / "one"), url, **kw)
    with pytest.raises(StorageError, match="takes no conditional writes here"):
        ss.pack(str(tmp_path / "one"), url, append=True, **kw)
    assert load_manifest(url, storage_options=options).version == 1


def test_merge_and_split_in_a_bucket_read_every_sample_once(s3_bucket, tmp_path):
    options = s3_bucket.storage_options
    kw = {"samples_per_shard": 3, "progress": False, "workers": 1, "storage_options": options}
    a, b = text_folder(tmp_path / "a", 4), text_folder(tmp_path / "b", 3, 100)
    ss.pack(str(tmp_path / "a"), s3_bucket.url("data/A"), **kw)
    ss.pack(str(tmp_path / "b"), s3_bucket.url("data/B"), **kw)
    merged = ss.merge(
        [s3_bucket.url("data/A"), s3_bucket.url("data/B")],
        s3_bucket.url("data/AB"),
        storage_options=options,
    )
    assert merged.roots == ["../A", "../B"]
    assert set(read_all(s3_bucket.url("data/AB"), options)) == a | b
    parts = ss.split(
        s3_bucket.url("data/AB"),
        s3_bucket.url("data/parts"),
        {"x": 0.5, "y": 0.5},
        storage_options=options,
    )
    x, y = (set(read_all(s3_bucket.url(f"data/parts/{p}"), options)) for p in parts)
    assert not x & y and x | y == a | b
    # a manifest cannot reach out of its bucket
    with pytest.raises(StorageError, match="climbs out of the bucket"):
        Store(s3_bucket.url("data/AB"), options).reach(["../../../other"])
