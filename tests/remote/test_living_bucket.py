"""Datasets that live, in buckets: append on moto and on SeaweedFS (real S3 servers on 127.0.0.1), two
appends at once on moto, the exclusive publish of a version on both, append refused on a store without
conditional writes (fake-gcs-server), and readers that may read objects but not list the bucket."""

from __future__ import annotations

import threading

import pytest

import shardstream as ss
from shardstream.errors import StorageError
from shardstream.manifest import load_manifest
from shardstream.manifest.side_names import version_name
from shardstream.manifest.verify import verify
from shardstream.manifest.versions import commit_version
from shardstream.packing.destination import DestinationLost
from shardstream.storage import Store
from shardstream.storage.conditional import WriteConflict
from tests.packing.test_living import text_folder

from .clitools import ok
from .proxy import s3_error
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


def test_merge_of_a_local_and_an_s3_dataset_reads_each_sample_once(s3_bucket, tmp_path):
    """A local merge of a local dataset and one in a moto bucket: the bucket's shards by full URL,
    read only with that root trusted (and its options), every sample exactly once."""
    import json

    options = s3_bucket.storage_options
    kw = {"samples_per_shard": 3, "progress": False, "workers": 1}
    local_keys = text_folder(tmp_path / "src-l", 4)
    remote_keys = text_folder(tmp_path / "src-r", 5, 100)
    ss.pack(str(tmp_path / "src-l"), str(tmp_path / "data/local"), **kw)
    remote = s3_bucket.url("team-b")
    ss.pack(str(tmp_path / "src-r"), remote, storage_options=options, **kw)
    both = str(tmp_path / "data/both")
    m = ss.merge([str(tmp_path / "data/local"), remote], both, storage_options=options)
    assert m.roots == sorted(["../local", remote])
    head = json.loads((tmp_path / "data/both/_manifest.json").read_text())
    assert [p for p in head["shards"]["path"] if p.startswith(remote + "/")]  # full URLs
    # not trusted: refused, naming the root and the fix
    with pytest.raises(StorageError, match=r"outside its folder.*trusted_roots") as refused:
        ss.ShardDataset(both)
    assert "\n" not in str(refused.value)
    storage = ss.StorageSettings(trusted_roots={remote: options})
    for workers in (0, 2):
        loader = ss.ShardDataset(both, decode=None, storage=storage, seed=workers).loader(
            batch_size=2, num_workers=workers
        )
        keys = [k for batch in loader for k in batch["__key__"]]
        assert len(keys) == len(set(keys)) == len(local_keys) + len(remote_keys)
        assert set(keys) == local_keys | remote_keys
    # a location above the root trusts it too; ShardMap reads through the same rule
    bucket_root = remote.rsplit("/", 1)[0]
    mapped = ss.ShardMap(
        both, decode=None, storage=ss.StorageSettings(trusted_roots={bucket_root: options})
    )
    assert sorted(s["__key__"] for s in mapped) == sorted(local_keys | remote_keys)
    # a tool without the reader's trust (verify) names the root and the fix
    try:
        checked = verify(both)
        problems = " ".join(str(p) for p in checked.problems)
    except StorageError as exc:
        problems = str(exc)
    assert "trusted_roots" in problems and remote in problems
    # on the command line, the connection flags reach the bucket's dataset from a local DEST
    from click.testing import CliRunner

    from shardstream.cli import cli

    flags = ["--endpoint-url", options["endpoint_url"]]
    for key, value in options.items():
        flags += [] if key == "endpoint_url" else ["-o", f"{key}={value}"]
    done = CliRunner().invoke(
        cli, ["merge", str(tmp_path / "data/local"), remote, str(tmp_path / "data/cli"), *flags]
    )
    assert done.exit_code == 0, done.output
    assert load_manifest(str(tmp_path / "data/cli")).fingerprint == m.fingerprint
    # the other way: a merge in the bucket names the local dataset by file:// URL
    up = s3_bucket.url("both")
    m2 = ss.merge([remote, str(tmp_path / "data/local")], up, storage_options=options)
    local_root = f"file://{tmp_path / 'data/local'}"
    assert local_root in m2.roots
    with pytest.raises(StorageError, match="outside its folder"):
        ss.ShardDataset(up, storage_options=options)
    trusted = ss.ShardDataset(
        up,
        decode=None,
        storage=ss.StorageSettings(options=options, trusted_roots={str(tmp_path / "data"): {}}),
    )
    assert sorted(s["__key__"] for s in trusted) == sorted(local_keys | remote_keys)


def test_a_manifest_naming_a_url_outside_its_roots_is_refused(s3_bucket, tmp_path):
    """Hostile manifests: a shard URL under no declared root, and a declared root the reader did not
    trust, are each one-line errors; no byte is fetched from either."""
    import json

    from shardstream.errors import ManifestError

    options = s3_bucket.storage_options
    text_folder(tmp_path / "src", 2)
    ss.pack(str(tmp_path / "src"), str(tmp_path / "ds"), samples_per_shard=3, progress=False)
    path = tmp_path / "ds/_manifest.json"
    doc = json.loads(path.read_text())
    secret = s3_bucket.url("private/secret.tar")
    doc["shards"]["path"][0] = secret
    path.write_text(json.dumps(doc))
    storage = ss.StorageSettings(trusted_roots={s3_bucket.url("private"): options})
    with pytest.raises(ManifestError, match="path .*secret.tar.* is a URL|not a plain") as refused:
        ss.ShardDataset(str(tmp_path / "ds"), storage=storage)
    assert "\n" not in str(refused.value)
    # declared, so the schema takes it; not trusted by the reader: refused before any read
    doc["roots"] = [s3_bucket.url("private")]
    path.write_text(json.dumps(doc))
    with pytest.raises(StorageError, match="names shards at .*private.*outside its folder"):
        ss.ShardDataset(str(tmp_path / "ds"), storage_options=options)
    # a root that is no clean URL
    for bad in (
        s3_bucket.url("a/../private"),
        "s3://",
        "file://relative/x",
        s3_bucket.url("a?x=1"),
    ):
        doc["roots"] = [bad]
        path.write_text(json.dumps(doc))
        with pytest.raises(ManifestError, match="root"):
            load_manifest(str(tmp_path / "ds"))


def test_the_commands_read_a_merge_across_stores_where_told_to_trust_it(s3_bucket, tmp_path):
    """verify, ls --keys, cat, bench and split of a local merge that names a bucket's shards by full URL:
    refused on one line without --trust-root, every sample with it (the bucket reached with the
    command's own connection flags)."""
    from click.testing import CliRunner

    from shardstream.cli import cli

    options = s3_bucket.storage_options
    kw = {"samples_per_shard": 3, "progress": False, "workers": 1}
    keys = text_folder(tmp_path / "src-l", 4) | text_folder(tmp_path / "src-r", 5, 100)
    ss.pack(str(tmp_path / "src-l"), str(tmp_path / "data/local"), **kw)
    remote = s3_bucket.url("team-b")
    ss.pack(str(tmp_path / "src-r"), remote, storage_options=options, **kw)
    both = str(tmp_path / "data/both")
    m = ss.merge([str(tmp_path / "data/local"), remote], both, storage_options=options)
    assert m.num_samples == len(keys)
    trust = ["--trust-root", remote.rsplit("/", 1)[0], "--endpoint-url", options["endpoint_url"]]

    def run(*args: str) -> tuple[int, str]:
        done = CliRunner().invoke(cli, list(args))
        return done.exit_code, done.output

    code, out = run("verify", both)
    assert code == 1 and "--trust-root" in out and remote in out, out
    assert len(out.strip().splitlines()) == 1, out
    code, out = run("verify", both, *trust)
    assert code == 0 and out.startswith(f"ok: {m.num_shards} shards, {m.num_samples} samples"), out
    code, out = run("ls", both, "--keys", *trust)
    assert code == 0 and set(out.split()) >= keys, out
    listed = [line for line in out.splitlines() if line.strip()]
    assert len(listed) == len(keys), out
    code, out = run("cat", both, "-1", *trust)
    assert code == 0 and out, out
    code, out = run("bench", both, "--workers", "0", "--samples", str(len(keys)), "--json", *trust)
    assert code == 0, out
    code, out = run("split", both, str(tmp_path / "parts"), "--into", "a=0.5", "b=0.5", *trust)
    assert code == 0, out
    parts = [
        ss.ShardDataset(
            str(tmp_path / "parts" / name),
            decode=None,
            shuffle=False,
            storage=ss.StorageSettings(trusted_roots={remote: options}),
        )
        for name in ("a", "b")
    ]
    split_keys = [s["__key__"] for part in parts for s in part]
    assert sorted(split_keys) == sorted(keys)


def test_a_reader_that_may_not_list_the_bucket_reads_every_version(s3_bucket, proxied, tmp_path):
    """Without s3:ListBucket, S3 answers a GET (or HEAD) of a missing key with 403 AccessDenied, not 404. Opening
    the latest version asks for the next version's file, which is missing: that 403 means "no newer
    version", on a dataset never appended to, one appended to, and one whose last publish was cut short
    before its head moved (whose newer version file exists, and is followed)."""
    kw = {"samples_per_shard": 3, "progress": False, "workers": 1}
    kw["storage_options"] = s3_bucket.storage_options
    one, two = text_folder(tmp_path / "one", 4), text_folder(tmp_path / "two", 2, 100)
    ss.pack(str(tmp_path / "one"), s3_bucket.url("plain"), **kw)
    for name in ("living", "cut"):
        ss.pack(str(tmp_path / "one"), s3_bucket.url(name), **kw)
        ss.pack(str(tmp_path / "two"), s3_bucket.url(name), append=True, **kw)
    # the writer of "cut"'s version 2 stopped after its version file: the head still says version 1
    s3_bucket.write("cut/_manifest.json", s3_bucket.read(f"cut/{version_name(1)}"))
    reader = proxied(s3_bucket)
    denied = reader.proxy.inject(
        "status", status=403, body=s3_error("AccessDenied", "Access Denied"), instead_of=404
    )
    options = reader.storage_options
    for name, keys, version in (("plain", one, 1), ("living", one | two, 2), ("cut", one | two, 2)):
        url = s3_bucket.url(name)
        latest = load_manifest(url, storage_options=options)
        assert (latest.version, latest.num_samples) == (version, len(keys))
        assert set(read_all(url, options)) == keys
        assert ss.ShardMap(url, decode=None, storage_options=options)[0]["__key__"] in keys
        assert load_manifest(url, version=1, storage_options=options).num_samples == len(one)
        assert f"samples  {len(keys)}" in ok("info", url, *reader.cli_options).stdout
    # the 403s were answered (a missing next version per open), and taken as "no newer version"
    assert denied.applied >= 3
    assert reader.proxy.count("GET", r"\.shardstream/versions/000003\.json") >= 2
    assert reader.proxy.count(fault="status") == denied.applied
