"""docker/ checked offline, in every test run: hadolint, the compose specification, ``docker-compose
config``, pins, no credentials in images or in git."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = ["Dockerfile", "store.Dockerfile"]


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: pip install -e '.[test]'"
    return str(path)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_is_clean(name):
    result = subprocess.run([tool("hadolint"), str(DOCKER / name)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_compose_file_follows_the_compose_specification():
    result = subprocess.run(
        [
            tool("check-jsonschema"),
            "--builtin-schema",
            "vendor.compose-spec",
            str(DOCKER / "compose.yml"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def compose_config(tmp_path_factory) -> dict:
    """``docker-compose config`` of the stack, with the example env file as the user's .env."""
    project = tmp_path_factory.mktemp("compose")
    shutil.copy(DOCKER / "compose.yml", project / "compose.yml")
    shutil.copy(DOCKER / ".env.example", project / ".env")
    result = subprocess.run(
        [tool("docker-compose"), "-f", "compose.yml", "config", "--format", "json"],
        cwd=project,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_compose_config_resolves(compose_config):
    services = compose_config["services"]
    assert set(services) == {"store", "pack", "train"}
    train = services["train"]
    assert train["shm_size"] == str(1 << 30) or int(train["shm_size"]) == 1 << 30
    assert train["ipc"] == "private"
    assert train["ulimits"]["nofile"] == {"soft": 16384, "hard": 16384}
    assert float(train["cpus"]) == 2
    assert train["depends_on"]["pack"]["condition"] == "service_completed_successfully"
    assert services["pack"]["depends_on"]["store"]["condition"] == "service_healthy"
    command = " ".join(train["command"])
    assert "shardstream doctor" in command and "torchrun --standalone --nproc_per_node=2" in command
    for service in services.values():  # credentials only at run time, from the env file
        assert service["environment"]["AWS_ACCESS_KEY_ID"] == "shardstream"
    assert services["store"]["build"]["dockerfile"] == "store.Dockerfile"


def test_compose_needs_the_env_file(tmp_path):
    """Without docker/.env the stack refuses to start (no store without keys)."""
    shutil.copy(DOCKER / "compose.yml", tmp_path / "compose.yml")
    result = subprocess.run(
        [tool("docker-compose"), "-f", "compose.yml", "config", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode != 0 and ".env" in result.stderr


def test_env_file_is_ignored_and_not_committed():
    if not (ROOT / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", "docker/.env"], cwd=ROOT)
    assert ignored.returncode == 0, "docker/.env must be in .gitignore"
    tracked = subprocess.run(
        ["git", "ls-files", "docker/.env"], cwd=ROOT, capture_output=True, text=True
    )
    assert tracked.stdout.strip() == ""
    # and it never enters a build context
    rules = (DOCKER / ".dockerignore").read_text().split()
    assert rules[rules.index("*") + 1 :] and all(
        r.startswith("!") and ".env" not in r
        for r in rules[rules.index("*") + 1 :]
        if not r.startswith("#")
    )


SECRET = re.compile(r"(?i)(secret|password|passwd|token|access_key|api_key|credential)")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_no_credentials_in_the_images(name):
    for line in (DOCKER / name).read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if re.match(r"\s*(ENV|ARG|LABEL)\b", line) or "AWS_" in line:
            assert not SECRET.search(line) and "AWS_" not in line, f"{name}: {line}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_base_is_pinned_and_user_is_not_root(name):
    text = (DOCKER / name).read_text()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert base and ":" in base.group(1) and not base.group(1).endswith(":latest")
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M)
    user = re.findall(r"^USER (\S+)$", text, re.M)
    # numeric: runAsNonRoot can check it
    assert user and re.fullmatch(r"[1-9]\d*:[1-9]\d*", user[-1])


def test_image_layers_deps_before_source_and_preflight():
    text = (DOCKER / "Dockerfile").read_text()
    deps = text.index("-r /opt/requirements.txt")
    source = text.index("COPY dist/")
    assert deps < source
    assert 'ENTRYPOINT ["shardstream"]' in text
    assert re.search(r'HEALTHCHECK .*\n\s+CMD \["shardstream", "doctor"', text)
    assert "--no-index" in text  # builds use the wheelhouse only: no network


def test_store_turns_telemetry_off():
    text = (DOCKER / "store.Dockerfile").read_text()
    assert '"-master.telemetry=false"' in text


def test_requirements_pin_every_runtime_dependency():
    """docker/requirements.txt pins each of pyproject's dependencies (and s3fs), torch aside."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]
    } - {"torch"}
    wanted.add("s3fs")
    pins = {}
    for line in (DOCKER / "requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned: {line}"
            pins[name.lower()] = version
    assert wanted <= set(pins), f"missing from docker/requirements.txt: {wanted - set(pins)}"
    assert "torch" not in pins
