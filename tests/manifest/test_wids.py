"""``shardstream ls --wids``: the shard list wids reads, its URLs relative to where it is written, and the
datasets it refuses. That wids reads every sample of it as ShardMap does is in tests/interop."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from shardstream import ShardWriter, merge, pack, split
from shardstream.cli import cli
from shardstream.manifest.wids import KIND, relative_url
from tests.sample_datasets import make_files


def invoke(*args) -> tuple[int, str]:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture
def tars(tmp_path):
    src = make_files(
        tmp_path / "src",
        {f"{c}/{i}.jpg": bytes([c == "b", i]) * 50 for c in "ab" for i in range(5)},
    )
    dest = tmp_path / "data" / "ds"
    return pack(src, dest, samples_per_shard=4, progress=False, shuffle=False).manifest, dest


@pytest.mark.parametrize(
    ("url", "folder", "relative"),
    [
        ("/d/ds/s-0.tar", "/d/ds", "s-0.tar"),
        ("/d/ds/s-0.tar", "/d/lists", "../ds/s-0.tar"),
        ("/d/other/s-0.tar", "/d/ds", "../other/s-0.tar"),
        ("s3://b/ds/s-0.tar", "s3://b/ds", "s-0.tar"),
        ("s3://b/ds/s-0.tar", "s3://b/lists/x", "../../ds/s-0.tar"),
        ("s3://b/ds/s-0.tar", "s3://other/ds", "s3://b/ds/s-0.tar"),
        ("s3://b/ds/s-0.tar", "gs://b/ds", "s3://b/ds/s-0.tar"),
        ("s3://b/ds/s-0.tar", "/d/ds", "s3://b/ds/s-0.tar"),
        ("/d/ds/s-0.tar", "s3://b/ds", "/d/ds/s-0.tar"),
    ],
)
def test_urls_are_relative_where_wids_can_resolve_them(url, folder, relative):
    assert relative_url(url, folder) == relative


def test_the_list_names_every_shard_in_manifest_order(tars):
    manifest, dest = tars
    code, out = invoke("ls", dest, "--wids")
    assert code == 0, out
    doc = json.loads(out)
    assert doc == {
        "__kind__": KIND,
        "wids_version": 1,
        "name": "ds",
        "shardlist": [
            {"url": p, "nsamples": n, "filesize": b}
            for p, n, b in zip(manifest.paths, [4, 4, 2], manifest.nbytes.tolist())
        ],
    }


def test_output_writes_the_list_with_urls_relative_to_its_folder(tars, tmp_path):
    manifest, dest = tars
    code, out = invoke("ls", dest, "--wids", "--output", tmp_path / "lists" / "ds.json")
    assert code == 0 and "3 shards, 10 samples" in out, out
    doc = json.loads((tmp_path / "lists" / "ds.json").read_text())
    assert [s["url"] for s in doc["shardlist"]] == [f"../data/ds/{p}" for p in manifest.paths]
    code, out = invoke("ls", dest, "--wids", "--output", dest / ".wids.json")
    assert code == 0, out
    doc = json.loads((dest / ".wids.json").read_text())
    assert [s["url"] for s in doc["shardlist"]] == manifest.paths


def test_output_to_another_store_names_the_shards_by_full_url(tars):
    fsspec = pytest.importorskip("fsspec")
    manifest, dest = tars
    code, out = invoke("ls", dest, "--wids", "--output", "memory://lists/ds.json")
    assert code == 0, out
    doc = json.loads(fsspec.filesystem("memory").cat("/lists/ds.json"))
    assert [s["url"] for s in doc["shardlist"]] == [str(dest / p) for p in manifest.paths]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--output", "x.json"), "--output goes with --wids"),
        (("--wids", "--keys"), "leave out --keys and --json"),
        (("--wids", "--json"), "leave out --keys and --json"),
    ],
)
def test_options_that_do_not_go_together_are_refused(tars, args, message):
    _, dest = tars
    code, out = invoke("ls", dest, *args)
    assert code == 2 and message in out


def test_datasets_wids_cannot_read_as_shardstream_does_are_refused(tars, tmp_path):
    _, dest = tars
    with ShardWriter(str(tmp_path / "arrow"), format="arrow") as w:
        w.write({"__key__": "a", "txt": "x"})
    with ShardWriter(str(tmp_path / "zst"), compression="zstd") as w:
        w.write({"__key__": "a", "txt": "x"})
    split(dest, tmp_path / "parts", {"train": 0.5, "val": 0.5})
    other = make_files(tmp_path / "src2", {"c/0.jpg": b"c0", "a/0.jpg": b"a0"})
    pack(other, tmp_path / "other", progress=False)
    merge([dest, tmp_path / "other"], tmp_path / "merged")
    for where, why in [
        (tmp_path / "arrow", "wids reads uncompressed tar shards, and these are arrow"),
        (tmp_path / "zst", "wids reads uncompressed tar shards, and these are tar.zst"),
        (tmp_path / "parts" / "train", "it is a split part"),
        (tmp_path / "merged", "it is a merge whose labels shardstream maps to one class list"),
    ]:
        code, out = invoke("ls", where, "--wids")
        assert code == 1 and f"no wids shard list for {where.name}: {why}" in out, out
