"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, in front of one HTTP endpoint (S3, GCS, a static server).

Standard library only, no pytest: tests and benchmarks use it alike::

    from tests.remote.proxy import FaultProxy, s3_error

    with FaultProxy.to_url("http://127.0.0.1:9000") as proxy:   # or FaultProxy("127.0.0.1", 9000)
        opts = {"endpoint_url": proxy.url}                        # clients talk to the proxy
        proxy.inject("delay", seconds=0.05)                       # 50 ms more on every request
        proxy.inject("status", status=503, body=s3_error("SlowDown", "Reduce your request rate."),
                     method="PUT", path=r"shard-\\d+\\.tar", times=2)
        rule = proxy.inject("reset", method="GET", path="shard-000003", after=1, times=1)  # its 2nd GET only
        ...
        assert rule.applied == 1
        assert proxy.count("GET", "shard-000003") == 3            # the failed GET was retried

The proxy reads each request (headers and body), forwards it upstream on a connection
kept per client connection (keep-alive on both sides; ``Expect: 100-continue`` is
answered by the proxy), reads the whole response, then applies the fault, if any, and
writes the response back. Requests are handled in threads. Responses are buffered whole,
not streamed: a client's first byte waits for the last one from the server (on this
machine about 1 ms more per small request and 2-3 ms per 4 MB, measured against moto and
fake-gcs-server). ``Location`` headers that point at the server are rewritten to the proxy
(redirects, GCS resumable-upload sessions).

Faults (``kind`` of :meth:`FaultProxy.inject`):

``delay``
    Sleep ``seconds``, then forward normally. Delays add up with each other and with
    one other fault (every matching ``delay`` rule applies, and the first matching rule
    of another kind).
``stall``
    Hold the connection for ``seconds`` and close it, never forwarding: clients time
    out. With ``nbytes``, forward and send the headers and ``nbytes`` of the body
    first, then hold: a read timeout in the middle of a body.
``reset``
    Reset the connection (TCP RST). By default before forwarding: the server never sees
    the request. With ``forward=True`` after the server handled it (a write that
    happened but whose answer was lost).
``status``
    Answer ``status`` (default 503) with ``body`` and ``headers``, never forwarding.
    :func:`s3_error` and :func:`gcs_error` make bodies the real services would send.
    With ``instead_of``, forward, and answer ``status`` only where the server answered
    ``instead_of`` (other answers pass unchanged and do not count as applied): e.g. 403
    instead of 404, as S3 answers a GET of a missing key to a caller that may not list
    the bucket.
``truncate``
    Forward; send the real headers (the full ``Content-Length``) and only ``nbytes``
    bytes of the body, then close the connection (``rst=True``: reset it). The client sees
    a short read.
``short``
    Forward; rewrite ``Content-Length`` to ``nbytes`` and send that many bytes of the
    body, keeping the connection: the client sees a complete, silently shortened object.

Which requests (all filters optional, combined): ``method``; ``path``, a regular
expression searched in the URL-decoded request target (path and query: gcsfs writes
object names as ``o/ds%2Fshard-000000.tar``, matched as ``o/ds/shard-000000.tar``);
``content``, a regular expression (bytes or str) searched in the first 64 KiB of the
request body (GCS uploads name the object in the body, not the path); ``after`` (leave
the first N matching requests alone); ``times`` (apply to at most N); ``probability``
(apply to that fraction of matching requests, drawn from ``random.Random(seed)`` of the
rule, so runs repeat). The k-th matching request alone: ``after=k - 1, times=1``.

``callback(seen)`` is called (in the proxy's thread, before the fault takes effect)
each time the rule applies: a test can act at an exact point of a client's work, e.g.
change a source file while the first shard is being uploaded. A ``delay`` rule with
``seconds=0`` and a callback is a pure hook.

Every request is recorded (:attr:`FaultProxy.log`: method, decoded target, status
sent, fault applied, Range header); :meth:`FaultProxy.count` counts them by method,
path pattern and fault.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import re
import socket
import socketserver
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import escape

__all__ = ["FaultProxy", "Rule", "Seen", "gcs_error", "s3_error"]

KINDS = ("delay", "stall", "reset", "status", "truncate", "short")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade", "expect"}
_MAX_LINE = 65536
_CONTENT_SCAN = 1 << 16  # ``content`` patterns look at the first 64 KiB of a request body


def s3_error(code: str = "SlowDown", message: str = "Please reduce your request rate.") -> bytes:
    """An S3 error document, e.g. ``s3_error("SlowDown")`` (with 503), ``s3_error("AccessDenied", ...)`` (403)."""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{escape(code)}</Code>'
        f"<Message>{escape(message)}</Message><RequestId>fault-proxy</RequestId></Error>"
    ).encode()


def gcs_error(
    status: int = 503, message: str = "Backend Error", reason: str = "backendError"
) -> bytes:
    """A GCS JSON API error document, e.g. ``gcs_error(429, "Rate limit", "rateLimitExceeded")``."""
    import json

    return json.dumps(
        {
            "error": {
                "code": status,
                "message": message,
                "errors": [{"domain": "global", "reason": reason, "message": message}],
            }
        }
    ).encode()


@dataclass
class Rule:
    """One injected fault and the requests it applies to; its counters are live."""

    kind: str
    method: str | None = None
    path: str | None = None
    after: int = 0
    times: int | None = None
    probability: float | None = None
    seed: int = 0
    seconds: float = 0.0
    status: int = 503
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0
    forward: bool = False
    rst: bool = False
    content: bytes | str | None = None
    callback: Callable[[Seen], None] | None = None
    instead_of: int | None = None
    matched: int = 0  # requests that passed the filters
    applied: int = 0  # of those, the ones the fault was applied to
    _pattern: re.Pattern[str] | None = field(default=None, repr=False)
    _content: re.Pattern[bytes] | None = field(default=None, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _proxy: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; one of {', '.join(KINDS)}")
        self._pattern = re.compile(self.path) if self.path is not None else None
        if self.content is not None:
            raw = self.content.encode() if isinstance(self.content, str) else self.content
            self._content = re.compile(raw)
        self._rng = random.Random(self.seed)
        if self.method is not None:
            self.method = self.method.upper()

    def _fires(self, method: str, target: str, body: bytes) -> bool:
        """Called under the proxy's lock for each request: whether this rule applies to it."""
        if self.method is not None and method != self.method:
            return False
        if self._pattern is not None and not self._pattern.search(target):
            return False
        if self._content is not None and not self._content.search(body[:_CONTENT_SCAN]):
            return False
        self.matched += 1
        if self.matched <= self.after:
            return False
        if self.times is not None and self.applied >= self.times:
            return False
        if self.probability is not None and self._rng.random() >= self.probability:
            return False
        self.applied += 1
        return True

    def remove(self) -> None:
        """Stop applying this fault."""
        if self._proxy is not None:
            self._proxy.remove(self)


@dataclass(frozen=True)
class Seen:
    """One request the proxy handled."""

    method: str
    target: str  # URL-decoded path and query
    status: int | None  # the status sent to the client; None if it got none (reset, stall)
    fault: str | None  # the fault applied (not counting delays), or None
    range: str | None = None  # the request's Range header, if any ("bytes=0-1023")


class _Abort(Exception):
    """End this client connection without another response."""


class _Response:
    def __init__(self, status: int, reason: str, headers: list[tuple[str, str]], body: bytes):
        self.status, self.reason, self.headers, self.body = status, reason, headers, body

    def head_bytes(self, content_length: int | None = None) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {self.reason}"]
        for name, value in self.headers:
            if content_length is not None and name.lower() == "content-length":
                value = str(content_length)
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream: http.client.HTTPConnection | None = None
        self.server.proxy._opened(self.connection)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        if self.upstream is not None:
            self.upstream.close()
        self.server.proxy._closed(self.connection)

    def handle(self) -> None:
        proxy = self.server.proxy
        with contextlib.suppress(_Abort, OSError, http.client.HTTPException):
            while not proxy._stopping.is_set():
                if not self._one_request(proxy):
                    break

    # -- reading the client's request ------------------------------------------------------------
    def _read_request(self) -> tuple[str, str, str, list[tuple[str, str]], bytes] | None:
        line = self.rfile.readline(_MAX_LINE)
        while line in (b"\r\n", b"\n"):  # stray empty lines between requests are allowed
            line = self.rfile.readline(_MAX_LINE)
        if not line:
            return None
        method, target, version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        headers: list[tuple[str, str]] = []
        while True:
            raw = self.rfile.readline(_MAX_LINE)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        get = {k.lower(): v for k, v in headers}
        if get.get("expect", "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()
        if "chunked" in get.get("transfer-encoding", "").lower():
            body = self._read_chunked()
            headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
            headers.append(("Content-Length", str(len(body))))
        else:
            length = int(get.get("content-length", "0") or 0)
            body = self.rfile.read(length) if length else b""
            if len(body) != length:
                return None
        return method.upper(), target, version, headers, body

    def _read_chunked(self) -> bytes:
        parts = []
        while True:
            size = int(self.rfile.readline(_MAX_LINE).split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline(_MAX_LINE)

    # -- forwarding --------------------------------------------------------------------------------
    def _forward(
        self,
        proxy: FaultProxy,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> _Response:
        for attempt in range(2):
            reused = self.upstream is not None
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection(
                    proxy.target_host, proxy.target_port, timeout=proxy.upstream_timeout
                )
            conn = self.upstream
            try:
                conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    if name.lower() not in _HOP_BY_HOP:
                        conn.putheader(name, value)
                conn.endheaders(body if body or method in ("POST", "PUT", "PATCH") else None)
                resp = conn.getresponse()
                data = resp.read()  # de-chunked: sent on with a Content-Length
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                conn.close()
                self.upstream = None
                # the server closed an idle kept-alive connection: once more
                if reused and attempt == 0:
                    continue
                raise
            out = []
            for name, value in resp.getheaders():
                low = name.lower()
                if low in _HOP_BY_HOP or low == "transfer-encoding":
                    continue
                if low == "content-length" and method != "HEAD":
                    continue  # set below from the body actually read
                if low == "location":
                    value = proxy._rewrite_location(value)
                out.append((name, value))
            if method != "HEAD" and resp.status not in (204, 304) and not 100 <= resp.status < 200:
                out.append(("Content-Length", str(len(data))))
            if resp.will_close:
                conn.close()
                self.upstream = None
            return _Response(resp.status, resp.reason, out, data)
        raise ConnectionError(
            "upstream unreachable"
        )  # pragma: no cover - the loop returns or raises

    # -- one exchange --------------------------------------------------------------------------------
    def _one_request(self, proxy: FaultProxy) -> bool:
        request = self._read_request()
        if request is None:
            return False
        method, target, version, headers, body = request
        decoded = urllib.parse.unquote(target)
        ranged = next((v for k, v in headers if k.lower() == "range"), None)
        delay, rule = proxy._match(method, decoded, body, ranged)
        if delay:
            proxy._sleep(delay)
        kind = rule.kind if rule is not None else None

        def record(status: int | None) -> None:
            proxy._record(Seen(method, decoded, status, kind, ranged))

        if kind == "stall" and not rule.nbytes:
            record(None)
            proxy._sleep(rule.seconds)
            raise _Abort
        if kind == "reset" and not rule.forward:
            record(None)
            self._reset()
        if kind == "status" and rule.instead_of is None:
            self._answer(rule, method, record)
            return True
        response = self._forward(proxy, method, target, headers, body)
        if kind == "status":  # instead_of: only in place of that answer
            if response.status == rule.instead_of:
                self._answer(rule, method, record)
                return True
            proxy._unapply(rule)
            kind = None
        if kind == "reset":  # forward=True: the server did it, the client never hears
            record(None)
            self._reset()
        if kind in ("truncate", "stall"):
            record(response.status)
            self._send(response.head_bytes(), response.body[: rule.nbytes])
            if kind == "stall":
                proxy._sleep(rule.seconds)
                raise _Abort
            if rule.rst:
                self._reset()
            raise _Abort
        if kind == "short":
            cut = response.body[: rule.nbytes]
            record(response.status)
            self._send(response.head_bytes(content_length=len(cut)), cut)
            return True
        record(response.status)
        self._send(response.head_bytes(), b"" if method == "HEAD" else response.body)
        closing = any(k.lower() == "connection" and v.lower() == "close" for k, v in headers)
        return not closing and version != "HTTP/1.0"

    def _answer(self, rule: Rule, method: str, record: Callable[[int | None], None]) -> None:
        """Send the answer of a ``status`` rule."""
        payload = rule.body if rule.body is not None else f"fault-proxy: {rule.status}\n".encode()
        response = _Response(
            rule.status,
            http.client.responses.get(rule.status, "Error"),
            [*rule.headers.items(), ("Content-Length", str(len(payload)))],
            payload,
        )
        # before the client can see the answer: the log is complete when it does
        record(rule.status)
        self._send(response.head_bytes(), b"" if method == "HEAD" else payload)

    def _send(self, head: bytes, body: bytes) -> None:
        if len(body) <= 65536:
            self.wfile.write(head + body)  # one send for small answers
        else:
            self.wfile.write(head)
            self.wfile.write(body)
        self.wfile.flush()

    def _reset(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.close()  # with linger 0: RST, not FIN
        raise _Abort


class FaultProxy:
    """An HTTP proxy on ``host`` (default 127.0.0.1, a free port) in front of ``target_host:target_port``.

    ``start()``/``stop()`` or a ``with`` block; :attr:`url` is what clients use as their
    endpoint. Faults are added and removed at any time, also while requests are in flight.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        host: str = "127.0.0.1",
        port: int = 0,
        upstream_timeout: float = 60.0,
    ):
        self.target_host, self.target_port = target_host, int(target_port)
        self.host, self.port = host, port
        self.upstream_timeout = upstream_timeout
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._log: list[Seen] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()

    @classmethod
    def to_url(cls, url: str, **kwargs: Any) -> FaultProxy:
        """A proxy in front of ``http://host:port`` (an endpoint URL)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"the proxy needs an http://host:port endpoint, not {url!r}")
        return cls(parts.hostname, parts.port, **kwargs)

    # -- lifecycle -----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def target_url(self) -> str:
        return f"http://{self.target_host}:{self.target_port}"

    def start(self) -> FaultProxy:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server((self.host, self.port), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fault-proxy",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and close every client connection (stalls end at once)."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ----------------------------------------------------------------------------------------
    def inject(
        self,
        kind: str,
        *,
        method: str | None = None,
        path: str | None = None,
        after: int = 0,
        times: int | None = None,
        probability: float | None = None,
        seed: int = 0,
        seconds: float = 0.0,
        status: int = 503,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        nbytes: int = 0,
        forward: bool = False,
        rst: bool = False,
        content: bytes | str | None = None,
        callback: Callable[[Seen], None] | None = None,
        instead_of: int | None = None,
    ) -> Rule:
        """Add a fault (see the module's documentation); returns its :class:`Rule` (live counters)."""
        rule = Rule(
            kind,
            method=method,
            path=path,
            after=after,
            times=times,
            probability=probability,
            seed=seed,
            seconds=seconds,
            status=status,
            body=body,
            headers=dict(headers or {}),
            nbytes=nbytes,
            forward=forward,
            rst=rst,
            content=content,
            callback=callback,
            instead_of=instead_of,
        )
        rule._proxy = self
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: Rule) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        """Remove every fault (the request log stays)."""
        with self._lock:
            self._rules.clear()

    @contextlib.contextmanager
    def fault(self, kind: str, **kwargs: Any) -> Iterator[Rule]:
        """``with proxy.fault("status", status=503, times=2) as rule:`` the fault holds inside the block only."""
        rule = self.inject(kind, **kwargs)
        try:
            yield rule
        finally:
            self.remove(rule)

    # -- what happened ----------------------------------------------------------------------------------
    @property
    def log(self) -> list[Seen]:
        """Every request handled so far, in order."""
        with self._lock:
            return list(self._log)

    def count(
        self, method: str | None = None, path: str | None = None, fault: str | None = None
    ) -> int:
        """Requests seen with this method (any if None) whose decoded target matches ``path`` (a regex)."""
        pattern = re.compile(path) if path is not None else None
        return sum(
            1
            for s in self.log
            if (method is None or s.method == method.upper())
            and (pattern is None or pattern.search(s.target))
            and (fault is None or s.fault == fault)
        )

    def reset_log(self) -> None:
        with self._lock:
            self._log.clear()

    # -- used by the handler ----------------------------------------------------------------------------
    def _match(
        self, method: str, target: str, body: bytes, ranged: str | None = None
    ) -> tuple[float, Rule | None]:
        delay, chosen, fired = 0.0, None, []
        with self._lock:
            for rule in self._rules:
                if rule.kind == "delay":
                    if rule._fires(method, target, body):
                        delay += rule.seconds
                        fired.append(rule)
                elif chosen is None and rule._fires(method, target, body):
                    chosen = rule
                    fired.append(rule)
        for rule in fired:  # outside the lock: a callback may inject or remove faults
            if rule.callback is not None:
                rule.callback(Seen(method, target, None, rule.kind, ranged))
        return delay, chosen

    def _unapply(self, rule: Rule) -> None:
        """A ``status`` rule with ``instead_of`` that found another answer: not applied after all."""
        with self._lock:
            rule.applied -= 1

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self._log.append(seen)

    def _sleep(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # a stall ends when the proxy stops

    def _rewrite_location(self, value: str) -> str:
        """Redirects and upload sessions that point at the server point at the proxy instead."""
        if self._server is None:
            return value
        for origin in (self.target_url, f"http://localhost:{self.target_port}"):
            if value.startswith(origin):
                return self.url + value[len(origin) :]
        return value

    def _opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.add(conn)

    def _closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)


def main() -> None:  # pragma: no cover - a manual tool
    """``python tests/remote/proxy.py http://127.0.0.1:9000 [--delay 0.05]``: a proxy until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("target")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to every request")
    args = parser.parse_args()
    with FaultProxy.to_url(args.target, port=args.port) as proxy:
        if args.delay:
            proxy.inject("delay", seconds=args.delay)
        print(proxy.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":  # pragma: no cover
    main()
