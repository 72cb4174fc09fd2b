"""The test endpoints themselves: a server that cannot start fails loudly; the static HTTP server's Range
answers; moto's authentication switch; the environment the remote tests run in."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

import pytest

from . import endpoints
from .endpoints import EndpointError, FakeGCS, MotoS3, StaticHTTPServer


def test_a_server_that_cannot_start_raises_with_its_log(monkeypatch):
    class Broken(MotoS3):
        def command(self, port: int) -> list[str]:
            return [sys.executable, "-c", "import sys; print('cannot bind, say'); sys.exit(3)"]

    with pytest.raises(EndpointError, match="cannot bind, say"):
        Broken().start()
    monkeypatch.setattr(endpoints, "fake_gcs_binary", lambda: "/nonexistent/fake-gcs-server")
    with pytest.raises(EndpointError, match="cannot start fake-gcs-server"):
        FakeGCS().start()


def test_the_fake_gcs_binary_is_shipped_and_executable():
    binary = endpoints.fake_gcs_binary()
    assert binary.is_file() and os.access(binary, os.X_OK)


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET"):
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_static_server_answers_ranges(tmp_path):
    data = bytes(range(256)) * 40  # 10,240 bytes
    (tmp_path / "f.bin").write_bytes(data)
    with StaticHTTPServer(tmp_path) as server:
        url = server.url + "/f.bin"
        status, headers, body = fetch(url)
        assert (status, body, headers["Accept-Ranges"]) == (200, data, "bytes")
        status, headers, body = fetch(url, {"Range": "bytes=100-199"})
        assert (status, body, headers["Content-Range"]) == (
            206,
            data[100:200],
            "bytes 100-199/10240",
        )
        assert fetch(url, {"Range": "bytes=10000-"})[2] == data[10000:]
        assert fetch(url, {"Range": "bytes=-40"})[2] == data[-40:]
        assert fetch(url, {"Range": "bytes=10240-"})[0] == 416
        status, headers, body = fetch(url, method="HEAD")
        assert (status, headers["Content-Length"], body) == (200, "10240", b"")
        assert fetch(server.url + "/missing")[0] == 404
        assert ("GET", "/f.bin", "bytes=100-199") in server.requests
    with StaticHTTPServer(tmp_path, range_requests=False) as plain:
        status, headers, body = fetch(plain.url + "/f.bin", {"Range": "bytes=100-199"})
        assert (status, body) == (200, data) and "Accept-Ranges" not in headers


def test_moto_auth_is_switched_on_and_off(moto_server):
    bucket = moto_server.new_bucket()
    client = moto_server.client()
    client.put_object(Bucket=bucket.name, Key="k", Body=b"v")
    with (
        moto_server.enforce_auth(),
        pytest.raises(Exception, match="InvalidAccessKeyId|403|Forbidden"),
    ):
        client.get_object(Bucket=bucket.name, Key="k")
    assert client.get_object(Bucket=bucket.name, Key="k")["Body"].read() == b"v"


def test_the_remote_environment(remote_environment):
    import tempfile

    import gcsfs

    assert (
        os.environ["AWS_ACCESS_KEY_ID"] == "testing" and os.environ["AWS_CONFIG_FILE"] == os.devnull
    )
    assert "AWS_PROFILE" not in os.environ
    # not the experimental one that probes gRPC
    assert gcsfs.GCSFileSystem.__name__ == "GCSFileSystem"
    assert tempfile.gettempdir() == str(remote_environment)
