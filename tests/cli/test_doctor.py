"""``shardstream doctor``: real values of this machine, the /dev/shm verdict, storage that answers or not."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys

import pytest
import torch
from click.testing import CliRunner

from shardstream.cli import cli
from shardstream.cli.doctor import cgroup_cpu_limit, cores_report
from shardstream.loader import guards
from tests.docker.seaweed import SeaweedS3
from tests.sample_datasets import make_files, write_dataset


def doctor(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli, ["doctor", *args], env=env)


def test_reports_this_machine():
    result = doctor("--json", "--workers", "1")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["cores"]["affinity"] == len(os.sched_getaffinity(0))
    assert 1 <= doc["cores"]["usable"] <= len(os.sched_getaffinity(0))
    st = os.statvfs("/dev/shm")
    assert doc["shm"]["total"] == st.f_blocks * st.f_frsize
    assert doc["shm"]["free"] > 0
    assert doc["cuda"]["available"] == torch.cuda.is_available()
    assert doc["cuda"]["torch"] == torch.__version__
    assert doc["start_method"] == (
        multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_all_start_methods()[0]
    )
    assert doc["pin_memory"] == torch.cuda.is_available()
    assert doc["ok"] is True and doc["problems"] == [] and doc["storage"] is None


def test_loader_estimate_is_the_guards():
    """1 worker, batch 10 x 1MB, no pinning: the ring of 4 arenas at 1.25 x a batch (ShardLoader's count)."""
    before = os.environ.get("LOCAL_WORLD_SIZE")
    result = doctor("--json", "--workers", "1", "--batch-size", "10", "--sample-size", "1MB")
    doc = json.loads(result.output)
    assert doc["loader"]["batch_bytes"] == 10 * 10**6
    if not torch.cuda.is_available():
        assert (
            doc["loader"]["needed"]
            == guards.check_shm(10 * 10**6, 1, 4 * 1.25, action="off")
            == 50 * 10**6
        )
    two = json.loads(
        doctor(
            "--json",
            "--workers",
            "1",
            "--batch-size",
            "10",
            "--sample-size",
            "1MB",
            "--local-ranks",
            "2",
        ).output
    )
    assert two["loader"]["needed"] == 2 * doc["loader"]["needed"] and two["local_ranks"] == 2
    # the command in this process left it as it was
    assert os.environ.get("LOCAL_WORLD_SIZE") == before


def test_too_small_shm_fails_with_the_advice():
    free = guards.shm_free_bytes()
    assert free is not None
    size = f"{free // 64 + 1}B"  # 64 samples x 2 workers x 4+ batches in flight: well over the free space
    result = doctor("--workers", "2", "--batch-size", "64", "--sample-size", size)
    assert result.exit_code == 1
    assert "TOO SMALL" in result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1
    assert (
        "docker run --shm-size=" in errors[0]
        and "--ipc=host" in errors[0]
        and "medium: Memory" in errors[0]
    )
    # without workers nothing travels through shared memory
    assert doctor("--workers", "0", "--batch-size", "64", "--sample-size", size).exit_code == 0


def test_text_output_names_every_check():
    result = doctor("--workers", "1")
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names[:6] == ["shm", "cores", "cuda", "pinned", "start", "loader"]
    assert f"{len(os.sched_getaffinity(0))} in the CPU affinity" in result.stdout


def test_too_many_workers_warns(tmp_path):
    cores = cores_report()["usable"]
    result = doctor("--workers", str(4 * cores + 2), "--sample-size", "1KB")
    assert result.exit_code == 0
    assert f"on {cores} usable cores" in result.stderr


def test_local_dataset(tmp_path):
    url = write_dataset(tmp_path, [5, 7, 3])
    result = doctor(url, "--json", "--workers", "1", "--batch-size", "4", "--read-batch")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (
        doc["storage"]["ok"] and doc["storage"]["samples"] == 15 and doc["storage"]["shards"] == 3
    )
    assert doc["loader"]["ok"] and doc["loader"]["basis"] == "measured on the first batch"
    # the cls field: 4 int64 labels; text travels by pipe
    assert doc["loader"]["batch_bytes"] == 4 * 8


def test_dataset_too_large_for_shm(tmp_path):
    free = guards.shm_free_bytes()
    url = write_dataset(
        tmp_path, [3], make=lambda i: {"__key__": f"k{i}", "bin": os.urandom(1 << 20)}
    )
    batch = free // (1 << 20) + 1  # one batch of stored samples is more than all of /dev/shm
    result = doctor(url, "--workers", "1", "--batch-size", str(batch))
    assert result.exit_code == 1
    assert "estimated from the manifest's stored sample sizes" in result.stderr
    assert "--shm-size=" in result.stderr


def test_missing_dataset_is_one_line(tmp_path):
    result = doctor(str(tmp_path / "nothing"), "--workers", "1")
    assert result.exit_code == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "nothing" in errors[0] and "_manifest.json" in errors[0]
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    with SeaweedS3(tmp_path_factory.mktemp("weed")) as server:
        yield server


def test_s3_store_answers_and_wrong_keys_are_one_line(seaweed, tmp_path):
    src = make_files(tmp_path / "src", {f"s{i}.txt": b"sample %d" % i for i in range(8)})
    bucket = seaweed.new_bucket()
    env = seaweed.client_env()
    copy = CliRunner().invoke(
        cli,
        ["pack", str(src), f"s3://{bucket}/ds", "--endpoint-url", seaweed.endpoint, "-q"],
        env=env,
    )
    assert copy.exit_code == 0, copy.output
    ok = doctor(
        f"s3://{bucket}/ds", "--endpoint-url", seaweed.endpoint, "--workers", "1", "--json", env=env
    )
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["storage"]["samples"] == 8
    wrong = dict(env, AWS_SECRET_ACCESS_KEY="not-the-secret")
    bad = doctor(
        f"s3://{bucket}/ds",
        "--endpoint-url",
        seaweed.endpoint,
        "--workers",
        "1",
        "--timeout",
        "5",
        env=wrong,
    )
    assert bad.exit_code == 1
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"s3://{bucket}/ds" in errors[0], bad.output
    assert "AWS_SECRET_ACCESS_KEY" in errors[0]  # the hint: which credentials to check
    assert "Traceback" not in bad.output


def test_cgroup_v2_and_v1_quota(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(str(v2)) == (1.5, str(v2 / "cpu.max"))
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(str(v2)) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("250000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(str(tmp_path / "v1"))[0] == 2.5
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(str(tmp_path / "v1")) is None
    assert cgroup_cpu_limit(str(tmp_path / "empty")) is None
    report = cores_report(str(v2))
    assert report["usable"] == report["affinity"] == len(os.sched_getaffinity(0))


@pytest.mark.skipif(sys.platform != "linux", reason="sched_getaffinity is Linux's")
def test_usable_cores_follow_the_affinity():
    """Run in a process pinned to one core: the doctor says 1 usable core."""
    import subprocess

    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from shardstream.cli import main; main()"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "doctor", "--json", "--workers", "0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    doc = json.loads(out)
    assert doc["cores"]["affinity"] == 1 and doc["cores"]["usable"] == 1


def test_wait_retries_until_the_manifest_appears(tmp_path):
    """A pack job publishing while the doctor waits: the doctor retries and then reports the dataset."""
    import threading

    target = tmp_path / "late"
    done = threading.Event()

    def publish():
        import time

        time.sleep(1.5)
        write_dataset(tmp_path, [2, 3], name="late")
        done.set()

    thread = threading.Thread(target=publish)
    thread.start()
    result = doctor(str(target), "--wait", "60", "--workers", "1", "--json")
    thread.join()
    assert done.is_set()
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["storage"]["samples"] == 5
    # without --wait a missing dataset fails at once
    assert doctor(str(tmp_path / "never"), "--workers", "1").exit_code == 1


def test_malformed_cgroup_files_mean_no_quota(tmp_path):
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert cgroup_cpu_limit(str(tmp_path)) is None
