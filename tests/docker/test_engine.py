"""The images built from a locally made base (no registry) and run with a real engine.

Skipped, with the reason, where no engine runs (``make docker-test`` installs none: see
docs/guides/containers.md). Inside the image: pack + info + verify; an epoch with 2 workers under
``--shm-size=64m`` ends with shardstream's SharedMemoryError and its advice (never a Bus error or a
hang); the same epoch under ``--shm-size=1g`` reads every sample; and the compose stack (store, pack
job, 2-rank torchrun job) reads every sample exactly once and exits 0.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.docker.engine import (
    DOCKER,
    IMAGE_TAG,
    Engine,
    EngineUnavailable,
    build_images,
    ensure_base,
    find_engine,
)

pytestmark = pytest.mark.container

SAMPLES = 240


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    try:
        found = find_engine(tmp_path_factory.mktemp("engine"))
        base = ensure_base(found)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    build_images(found, base)
    return found


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder the image's user (uid 10001) may write, mounted at /work."""
    path = tmp_path_factory.mktemp("work")
    path.chmod(0o777)
    return path


def run_image(engine: Engine, work: Path, *args: str, shm: str = "1g", timeout: float = 300):
    return engine(
        "run",
        *engine.run_args(),
        "--network",
        "none",
        f"--shm-size={shm}",
        "-v",
        f"{work}:/work",
        "-v",
        f"{DOCKER}:/app:ro",
        "--entrypoint",
        "sh",
        IMAGE_TAG,
        "-c",
        " ".join(args),
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def dataset(engine: Engine, work: Path) -> subprocess.CompletedProcess:
    """Sample images packed, described and verified inside the image; the dataset is /work/ds."""
    return run_image(
        engine,
        work,
        f"python /app/sample_images.py /work/images --count {SAMPLES} &&",
        "shardstream pack /work/images /work/ds --shard-size 1MB -q &&",
        "shardstream info /work/ds && shardstream verify /work/ds",
    )


def test_pack_info_verify_inside(dataset):
    assert dataset.returncode == 0, dataset.stdout + dataset.stderr
    assert f"samples  {SAMPLES}" in dataset.stdout
    assert f"ok: 4 shards, {SAMPLES} samples" in dataset.stdout


def test_epoch_in_a_64m_shm_stops_with_the_advice(engine, work, dataset):
    result = run_image(
        engine, work, "python /app/train.py /work/ds --workers 2 --batch-size 64", shm="64m"
    )
    text = result.stdout + result.stderr
    # shardstream's error, not SIGBUS (135) or a hang (the timeout)
    assert result.returncode == 1, text
    # the shell's "Bus error (core dumped)" or torch's "DataLoader worker (pid N) is killed by signal: Bus error"
    assert (
        not any(line.startswith("Bus error") for line in text.splitlines())
        and "killed by signal" not in text
    )
    error = next(line for line in result.stderr.splitlines() if line.startswith("error: "))
    assert "/dev/shm has 6" in error and "MB free" in error  # 64 MiB: about 67 MB
    assert "2 workers x" in error and "(measured on the first batch)" in error
    assert "--shm-size=" in error and "--ipc=host" in error


def test_epoch_in_a_1g_shm_reads_everything(engine, work, dataset):
    result = run_image(
        engine, work, "python /app/train.py /work/ds --workers 2 --batch-size 64", shm="1g"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert (
        report["samples"] == report["read"] == report["distinct"] == SAMPLES
        and report["exactly_once"]
    )


def test_doctor_preflight_in_a_64m_shm(engine, work):
    """The image's default command (doctor) and its HEALTHCHECK say the same as the loader would."""
    small = engine(
        "run",
        *engine.run_args(),
        "--network",
        "none",
        "--shm-size=64m",
        IMAGE_TAG,
        "doctor",
        "--workers",
        "4",
        "--batch-size",
        "64",
    )
    assert small.returncode == 1, small.stdout + small.stderr
    assert "TOO SMALL" in small.stdout and "docker run --shm-size=" in small.stderr
    big = engine(
        "run",
        *engine.run_args(),
        "--network",
        "none",
        "--shm-size=1g",
        IMAGE_TAG,
        "doctor",
        "--workers",
        "4",
        "--batch-size",
        "64",
    )
    assert big.returncode == 0, big.stdout + big.stderr
    image = json.loads(engine("image", "inspect", IMAGE_TAG).stdout)[0]
    config = image["Config"]
    # podman: top level; docker: in Config
    health = image.get("Healthcheck") or config.get("Healthcheck")
    assert health["Test"][1:3] == ["shardstream", "doctor"]
    assert config["User"] == "10001:10001" and config["Entrypoint"] == ["shardstream"]
    assert not any(key.startswith("AWS_") for key in "\n".join(config.get("Env") or []).split())


def _compose_project(tmp: Path, engine: Engine) -> Path:
    """docker/ as a compose project of its own: an .env with fresh keys, and the host's limits."""
    for name in (
        "compose.yml",
        "Dockerfile",
        "store.Dockerfile",
        ".dockerignore",
        "train.py",
        "sample_images.py",
    ):
        shutil.copy(DOCKER / name, tmp / name)
    (tmp / ".env").write_text(
        (DOCKER / ".env.example")
        .read_text()
        .replace("change-me-to-a-long-random-secret", secrets.token_hex(16))
    )
    # this machine's hard process limit is lower than podman's default for a container with ulimits of its own
    (tmp / "limits.yml").write_text(
        f"services:\n  train:\n    ulimits:\n      nproc: {{soft: {engine.nproc}, hard: {engine.nproc}}}\n"
    )
    return tmp


def test_compose_stack_trains_on_every_sample_once(engine, tmp_path):
    compose = engine.compose()
    if compose is None:
        pytest.skip(
            f"no compose for {engine.name} (apt-get install podman-compose, or docker compose)"
        )
    project = _compose_project(tmp_path, engine)
    name = f"sstest{uuid.uuid4().hex[:8]}"
    base = [*compose, "-p", name, "-f", "compose.yml", "-f", "limits.yml"]

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*base, *args],
            cwd=project,
            env=engine.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    try:
        result = run("run", "--rm", "train")
        text = result.stdout + result.stderr
        assert result.returncode == 0, text[-4000:]
        report = json.loads(
            next(line for line in reversed(result.stdout.splitlines()) if line.startswith("{"))
        )
        assert report == {
            "ranks": 2,
            "device": "cpu",
            "samples": SAMPLES,
            "epochs": 1,
            "read": SAMPLES,
            "distinct": SAMPLES,
            "per_rank": [SAMPLES // 2, SAMPLES // 2],
            "exactly_once": True,
        }
        assert "cgroup quota 2 cores" in text  # cpus: 2, as the doctor's preflight saw it
    finally:
        run("down", "-v", timeout=300)
