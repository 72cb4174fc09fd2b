"""Real storage endpoints on 127.0.0.1, started by the tests: S3 (moto), GCS (fake-gcs-server), plain HTTP.

Fixtures (see each one's documentation):

- ``moto_server`` / ``gcs_server`` / ``http_server`` (session): the running servers
  (:class:`~.endpoints.MotoS3`, :class:`~.endpoints.FakeGCS`, :class:`~.endpoints.StaticHTTPServer`).
- ``s3_bucket`` / ``gcs_bucket``: a fresh, empty bucket for one test, as an :class:`~.endpoints.Bucket`
  (``.url("ds")`` -> ``"s3://<name>/ds"``, ``.storage_options``, ``.cli_options``, and
  ``.keys()``/``.read()``/``.write()``/``.delete()`` behind shardstream's back);
  ``bucket`` is the same, parametrised over both stores (``[s3]`` and ``[gcs]`` test ids).
- ``http_dir``: a fresh folder served read-only over HTTP for one test, as an :class:`HttpDir`.
- ``proxied``: ``proxied(bucket)`` puts a :class:`~.proxy.FaultProxy` in front of the
  bucket's endpoint and returns the bucket as seen through it (``.proxy`` set).

A server that cannot start fails the tests that need it: these tests must run in CI,
never be skipped. The environment is made safe before anything else: dummy AWS
credentials with no real AWS configuration, and gcsfs without its gRPC probe.

The remote tests run after every other test of a session (see
``pytest_collection_modifyitems``): the servers, the proxy threads and fsspec's
event-loop thread they leave would otherwise change how later tests run (``pack``
forks its workers only while its process has one thread).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .endpoints import (
    AWS_ENV_TO_UNSET,
    DUMMY_AWS_ENV,
    GCS_ENV,
    Bucket,
    FakeGCS,
    MotoS3,
    StaticHTTPServer,
)
from .proxy import FaultProxy

# gcsfs reads this when it is imported; set it before anything can import it.
os.environ.update(GCS_ENV)

HERE = Path(__file__).parent


def pytest_collection_modifyitems(session, config, items) -> None:
    """Run the endpoint tests last: their session servers and threads stay until the session ends."""
    here = str(HERE) + os.sep
    # stable: the order within each part is kept
    items.sort(key=lambda item: str(item.path).startswith(here))


@pytest.fixture(scope="session", autouse=True)
def remote_environment(tmp_path_factory) -> Iterator[Path]:
    """Dummy AWS credentials (no ~/.aws, no real profile or endpoint variables), gcsfs without its
    gRPC probe, and temporary files (the shard cache among them) in this session's temp folder, for
    this process and the processes it starts."""
    temp = tmp_path_factory.mktemp("remote-tmp")
    with pytest.MonkeyPatch.context() as mp:
        for name in AWS_ENV_TO_UNSET:
            mp.delenv(name, raising=False)
        for name, value in {**DUMMY_AWS_ENV, **GCS_ENV}.items():
            mp.setenv(name, value)
        mp.setenv("TMPDIR", str(temp))
        mp.setattr(tempfile, "tempdir", str(temp))
        # Ray's socket paths must stay under 108 bytes: a short folder of its own, not the session's
        ray_temp = tempfile.mkdtemp(prefix="ss-ray-", dir="/tmp")
        mp.setenv("RAY_TMPDIR", ray_temp)
        yield temp
    shutil.rmtree(ray_temp, ignore_errors=True)


# -- servers ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_server(remote_environment) -> Iterator[MotoS3]:
    """moto's S3 server in a child process on 127.0.0.1 (stopped at the end of the session)."""
    with MotoS3() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server(remote_environment) -> Iterator[FakeGCS]:
    """fake-gcs-server (in-memory) in a child process on 127.0.0.1 (stopped at the end of the session)."""
    import gcsfs

    if gcsfs.GCSFileSystem.__name__ != "GCSFileSystem":
        pytest.fail(
            "gcsfs was imported before GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false was set: every new bucket "
            "would wait 60 s on a gRPC probe; set it in the environment of the test run"
        )
    with FakeGCS() as server:
        yield server


@pytest.fixture(scope="session")
def http_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("http-root")


@pytest.fixture(scope="session")
def http_server(http_root) -> Iterator[StaticHTTPServer]:
    """A threaded HTTP server (GET, HEAD, Range) serving ``http_root`` read-only."""
    with StaticHTTPServer(http_root) as server:
        yield server


# -- buckets --------------------------------------------------------------------------------------------------


@pytest.fixture
def s3_bucket(moto_server) -> Bucket:
    """A fresh S3 bucket on the moto server."""
    return moto_server.new_bucket()


@pytest.fixture
def gcs_bucket(gcs_server) -> Bucket:
    """A fresh GCS bucket on fake-gcs-server (anonymous access)."""
    return gcs_server.new_bucket()


@pytest.fixture(params=["s3", "gcs"])
def bucket(request) -> Bucket:
    """A fresh bucket on each store in turn."""
    return request.getfixturevalue(f"{request.param}_bucket")


@pytest.fixture
def proxied() -> Iterator[Callable[[Bucket], Bucket]]:
    """``proxied(bucket)``: the bucket through a new fault proxy (``.proxy``), stopped after the test."""
    started: list[FaultProxy] = []

    def make(bucket: Bucket) -> Bucket:
        proxy = FaultProxy.to_url(bucket.endpoint_url).start()
        started.append(proxy)
        return bucket.through(proxy)

    yield make
    for proxy in started:
        proxy.stop()


@dataclass
class HttpDir:
    """A folder served over HTTP: write files into ``path``, read them at ``url``."""

    path: Path
    url: str
    server: StaticHTTPServer


@pytest.fixture
def http_dir(http_server, http_root) -> HttpDir:
    """A fresh folder under the HTTP server's root."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    path = http_root / name
    path.mkdir()
    return HttpDir(path, f"{http_server.url}/{name}", http_server)
