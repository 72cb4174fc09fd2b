"""A dataset served read-only over plain HTTP (``http.server`` with Range support, and without it, as
``python -m http.server`` serves): inspect, verify and read it; writing to an http:// URL is a clear error."""

from __future__ import annotations

import json
import shutil

import pytest

import shardstream
from tests.folders import folder_files
from tests.sample_datasets import without_run

from .clitools import invoke, ok, one_line_error
from .data import image_folder, wds_tars
from .endpoints import StaticHTTPServer

SHARDS = ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar", "shard-000003.tar"]


@pytest.fixture
def served(http_dir, tmp_path):
    """(http_dir, dataset URL, {key: jpeg bytes}): 14 images in 4 shards, packed locally into the served folder."""
    files = image_folder(tmp_path / "src")
    shardstream.pack(
        tmp_path / "src",
        http_dir.path / "ds",
        samples_per_shard=4,
        workers=1,
        progress=False,
        shuffle=False,
    )
    return http_dir, f"{http_dir.url}/ds", files


def test_cli_info_ls_cat_verify_over_http(served):
    _, url, files = served
    doc = json.loads(ok("info", url, "--json").stdout)
    assert (doc["url"], doc["num_samples"], doc["num_shards"]) == (url, 14, 4)
    rows = [json.loads(line) for line in ok("ls", url, "--json").stdout.splitlines()]
    assert [without_run(r["path"]) for r in rows] == SHARDS
    keys = list(files)
    assert ok("cat", url, "9", "--field", "jpg").stdout_bytes == files[keys[9]]
    assert ok("cat", url, "--key", keys[13], "--field", "jpg").stdout_bytes == files[keys[13]]
    assert ok("verify", url, "-q").stdout.startswith("ok: 4 shards, 14 samples, ")


def test_shard_dataset_over_http(served, tmp_path):
    http_dir, url, files = served
    ds = shardstream.ShardDataset(url, decode=None, shuffle=False, cache_dir=tmp_path / "cache")
    assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == files
    ds = shardstream.ShardDataset(
        url, decode=None, shuffle=True, seed=4, cache_dir=tmp_path / "cache2"
    )
    got = {}
    for batch in ds.loader(batch_size=4, num_workers=2):
        for key, jpg in zip(batch["__key__"], list(batch["jpg"])):
            assert key not in got
            got[key] = bytes(jpg)
    assert got == files
    seen = {without_run(path) for method, path, _ in http_dir.server.requests if method == "GET"}
    assert {f"/{http_dir.path.name}/ds/{s}" for s in SHARDS} <= seen


def test_a_server_without_range_requests(served, tmp_path):
    """``python -m http.server`` ignores Range: reading must not depend on it."""
    http_dir, _, files = served
    with StaticHTTPServer(http_dir.path, range_requests=False) as plain:
        url = f"{plain.url}/ds"
        assert ok("verify", url, "-q").stdout.startswith("ok: 4 shards, 14 samples")
        ds = shardstream.ShardDataset(url, decode=None, shuffle=False, cache_dir=tmp_path / "cache")
        assert {s["__key__"]: bytes(s["jpg"]) for s in ds} == files


def test_webdataset_tars_over_http_without_a_manifest(http_dir, tmp_path):
    _, samples = wds_tars(http_dir.path / "wds", shards=2)
    ds = shardstream.ShardDataset(
        f"{http_dir.url}/wds/part-{{000..001}}.tar",
        decode=None,
        shuffle=False,
        cache_dir=tmp_path / "cache",
    )
    assert {s["__key__"]: {"txt": bytes(s["txt"]), "bin": bytes(s["bin"])} for s in ds} == samples


def test_writing_to_http_is_a_one_line_error(served, tmp_path):
    http_dir, url, _ = served
    image_folder(tmp_path / "more")
    before = folder_files(http_dir.path)
    one_line_error(
        invoke("pack", tmp_path / "more", f"{http_dir.url}/new", "-q"),
        f"{http_dir.url}/new",
        "read-only",
    )
    one_line_error(invoke("pack", tmp_path / "more", url, "--overwrite", "-q"), url, "read-only")
    wds_tars(http_dir.path / "wds", shards=2)
    one_line_error(
        invoke("index", f"{http_dir.url}/wds/part-{{000..001}}.tar", "-q"),
        http_dir.url,
        "read-only",
    )
    one_line_error(invoke("index", f"{http_dir.url}/wds", "-q"), http_dir.url, "read-only")
    # nothing written: the served folder holds what it did, and the tars written into it since
    assert [n for n in folder_files(http_dir.path) if not n.startswith("wds/")] == before
    assert all(n.endswith(".tar") for n in folder_files(http_dir.path / "wds"))
    assert not (http_dir.path / "wds" / "_manifest.json").exists()
    assert ok("verify", url, "-q").stdout.startswith("ok: 4 shards")  # the dataset is as it was


def test_errors_over_http(served, tmp_path):
    http_dir, url, _ = served
    missing = f"{http_dir.url}/nothing"
    assert "holds no dataset" in one_line_error(invoke("info", missing), missing)
    name = json.loads((http_dir.path / "ds" / "_manifest.json").read_bytes())["shards"]["path"][2]
    shutil.move(http_dir.path / "ds" / name, tmp_path / "gone.tar")
    shard = f"{url}/{name}"
    one_line_error(invoke("cat", url, "9"), shard)
    failed = invoke("verify", url, "-q")
    assert failed.exit_code == 1 and f"damaged: cannot read {shard}" in failed.stderr
    assert failed.stderr.strip().splitlines()[-1] == f"error: 1 of 4 shards is damaged in {url}"
    ds = shardstream.ShardDataset(
        url, decode=None, shuffle=False, retries=1, cache_dir=tmp_path / "cache"
    )
    with pytest.raises(shardstream.ShardstreamError, match=shard):
        list(ds)
