"""The fault-injecting proxy alone: before a plain ``http.server`` backend, driven by ``http.client`` and ``urllib``."""

from __future__ import annotations

import hashlib
import http.client
import http.server
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from .proxy import FaultProxy, gcs_error, s3_error


class Backend(http.server.ThreadingHTTPServer):
    """A keep-alive HTTP/1.1 server: ``GET /bytes/N`` (N deterministic bytes), ``/chunked/N`` (the same, chunked),
    ``PUT``/``POST`` store the body under the path and answer its sha256, ``DELETE`` removes, ``/redirect``
    answers 302 to itself; every request is recorded."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), BackendHandler)
        self.seen: list[tuple[str, str]] = []
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.connections = 0

    @property
    def port(self) -> int:
        return self.server_address[1]


def payload(n: int) -> bytes:
    return bytes(i % 251 for i in range(n))


class BackendHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Backend

    def setup(self) -> None:
        super().setup()
        # headers and body are two sends
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format, *args) -> None:
        pass

    def _record(self) -> None:
        with self.server.lock:
            self.server.seen.append((self.command, self.path))

    def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._record()
        if self.path.startswith("/bytes/"):
            self._reply(
                200,
                payload(int(self.path.split("/")[2])),
                {"Content-Type": "application/octet-stream"},
            )
        elif self.path.startswith("/chunked/"):
            data = payload(int(self.path.split("/")[2]))
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(data), 1000):
                piece = data[i : i + 1000]
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/redirect":
            self._reply(302, b"", {"Location": f"http://127.0.0.1:{self.server.port}/bytes/5"})
        elif self.path in self.server.objects:
            self._reply(200, self.server.objects[self.path])
        else:
            self._reply(404, b"not found\n")

    do_HEAD = do_GET

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            parts = []
            while True:
                size = int(self.rfile.readline().strip(), 16)
                if not size:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_PUT(self) -> None:
        body = self._body()
        self._record()
        with self.server.lock:
            self.server.objects[self.path] = body
        self._reply(200, hashlib.sha256(body).hexdigest().encode())

    do_POST = do_PUT

    def do_DELETE(self) -> None:
        self._record()
        with self.server.lock:
            self.server.objects.pop(self.path, None)
        self._reply(204, b"")


@pytest.fixture
def backend() -> Iterator[Backend]:
    server = Backend()
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def proxy(backend) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", backend.port) as p:
        yield p


def connect(proxy: FaultProxy, timeout: float = 10) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(
        "127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), timeout=timeout
    )


def get(
    conn: http.client.HTTPConnection,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn.request(method, path, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp.read(), resp


# -- plain forwarding ---------------------------------------------------------------------------------


def test_forwards_every_method_on_one_kept_alive_connection(proxy, backend):
    conn = connect(proxy)
    big = payload(3_000_000)
    status, body, _ = get(conn, "/obj/a", "PUT", big)
    assert (status, body) == (200, hashlib.sha256(big).hexdigest().encode())
    status, body, resp = get(conn, "/obj/a")
    assert status == 200 and body == big and resp.getheader("Content-Length") == str(len(big))
    status, body, resp = get(conn, "/obj/a", "HEAD")
    assert status == 200 and body == b"" and resp.getheader("Content-Length") == str(len(big))
    status, body, _ = get(conn, "/obj/a", "POST", b"")
    assert status == 200 and body == hashlib.sha256(b"").hexdigest().encode()
    assert get(conn, "/obj/a", "DELETE")[0] == 204
    assert get(conn, "/obj/a")[:2] == (404, b"not found\n")
    conn.close()
    assert backend.connections == 1  # one upstream connection served the whole keep-alive session
    assert [(s.method, s.target, s.status) for s in proxy.log] == [
        ("PUT", "/obj/a", 200),
        ("GET", "/obj/a", 200),
        ("HEAD", "/obj/a", 200),
        ("POST", "/obj/a", 200),
        ("DELETE", "/obj/a", 204),
        ("GET", "/obj/a", 404),
    ]
    assert (
        proxy.count("GET") == 2
        and proxy.count(path=r"^/obj/a$") == 6
        and proxy.count("PUT", "nothing") == 0
    )


def test_chunked_bodies_both_ways_and_expect_continue(proxy, backend):
    conn = connect(proxy)
    status, body, resp = get(conn, "/chunked/25000")
    assert status == 200 and body == payload(25000)
    assert (
        resp.getheader("Content-Length") == "25000" and resp.getheader("Transfer-Encoding") is None
    )
    conn.request("PUT", "/obj/c", body=iter([b"abc", b"defg"]), encode_chunked=True)
    resp = conn.getresponse()
    assert resp.read() == hashlib.sha256(b"abcdefg").hexdigest().encode()
    assert backend.objects["/obj/c"] == b"abcdefg"
    # Expect: 100-continue is answered by the proxy before the body is sent
    port = int(proxy.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"PUT /obj/e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(b"hello")
        reply = http.client.HTTPResponse(s)
        reply.begin()
        assert reply.status == 200 and reply.read() == hashlib.sha256(b"hello").hexdigest().encode()
    assert backend.objects["/obj/e"] == b"hello"


def test_urllib_through_the_proxy_decodes_targets_and_rewrites_locations(proxy, backend):
    with urllib.request.urlopen(proxy.url + "/bytes/300", timeout=10) as r:
        assert r.read() == payload(300)
    with urllib.request.urlopen(
        proxy.url + "/redirect", timeout=10
    ) as r:  # followed through the proxy, not around
        assert r.read() == payload(5)
    assert [s.target for s in proxy.log] == ["/bytes/300", "/redirect", "/bytes/5"]
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(proxy.url + "/o/ds%2Fshard-000001.tar?alt=media", timeout=10)
    assert err.value.code == 404
    assert proxy.count("GET", r"o/ds/shard-000001\.tar") == 1  # matched URL-decoded


def test_stop_closes_the_port(backend):
    proxy = FaultProxy("127.0.0.1", backend.port).start()
    url = proxy.url
    with urllib.request.urlopen(url + "/bytes/1", timeout=10) as r:
        assert r.read() == payload(1)
    proxy.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/bytes/1", timeout=2)


# -- faults --------------------------------------------------------------------------------------------


def test_status_for_the_next_n_requests_then_forwarding(proxy, backend):
    rule = proxy.inject(
        "status", status=503, body=s3_error("SlowDown"), times=2, headers={"Retry-After": "0"}
    )
    conn = connect(proxy)
    first = get(conn, "/bytes/10")
    assert (
        first[0] == 503
        and b"<Code>SlowDown</Code>" in first[1]
        and first[2].getheader("Retry-After") == "0"
    )
    assert get(conn, "/bytes/10")[0] == 503
    # same connection: kept alive through the faults
    assert get(conn, "/bytes/10")[:2] == (
        200,
        payload(10),
    )
    assert (rule.matched, rule.applied) == (3, 2)
    assert backend.seen == [("GET", "/bytes/10")]  # the faulted requests never reached the server
    assert [s.fault for s in proxy.log] == ["status", "status", None]
    assert proxy.count(fault="status") == 2


def test_status_instead_of_one_answer_forwards_and_replaces_only_that_one(proxy, backend):
    denied = s3_error("AccessDenied", "Access Denied")
    rule = proxy.inject("status", status=403, body=denied, instead_of=404, method="GET")
    conn = connect(proxy)
    assert get(conn, "/missing")[:2] == (403, denied)
    assert get(conn, "/bytes/3")[:2] == (200, payload(3))
    status, body, _ = get(conn, "/also-missing")
    assert (status, body) == (403, denied)
    assert (rule.matched, rule.applied) == (3, 2)
    # every request reached the server; only the 404s were replaced
    assert backend.seen == [("GET", "/missing"), ("GET", "/bytes/3"), ("GET", "/also-missing")]
    assert [s.fault for s in proxy.log] == ["status", None, "status"]
    assert [s.status for s in proxy.log] == [403, 200, 403]


def test_throttling_bodies():
    assert b"<Code>SlowDown</Code>" in s3_error()
    assert b'"code": 429' in gcs_error(429, "Rate limit exceeded", "rateLimitExceeded")


def test_reset_before_forwarding_never_reaches_the_server(proxy, backend):
    proxy.inject("reset", method="PUT", times=1)
    conn = connect(proxy)
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected, BrokenPipeError)):
        get(conn, "/obj/r", "PUT", b"data")
    assert backend.seen == [] and "/obj/r" not in backend.objects
    conn = connect(proxy)
    # a retry on a fresh connection goes through
    assert get(conn, "/obj/r", "PUT", b"data")[0] == 200
    assert backend.objects["/obj/r"] == b"data"
    assert [(s.method, s.status, s.fault) for s in proxy.log] == [
        ("PUT", None, "reset"),
        ("PUT", 200, None),
    ]


def test_reset_after_forwarding_loses_only_the_answer(proxy, backend):
    proxy.inject("reset", method="PUT", forward=True)
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected)):
        get(connect(proxy), "/obj/w", "PUT", b"written")
    assert backend.objects["/obj/w"] == b"written"  # the write happened


def test_truncate_sends_part_of_the_body_under_the_full_length(proxy):
    proxy.inject("truncate", nbytes=1000, path="/bytes/")
    resp = None
    conn = connect(proxy)
    conn.request("GET", "/bytes/5000")
    resp = conn.getresponse()
    assert resp.getheader("Content-Length") == "5000"
    with pytest.raises(http.client.IncompleteRead) as err:
        resp.read()
    assert err.value.partial == payload(1000)


def test_truncate_with_reset(proxy):
    proxy.inject("truncate", nbytes=100, rst=True)
    conn = connect(proxy)
    conn.request("GET", "/bytes/200000")
    resp = conn.getresponse()
    with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
        resp.read()


def test_short_rewrites_the_length_so_the_client_sees_no_error(proxy):
    proxy.inject("short", nbytes=700, times=1)
    conn = connect(proxy)
    status, body, resp = get(conn, "/bytes/5000")
    assert status == 200 and body == payload(700) and resp.getheader("Content-Length") == "700"
    assert get(conn, "/bytes/5000")[1] == payload(5000)  # the connection stays usable


def test_delay_adds_latency_and_combines_with_another_fault(proxy):
    proxy.inject("delay", seconds=0.3, path="/bytes/1$")
    proxy.inject("status", status=429, times=1, path="/bytes/1$")
    conn = connect(proxy)
    start = time.monotonic()
    assert get(conn, "/bytes/1")[0] == 429
    assert get(conn, "/bytes/1")[:2] == (200, payload(1))
    assert time.monotonic() - start >= 0.6
    start = time.monotonic()
    # other paths: no delay (generous bound for a loaded machine)
    assert get(conn, "/bytes/2")[0] == 200
    assert time.monotonic() - start < 0.3 + 5


def test_stall_times_the_client_out_without_reaching_the_server(proxy, backend):
    proxy.inject("stall", seconds=30, times=1)
    conn = connect(proxy, timeout=0.5)
    with pytest.raises(TimeoutError):
        get(conn, "/bytes/10")
    assert backend.seen == []
    assert get(connect(proxy), "/bytes/10")[0] == 200
    start = time.monotonic()
    proxy.stop()  # ends the stall at once rather than after 30 s
    assert time.monotonic() - start < 10


def test_stall_in_the_middle_of_a_body(proxy):
    proxy.inject("stall", seconds=30, nbytes=100)
    conn = connect(proxy, timeout=0.5)
    conn.request("GET", "/bytes/1000")
    resp = conn.getresponse()  # the headers arrive
    assert resp.status == 200
    with pytest.raises((TimeoutError, http.client.IncompleteRead)):
        resp.read()


# -- which requests ------------------------------------------------------------------------------------


def test_method_path_and_kth_request_filters(proxy):
    # the 3rd GET only
    rule = proxy.inject("status", status=500, method="GET", path=r"/bytes/7$", after=2, times=1)
    conn = connect(proxy)
    statuses = [get(conn, "/bytes/7")[0] for _ in range(5)]
    assert statuses == [200, 200, 500, 200, 200]
    assert (
        get(conn, "/bytes/7", "HEAD")[0] == 200
        and get(conn, "/bytes/8", headers={"Range": "bytes=0-3"})[0] == 200
    )
    assert proxy.log[-1].range == "bytes=0-3" and proxy.log[-2].range is None
    assert (rule.matched, rule.applied) == (5, 1)
    rule.remove()
    assert all(get(conn, "/bytes/7")[0] == 200 for _ in range(3))


def test_content_filter_matches_request_bodies(proxy, backend):
    proxy.inject("status", status=403, content=rb'"name": ?"ds/shard-000001')
    conn = connect(proxy)
    assert get(conn, "/upload", "POST", b'{"name": "ds/shard-000000.tar"}')[0] == 200
    assert get(conn, "/upload", "POST", b'{"name": "ds/shard-000001.tar"}')[0] == 403


def test_probability_is_seeded(backend):
    def pattern(seed: int) -> list[int]:
        with FaultProxy("127.0.0.1", backend.port) as p:
            p.inject("status", status=503, probability=0.3, seed=seed)
            conn = connect(p)
            return [get(conn, "/bytes/1")[0] for _ in range(120)]

    first, again, other = pattern(11), pattern(11), pattern(12)
    assert first == again and first != other
    assert 15 <= first.count(503) <= 60  # about 30% of 120


def test_fault_context_and_callback(proxy):
    calls = []
    with proxy.fault(
        "delay", seconds=0, path="/bytes/3", callback=lambda seen: calls.append(seen.target)
    ) as rule:
        assert get(connect(proxy), "/bytes/3")[0] == 200
    assert get(connect(proxy), "/bytes/3")[0] == 200
    assert calls == ["/bytes/3"] and rule.applied == 1


def test_unknown_fault_and_bad_target_are_refused():
    with pytest.raises(ValueError, match="unknown fault"):
        FaultProxy("127.0.0.1", 1).inject("explode")
    with pytest.raises(ValueError, match="http://host:port"):
        FaultProxy.to_url("s3://bucket")
