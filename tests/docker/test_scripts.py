"""The compose stack's scripts, run on the host: docker/sample_images.py and docker/train.py (also
under torchrun with 2 ranks), so the stack's job logic is tested where no engine runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def script(
    name: str, *args: str, runner: tuple[str, ...] = (sys.executable,)
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*runner, str(DOCKER / name), *args], capture_output=True, text=True, env=ENV, timeout=300
    )


@pytest.fixture(scope="module")
def images_ds(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("stack")
    made = script(
        "sample_images.py", str(root / "images"), "--count", "30", "--classes", "3", "--size", "32"
    )
    assert made.returncode == 0, made.stderr
    from shardstream.packing import pack

    pack(str(root / "images"), str(root / "ds"), shard_size="8KB")
    return str(root / "ds")


def test_sample_images_are_deterministic(tmp_path):
    for name in ("a", "b"):
        assert (
            script(
                "sample_images.py", str(tmp_path / name), "--count", "6", "--size", "16"
            ).returncode
            == 0
        )
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jpg"))
    assert len(files) == 6 and {f.parent.name for f in files} == {"class_0", "class_1", "class_2"}
    assert all(
        (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files
    )


def test_train_reads_every_sample_once(images_ds):
    result = script("train.py", images_ds, "--workers", "2", "--batch-size", "4", "--epochs", "2")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {
        "ranks": 1,
        "device": "cpu",
        "samples": 30,
        "epochs": 2,
        "read": 60,
        "distinct": 30,
        "per_rank": [60],
        "exactly_once": True,
    }


def test_train_on_two_ranks_with_torchrun(images_ds):
    result = script(
        "train.py",
        images_ds,
        "--workers",
        "1",
        "--batch-size",
        "4",
        runner=(
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
        ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    assert report["ranks"] == 2 and report["per_rank"] == [15, 15] and report["exactly_once"]


def test_train_error_is_one_line(tmp_path):
    result = script("train.py", str(tmp_path / "missing"), "--workers", "0")
    assert result.returncode == 1
    assert (
        result.stderr.startswith("error: rank 0: ") and len(result.stderr.strip().splitlines()) == 1
    )
