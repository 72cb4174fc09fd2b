"""The scripts of ``examples/`` run as a user runs them, at toy scale: each trains, checkpoints and
resumes, and what it prints or records shows that it did (every sample once, the steps continued)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.docs.markdown import DOCS, ROOT
from tests.torchrun import free_port

EXAMPLES = ROOT / "examples"


def run(*command: str, cwd: Path, timeout: int = 300, env: dict | None = None) -> str:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    done = subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def test_every_example_is_linked_from_the_docs():
    pages = "\n".join(p.read_text() for p in (DOCS / "guides").glob("*.md"))
    listing = (DOCS / "examples.md").read_text()
    for script in (
        "imagefolder_lightning",
        "llm_pretrain",
        "weighted_mix_resume",
        "s3_stream",
        "video_audio",
    ):
        assert f'--8<-- "examples/{script}.py"' in listing
    assert "examples.md#" in pages  # the guides link into the examples page


def test_imagefolder_lightning_trains_and_resumes(tmp_path):
    script = str(EXAMPLES / "imagefolder_lightning.py")
    first = run(
        sys.executable, script, "--work", "run", "--epochs", "1", "--batch-size", "16", cwd=tmp_path
    )
    assert "120 images of 3 classes: ['class_0', 'class_1', 'class_2']" in first
    assert "trained 1 epochs, 8 steps" in first
    later = run(sys.executable, script, "--work", "run", "--epochs", "2", "--resume", cwd=tmp_path)
    assert "trained 2 epochs, 16 steps" in later


def test_llm_pretrain_trains_and_resumes(tmp_path):
    script = str(EXAMPLES / "llm_pretrain.py")
    first = run(sys.executable, script, "--work", "run", "--steps", "10", cwd=tmp_path)
    assert "packed 400 documents" in first and "step 10 epoch 0 loss" in first
    later = run(sys.executable, script, "--work", "run", "--steps", "10", "--resume", cwd=tmp_path)
    assert "step 20 epoch" in later and "packed" not in later


def test_weighted_mix_resumes_on_another_world_size(tmp_path):
    script = str(EXAMPLES / "weighted_mix_resume.py")

    def torchrun(ranks: int, *args: str) -> str:
        return run(
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={ranks}",
            "--master-addr=127.0.0.1",
            f"--master-port={free_port()}",
            script,
            "--work",
            "run",
            *args,
            cwd=tmp_path,
        )

    torchrun(2, "--stop-after", "4")
    torchrun(3, "--resume")
    keys = [
        key
        for record in (tmp_path / "run").glob("keys-*.json")
        for key in json.loads(record.read_text())
    ]
    assert len(set(keys)) == 240  # the epoch's quota: every planned sample once, over both runs
    assert (
        len(keys) - 240 < 3
    )  # and the last run's tail padded to equal batches, by under one a rank
    per_source = Counter(key.split("-")[0] for key in set(keys))
    assert per_source == {"web": 144, "code": 48, "books": 48}  # 0.6 / 0.2 / 0.2 of 240, exactly


@pytest.mark.filterwarnings("ignore")
def test_s3_stream_packs_into_a_local_server_and_trains_from_it(tmp_path):
    script = str(EXAMPLES / "s3_stream.py")
    # no keys or endpoint of the machine's: the script gives moto made-up keys of its own
    env = {name: "" for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")}
    env.update({"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull})
    out = run(sys.executable, script, "--work", str(tmp_path / "work"), cwd=tmp_path, env=env)
    assert "packed 96 samples" in out and "s3://shardstream-example/train" in out
    assert "epoch 1:" in out
    assert (tmp_path / "work" / "cache").is_dir()  # whole shards came through the local cache


def test_video_audio_trains_on_clips_and_resumes_exactly(tmp_path):
    pytest.importorskip("av")
    script = str(EXAMPLES / "video_audio.py")
    first = run(sys.executable, script, "--work", "run", "--steps", "4", cwd=tmp_path)
    assert "24 samples of 3 classes" in first
    assert "clips (4, 16, 3, 32, 48) torch.uint8, audio (4, 1, 16000) torch.float32" in first
    later = run(sys.executable, script, "--work", "run", "--steps", "4", "--resume", cwd=tmp_path)
    assert "step 8 epoch 1" in later and "packed" not in later
    steps = [
        json.loads(line) for line in (tmp_path / "run" / "seen.jsonl").read_text().splitlines()
    ]
    first_epoch = Counter(key for s in steps if s["epoch"] == 0 for key in s["keys"])
    # the interrupted epoch read every sample exactly once across the two runs
    assert len(first_epoch) == 24 and set(first_epoch.values()) == {1}
    assert sum(len(s["keys"]) for s in steps if s["epoch"] == 1) == 8
