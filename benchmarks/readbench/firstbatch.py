"""What shardstream's first batch waits for, read from SeaweedFS: every request with its times and bytes.

Run (after ``read.py`` has converted the data, e.g. ``read.py --remote seaweedfs``)::

    .venv-bench/bin/python benchmarks/readbench/firstbatch.py [--data bench-data] [--count 20000]

It starts ``weed mini`` (:class:`_remote.RemoteSeaweed`, no latency proxies), uploads the shardstream
pack, puts a recording :class:`FaultProxy` (``tests/remote/proxy.py``) in a thread of this process
in front of it, and reads from the proxy with the benchmark's loader (2 workers, batches of 64, an
empty cache). Each request is logged with its start and end (seconds from creating the iterator,
as the benchmark's TTFB), method, object, Range header, status and response bytes; the output is the
log up to the first batch, a summary (requests and bytes before it, by kind) and the totals of the epoch.
The proxy buffers each response whole (a first byte waits for the last one) and shares this process's
GIL with the main process of the loader, which mostly waits on its workers' queue meanwhile.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
if str(BENCH) not in sys.path:
    # _remote, _data, pack and readbench as the benchmark imports them
    sys.path.insert(0, str(BENCH))

from _data import DEFAULT_DATA_DIR, FULL_COUNT, set_root  # noqa: E402
from _remote import RemoteSeaweed  # noqa: E402

from readbench.tools.base import RemoteSource  # noqa: E402
from readbench.tools.shardstream import loader  # noqa: E402

LOG: list[dict[str, Any]] = []
_LOCK = threading.Lock()
T0 = [0.0]
ADDED = [0.0]  # the proxy's delay, slept before forwarding: counted into each request's time


def record_requests() -> None:
    """Wrap the proxy's forwarding so that every request is logged with its times and response bytes."""
    from tests.remote import proxy as proxy_module

    forward = proxy_module._Handler._forward

    def timed(
        self: Any, proxy: Any, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Any:
        start = time.perf_counter() - ADDED[0]
        response = forward(self, proxy, method, target, headers, body)
        end = time.perf_counter()
        ranged = next((v for k, v in headers if k.lower() == "range"), None)
        with _LOCK:
            LOG.append(
                {
                    "start": start,
                    "end": end,
                    "method": method,  # absolute: made relative in main()
                    "target": urllib.parse.unquote(target),
                    "range": ranged,
                    "status": response.status,
                    "bytes": len(response.body),
                    "thread": threading.get_ident(),
                }
            )
        return response

    proxy_module._Handler._forward = timed


def kind(entry: dict[str, Any]) -> str:
    """A request's kind: ``GET ranged``, ``GET whole``, ``HEAD``, ``LIST``..."""
    if (
        "list-type" in entry["target"]
        or entry["target"].rstrip("/").count("/") <= 1
        and entry["method"] == "GET"
    ):
        return f"{entry['method']} list"
    if entry["method"] == "GET":
        return "GET ranged" if entry["range"] else "GET whole"
    return entry["method"]


def summary(entries: list[dict[str, Any]]) -> str:
    by: dict[str, list[int]] = {}
    for e in entries:
        n = by.setdefault(kind(e), [0, 0])
        n[0], n[1] = n[0] + 1, n[1] + e["bytes"]
    total = sum(e["bytes"] for e in entries)
    parts = ", ".join(f"{k} {n}x {b / 1e6:,.2f} MB" for k, (n, b) in sorted(by.items()))
    return f"{len(entries)} requests, {total / 1e6:,.2f} MB ({parts})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--count", type=int, default=FULL_COUNT)
    parser.add_argument(
        "--rows", type=int, default=40, help="log rows printed before the first batch"
    )
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds the proxy adds to every request"
    )
    args = parser.parse_args(argv)
    pack = set_root(args.data, args.count) / "read" / "shardstream"
    if not pack.is_dir():
        raise SystemExit(
            f"no shardstream pack in {pack}: run read.py --remote seaweedfs --count {args.count} first"
        )
    from tests.remote.proxy import FaultProxy

    record_requests()
    scratch = Path(tempfile.mkdtemp(prefix="firstbatch-"))
    try:
        with RemoteSeaweed(latencies=()) as remote:
            upload = remote.upload(pack, "shardstream")
            print(
                f"uploaded {upload.files} objects, {upload.nbytes / 1e6:,.1f} MB to weed mini at "
                f"{remote.endpoint_url}",
                flush=True,
            )
            with FaultProxy.to_url(remote.endpoint_url) as proxy:
                if args.latency > 0:
                    proxy.inject("delay", seconds=args.latency)  # every request
                    ADDED[0] = args.latency
                source = RemoteSource(proxy.url, remote.bucket, scratch)
                T0[0] = time.perf_counter()
                # its requests get negative times: setup, as in read.py
                made = loader(pack, "raw", source)
                setup = time.perf_counter() - T0[0]
                T0[0] = time.perf_counter()
                it = iter(made)
                first = next(it)
                ttfb = time.perf_counter() - T0[0]
                del first
                batches = 1 + sum(1 for _ in it)
                epoch = time.perf_counter() - T0[0]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    entries = sorted(
        ({**e, "start": e["start"] - T0[0], "end": e["end"] - T0[0]} for e in LOG),
        key=lambda e: e["start"],
    )
    before = [e for e in entries if e["end"] <= ttfb]
    print(
        f"setup (the loader made) {setup:.3f} s, then the first batch after {ttfb:.3f} s "
        f"(+{args.latency * 1000:g} ms per request); epoch {epoch:.2f} s, "
        f"{batches} batches"
    )
    print(f"{'start s':>8} {'end s':>8} {'ms':>6}  {'MB':>7}  request")
    shown = [e for e in entries if e["start"] <= ttfb]
    for e in shown[: args.rows]:
        mark = "" if e["end"] <= ttfb else "  (ends after the first batch)"
        print(
            f"{e['start']:8.3f} {e['end']:8.3f} {(e['end'] - e['start']) * 1000:6.0f}  {e['bytes'] / 1e6:7.3f}  "
            f"{e['method']} {e['target']} {e['range'] or ''} -> {e['status']}{mark}"
        )
    if len(shown) > args.rows:
        print(f"... {len(shown) - args.rows} more requests started before the first batch")
    print(f"finished before the first batch: {summary(before)}")
    started = [e for e in entries if e["start"] <= ttfb and e["end"] > ttfb]
    if started:
        print(f"started before it, finished after: {summary(started)}")
    print(f"whole epoch: {summary(entries)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
