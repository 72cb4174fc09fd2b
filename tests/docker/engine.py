"""A container engine for the tests (podman, else docker), and the images they build without a registry.

Standard library only. Everything the engine needs on a machine like CI's (root, cgroup v1, no
registry) is set here rather than on the machine:

- podman gets a ``containers.conf`` of its own (``CONTAINERS_CONF``): runc where it is installed
  (crun fails on some cgroup set-ups) and default ulimits no higher than this process's own hard
  limits (podman's defaults are higher than some hosts allow a container, which then fails to start);
- the base image is made by ``docker/build-base.sh`` (mmdebstrap) and the wheels by
  ``docker/wheelhouse.sh``, so no build pulls anything.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BASE_TAG = "localhost/shardstream-base:bookworm"
IMAGE_TAG = "localhost/shardstream:cpu"
STORE_TAG = "localhost/shardstream-store:4.48"


class EngineUnavailable(Exception):
    """No engine runs here: the container tests skip with this reason."""


def _run(
    cmd: list[str], env: dict[str, str] | None = None, timeout: float = 600, **kw
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        env=env,
        timeout=timeout,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        **kw,
    )


class Engine:
    """``podman`` or ``docker`` with the options each needs, and a compose command for it."""

    def __init__(self, name: str, workdir: Path):
        self.name = name
        self.env = dict(os.environ)
        self.nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])
        if name == "podman":
            conf = workdir / "containers.conf"
            nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            limits = f'"nofile={nofile}:{nofile}", "nproc={self.nproc}:{self.nproc}"'
            lines = ["[containers]", f"default_ulimits = [{limits}]"]
            if shutil.which("runc"):
                lines += ["[engine]", 'runtime = "runc"']
            conf.write_text("\n".join(lines) + "\n")
            self.env["CONTAINERS_CONF"] = str(conf)

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return _run([self.name, *args], self.env, timeout)

    def check(self) -> None:
        """Raise :class:`EngineUnavailable` unless a container actually starts."""
        info = self("info", timeout=120)
        if info.returncode != 0:
            raise EngineUnavailable(f"`{self.name} info` failed: {info.stderr.strip()[-300:]}")

    def build_args(self) -> list[str]:
        """Build flags: podman writes OCI images without HEALTHCHECK unless told the docker format."""
        return ["--format", "docker"] if self.name == "podman" else []

    def run_args(self) -> list[str]:
        """``run`` flags: no health-check timers (podman wants systemd for them)."""
        return ["--rm", "--no-healthcheck"] if self.name == "podman" else ["--rm"]

    def compose(self) -> list[str] | None:
        """The compose command for this engine, or None."""
        if self.name == "podman":
            return ["podman-compose"] if shutil.which("podman-compose") else None
        if _run(["docker", "compose", "version"], self.env, 60).returncode == 0:
            return ["docker", "compose"]
        return ["docker-compose"] if shutil.which("docker-compose") else None


def find_engine(workdir: Path) -> Engine:
    """The first engine that runs a container here, or :class:`EngineUnavailable` saying why none does."""
    reasons = []
    for name in ("podman", "docker"):
        if not shutil.which(name):
            reasons.append(f"no {name}")
            continue
        engine = Engine(name, workdir)
        try:
            engine.check()
            return engine
        except (EngineUnavailable, subprocess.TimeoutExpired) as exc:
            reasons.append(str(exc))
    raise EngineUnavailable(
        "no usable container engine (" + "; ".join(reasons) + "); install one, e.g. "
        "`apt-get install podman runc podman-compose mmdebstrap`, then `make docker-test`"
    )


def ensure_base(engine: Engine) -> str:
    """The base image: made locally by docker/build-base.sh (mmdebstrap), kept between runs."""
    if engine("image", "inspect", BASE_TAG).returncode == 0:
        return BASE_TAG
    if not shutil.which("mmdebstrap"):
        raise EngineUnavailable(
            "no base image and no mmdebstrap to make one (apt-get install mmdebstrap)"
        )
    made = _run(["bash", str(DOCKER / "build-base.sh"), engine.name, BASE_TAG], engine.env, 900)
    if made.returncode != 0:
        raise RuntimeError(
            f"docker/build-base.sh failed:\n{made.stdout[-2000:]}\n{made.stderr[-2000:]}"
        )
    return BASE_TAG


def build_images(engine: Engine, base: str) -> None:
    """The wheels (docker/wheelhouse.sh), then the CPU image and the store image on ``base``."""
    wheels = _run(["bash", str(DOCKER / "wheelhouse.sh")], engine.env, 900)
    if wheels.returncode != 0:
        raise RuntimeError(f"docker/wheelhouse.sh failed:\n{wheels.stderr[-3000:]}")
    for dockerfile, tag, extra in (
        ("Dockerfile", IMAGE_TAG, ["--build-arg", "TORCH=torch==2.13.0"]),
        ("store.Dockerfile", STORE_TAG, []),
    ):
        built = engine(
            "build",
            *engine.build_args(),
            "--network",
            "none",
            "-f",
            str(DOCKER / dockerfile),
            "-t",
            tag,
            "--build-arg",
            f"BASE_IMAGE={base}",
            *extra,
            str(DOCKER),
            timeout=900,
        )
        if built.returncode != 0:
            raise RuntimeError(
                f"building {dockerfile} failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
            )
