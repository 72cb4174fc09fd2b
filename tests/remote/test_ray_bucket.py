"""Packing on Ray straight into an S3 bucket (moto): the same objects as a local pack, no manifest on failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ray")
import ray

import shardstream
from shardstream.manifest.side_names import index_name
from tests.sample_datasets import doc_without_runs

from .data import image_folder


@pytest.fixture(scope="module")
def local_ray(remote_environment):
    """A local Ray whose workers see this session's dummy credentials (they inherit the environment)."""
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}},
    )
    yield
    ray.shutdown()


def test_a_ray_pack_into_a_bucket_equals_a_local_pack(local_ray, s3_bucket, tmp_path):
    image_folder(tmp_path / "src")
    options = s3_bucket.storage_options
    local = shardstream.pack(
        tmp_path / "src",
        s3_bucket.url("local"),
        storage_options=options,
        samples_per_shard=4,
        progress=False,
    )
    remote = shardstream.pack(
        tmp_path / "src",
        s3_bucket.url("ray"),
        storage_options=options,
        samples_per_shard=4,
        progress=False,
        engine="ray",
    )
    assert remote.fingerprint == local.fingerprint and remote.manifest.num_shards == 4
    # the same shards under each run's names
    pairs = list(zip(local.manifest.paths, remote.manifest.paths))
    for name, other in pairs:
        assert s3_bucket.read(f"ray/{other}") == s3_bucket.read(f"local/{name}")
    docs = [
        doc_without_runs(json.loads(s3_bucket.read(f"{p}/_manifest.json")))
        for p in ("local", "ray")
    ]
    for doc in docs:
        doc.pop("created")
    assert docs[0] == docs[1]
    keys = s3_bucket.keys()
    # nothing else
    sizes = remote.manifest.image_sizes
    assert sorted(k.split("/", 1)[1] for k in keys if k.startswith("ray/")) == sorted(
        [
            "_manifest.json",
            *remote.manifest.paths,
            *(index_name(p) for p in remote.manifest.paths),
            *([sizes.reference["file"]] if sizes is not None else []),
        ]
    )
    for name, other in pairs:  # sample indexes too, byte for byte
        assert s3_bucket.read(f"ray/{index_name(other)}") == s3_bucket.read(
            f"local/{index_name(name)}"
        )


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ("fails_on_shard_1", r"^cannot read .*\.jpg: Input/output error$"),
        ("dies_on_shard_1", r"^shard 1 \(.*\.jpg\): its Ray worker died 4 times"),
    ],
)
def test_a_shard_that_keeps_failing_leaves_no_manifest(
    local_ray, s3_bucket, tmp_path, monkeypatch, job, message
):
    from shardstream.packing import driver
    from tests.packing import ray_jobs

    image_folder(tmp_path / "src")
    # Ray workers import it by name
    monkeypatch.setattr(driver, "write_shard", getattr(ray_jobs, job))
    with pytest.raises(shardstream.ShardstreamError, match=message):
        shardstream.pack(
            tmp_path / "src",
            s3_bucket.url("ray"),
            storage_options=s3_bucket.storage_options,
            samples_per_shard=4,
            progress=False,
            engine="ray",
        )
    keys = s3_bucket.keys()
    assert not any(k.endswith("_manifest.json") for k in keys)


def upload_tree(bucket, prefix: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        bucket.write(f"{prefix}/{rel}", data)


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_a_folder_in_a_bucket_packs_into_a_bucket_as_the_same_folder_does_locally(
    local_ray, s3_bucket, tmp_path, engine
):
    files = image_folder(tmp_path / "src")
    upload_tree(s3_bucket, "src", {f"{key}.jpg": data for key, data in files.items()})
    s3_bucket.write("src/.hidden/x.jpg", b"not packed")
    options = s3_bucket.storage_options
    local = shardstream.pack(
        tmp_path / "src", tmp_path / "local", samples_per_shard=4, progress=False
    )
    result = shardstream.pack(
        s3_bucket.url("src"),
        s3_bucket.url("out"),
        storage_options=options,
        samples_per_shard=4,
        progress=False,
        engine=engine,
    )
    assert result.fingerprint == local.fingerprint and result.skipped_hidden == 1
    assert result.manifest.classes == local.manifest.classes
    for name, other in zip(local.manifest.paths, result.manifest.paths):
        assert s3_bucket.read(f"out/{other}") == (tmp_path / "local" / name).read_bytes()
    doc = json.loads(s3_bucket.read("out/_manifest.json"))
    assert doc["created"]["source"] == s3_bucket.url("src")


def test_bucket_sources_refuse_what_they_cannot_pack(s3_bucket, tmp_path):
    options = s3_bucket.storage_options
    with pytest.raises(shardstream.ShardstreamError, match="holds no objects to pack"):
        shardstream.pack(
            s3_bucket.url("nothing"), tmp_path / "out", storage_options=options, progress=False
        )
    s3_bucket.write("t/a.jpg", b"x")
    with pytest.raises(shardstream.ShardstreamError, match="inside the source"):
        shardstream.pack(
            s3_bucket.url("t"), s3_bucket.url("t/out"), storage_options=options, progress=False
        )
    with pytest.raises(
        shardstream.ShardstreamError, match="sources in object storage are folder trees and tables"
    ):
        shardstream.pack(
            s3_bucket.url("t"),
            tmp_path / "out",
            storage_options=options,
            progress=False,
            layout="hdf5",
        )
    with pytest.raises(
        shardstream.ShardstreamError, match="must hold table files of one kind .*found .jpg"
    ):
        shardstream.pack(
            s3_bucket.url("t"),
            tmp_path / "out",
            storage_options=options,
            progress=False,
            layout="table",
        )


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_tables_in_a_bucket_pack_as_they_do_locally(local_ray, s3_bucket, tmp_path, engine):
    from .data import parquet_table

    (tmp_path / "local-src").mkdir()
    for part in range(2):
        parquet_table(tmp_path / "local-src" / f"p{part}.parquet", rows=30, seed=part)
        s3_bucket.write(
            f"tables/p{part}.parquet", (tmp_path / "local-src" / f"p{part}.parquet").read_bytes()
        )
    local = shardstream.pack(
        tmp_path / "local-src", tmp_path / "local", samples_per_shard=16, progress=False
    )
    remote = shardstream.pack(
        s3_bucket.url("tables"),
        tmp_path / "from-bucket",
        samples_per_shard=16,
        storage_options=s3_bucket.storage_options,
        progress=False,
        engine=engine,
    )
    assert remote.fingerprint == local.fingerprint and remote.samples == 60
