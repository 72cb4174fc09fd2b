"""The Ray engine on a real local Ray instance: plan order, retried SIGKILLed workers, errors, identity."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
import ray

from shardstream.errors import ShardstreamError, SourceError
from shardstream.packing import engine
from shardstream.packing.engine import Execution
from shardstream.packing.folder import ShardJob, plan_shards
from shardstream.sources import open_source
from tests.folders import folder_files
from tests.packing import ray_jobs
from tests.sample_datasets import doc_without_runs, make_files, without_run

REPO = str(Path(__file__).resolve().parents[2])
RAY = Execution(2, engine="ray")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"PYTHONPATH": REPO}},
    )
    yield
    ray.shutdown()


def test_results_come_back_in_plan_order(local_ray):
    done: list[int] = []
    got = engine.run_jobs(RAY, ray_jobs.square, [(i,) for i in range(12)], True, done.append)
    assert got == [i * i for i in range(12)] and sorted(done) == list(range(12))


def shard_jobs(tmp_path: Path, dest: Path) -> list[tuple]:
    files = {f"k{i:03d}.txt": f"value {i}".encode() * 40 for i in range(30)}
    src = open_source(str(make_files(tmp_path / "src", files)))
    plan = plan_shards(src.samples, 1 << 30, 10)
    return [
        (ShardJob(str(dest), None, i, f"shard-{i:06d}.tar", None, samples, None, False),)
        for i, samples in enumerate(plan)
    ]


def test_a_worker_killed_mid_task_is_retried_and_the_shards_are_identical(local_ray, tmp_path):
    local = tmp_path / "local"
    local_results = engine.run_jobs(
        Execution(1), ray_jobs.write_shard, shard_jobs(tmp_path, local), True, lambda i: None
    )
    killed = tmp_path / "ray"
    marker = tmp_path / "killed.pid"
    jobs = [(str(marker), 1, *args) for args in shard_jobs(tmp_path, killed)]
    results = engine.run_jobs(RAY, ray_jobs.killed_once, jobs, True, lambda i: None)
    assert marker.exists()  # the worker did die once, after writing shard 1
    assert [r.sha256 for r in results] == [r.sha256 for r in local_results]
    for i in range(3):
        name = f"shard-{i:06d}.tar"
        assert (killed / name).read_bytes() == (local / name).read_bytes()


def test_a_worker_that_always_dies_ends_with_one_line_naming_the_input(local_ray, tmp_path):
    marker = tmp_path / "deaths"
    with pytest.raises(
        ShardstreamError, match=r"^shard 0 \(photos/a.jpg\): its Ray worker died 2 times"
    ) as info:
        from shardstream.packing.ray_engine import run_ray

        run_ray(
            ray_jobs.always_killed,
            [(str(marker),)],
            lambda i: None,
            retries=1,
            describe=lambda i: "photos/a.jpg",
        )
    assert "\n" not in str(info.value)
    assert len(marker.read_text().split()) == 2  # first try and one retry


def test_an_error_in_the_data_is_raised_as_is(local_ray):
    with pytest.raises(SourceError, match=r"^x.jpg: not a JPEG"):
        engine.run_jobs(RAY, ray_jobs.bad_file, [("x.jpg",)], True, lambda i: None)
    with pytest.raises(
        ShardstreamError, match=r"^shard 0 failed on Ray: TypeError: cannot handle 3$"
    ):
        engine.run_jobs(RAY, ray_jobs.type_error, [(3,)], True, lambda i: None)


def test_an_unknown_engine_and_an_unreachable_cluster():
    with pytest.raises(ValueError, match="unknown engine 'spark'"):
        engine.run_jobs(Execution(1, engine="spark"), ray_jobs.square, [(1,)], True, lambda i: None)
    code = (
        "from shardstream.packing.ray_engine import connect\n"
        "try:\n    connect('127.0.0.1:9')\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.startswith("ShardstreamError cannot reach the Ray cluster at 127.0.0.1:9 (")
    assert "ray start --head" in done.stdout


def manifest_without_creation(dest: Path) -> dict:
    """The manifest less its creation info, its shard paths without the run's token."""
    import json

    doc = doc_without_runs(json.loads((dest / "_manifest.json").read_text()))
    doc.pop("created", None)
    return doc


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_ray_pack_is_byte_identical_to_a_local_one(local_ray, tmp_path, compression):
    from shardstream import pack

    files = {
        f"{c}/{i:02d}.jpg": f"{c}{i}".encode() * (50 + i) for c in ("cat", "dog") for i in range(25)
    }
    src = make_files(tmp_path / "src", files)
    local = pack(
        src, tmp_path / "local", samples_per_shard=7, compression=compression, progress=False
    )
    remote = pack(
        src,
        tmp_path / "ray",
        samples_per_shard=7,
        compression=compression,
        progress=False,
        engine="ray",
    )
    assert local.manifest.num_shards == 8 and remote.fingerprint == local.fingerprint
    assert manifest_without_creation(tmp_path / "ray") == manifest_without_creation(
        tmp_path / "local"
    )
    for name, other in zip(local.manifest.paths, remote.manifest.paths):
        assert (tmp_path / "ray" / other).read_bytes() == (tmp_path / "local" / name).read_bytes()
    names = {d: [without_run(n) for n in folder_files(tmp_path / d)] for d in ("ray", "local")}
    assert names["ray"] == names["local"]  # nothing staged or temporary left (.shardstream/ too)


def test_a_table_packs_on_ray_as_it_does_locally(local_ray, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shardstream import pack

    table = pa.table({"x": list(range(300)), "name": [f"row {i}" for i in range(300)]})
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=50)
    pack(tmp_path / "t.parquet", tmp_path / "local", samples_per_shard=64, progress=False)
    pack(
        tmp_path / "t.parquet", tmp_path / "ray", samples_per_shard=64, progress=False, engine="ray"
    )
    assert manifest_without_creation(tmp_path / "ray") == manifest_without_creation(
        tmp_path / "local"
    )
    assert (
        shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
        and len(shard_bytes(tmp_path / "ray")) == 5  # Arrow shards: no sample indexes
    )


def test_what_ray_does_not_pack_is_refused(local_ray, tmp_path):
    from shardstream import pack

    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    with pytest.raises(
        ShardstreamError, match="engine='ray' packs folder trees into tar shards, tables into Arrow"
    ):
        pack(table, tmp_path / "out", engine="ray", progress=False, format="tar")
    assert not (tmp_path / "out" / "_manifest.json").exists()


def test_the_command_line_packs_on_a_local_ray(tmp_path):
    files = {f"k{i:02d}.txt": f"v{i}".encode() for i in range(9)}
    src = make_files(tmp_path / "src", files)
    env = {**__import__("os").environ, "PYTHONPATH": REPO}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardstream",
            "pack",
            str(src),
            str(tmp_path / "out"),
            "--engine",
            "ray",
            "--samples-per-shard",
            "4",
            "-q",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "packed 9 samples into 3 tar shards" in done.stdout


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' and their sample indexes' bytes (``.shardstream/``) by their names without the run's token."""
    found = [*dest.glob("shard-*"), *dest.glob(".shardstream/shard-*")]
    return {without_run(p.relative_to(dest).as_posix()): p.read_bytes() for p in sorted(found)}


def test_a_function_pack_on_ray_equals_the_local_one(local_ray, tmp_path):
    from shardstream import pack

    def make(
        i: int,
    ) -> list[dict]:  # a closure-free lambda would do too: Ray pickles functions by value
        return [{"__key__": f"in{i:03d}_{j}", "txt": f"input {i} part {j}"} for j in range(i % 3)]

    inputs = list(range(40))
    pack(inputs, tmp_path / "local", fn=make, samples_per_shard=9, progress=False)
    pack(inputs, tmp_path / "ray", fn=make, samples_per_shard=9, progress=False, engine="ray")
    assert (
        shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
        and len(shard_bytes(tmp_path / "ray")) == 2 * 5  # shards and their sample indexes
    )


def test_an_hdf5_file_packs_on_ray_as_it_does_locally(local_ray, tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from shardstream import pack

    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.arange(50 * 4 * 4 * 3, dtype=np.uint8).reshape(50, 4, 4, 3)
        f["labels"] = np.arange(50) % 7
    pack(path, tmp_path / "local", samples_per_shard=16, progress=False)
    pack(path, tmp_path / "ray", samples_per_shard=16, progress=False, engine="ray")
    assert (
        shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
        and len(shard_bytes(tmp_path / "ray")) == 2 * 4  # shards and their sample indexes
    )


def test_a_failing_input_on_ray_names_it_and_publishes_nothing(local_ray, tmp_path):
    from shardstream import pack

    def make(i: int) -> dict:
        if i == 7:
            raise ValueError("bad record")
        return {"__key__": f"k{i}", "txt": str(i)}

    with pytest.raises(
        ShardstreamError, match=r"fn .*make on input 7 \(7\) failed: ValueError: bad record"
    ):
        pack(list(range(12)), tmp_path / "out", fn=make, progress=False, engine="ray")
    assert not (tmp_path / "out" / "_manifest.json").exists()
