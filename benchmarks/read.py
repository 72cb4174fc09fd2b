"""Read benchmark: shardstream vs. webdataset, mosaicml-streaming and litdata on the same 20,000 JPEGs.

It needs its own environment, ``.venv-bench`` (git-ignored), because mosaicml-streaming and
litdata pull torchvision and with it a newer torch with CUDA wheels (several GB); the
project's ``.venv`` is never touched. Create it once from the repository root::

    python3 -m venv .venv-bench && .venv-bench/bin/pip install -r benchmarks/requirements-bench.txt \\
        && .venv-bench/bin/pip install -e .

(shardstream's torch requirement is a range, so the editable install keeps the newer torch.) Then::

    .venv-bench/bin/python benchmarks/read.py                        # everything, 3 runs each
    .venv-bench/bin/python benchmarks/read.py --repeat 5 --json read-results.json
    .venv-bench/bin/python benchmarks/read.py --tools shardstream,webdataset --modes raw,pillow --count 2000
    PYTHONPATH=/tmp/snapshot .venv-bench/bin/python benchmarks/read.py   # another shardstream source tree

The children import shardstream as the environment resolves it (the editable install, or a
``PYTHONPATH`` snapshot such as ``git archive HEAD shardstream | tar -x -C /tmp/snapshot``);
the machine line names that path and a digest of its sources.

Data. The JPEG set of ``benchmarks/_data.py`` (``bench-data/train``, generated on first use) is
converted once per tool into ``<set>/read/<tool>/``, untimed, and reused while its marker
``<set>/read/<tool>.json`` matches: shardstream ``pack --shard-size 64MB`` (tar shards);
webdataset reads those same tars (they are WebDataset tars, so both read identical bytes);
mosaicml-streaming ``MDSWriter`` (columns ``jpg: bytes``, ``cls: int``, ``size_limit`` 64 MB);
litdata ``optimize`` (the same two fields, ``chunk_bytes`` 64 MB). A tool that cannot be
imported or fails to convert is reported and left out; the others still run.
Every converted file is read once, untimed, before the timed runs (a warm page cache).

Modes (each run is a fresh subprocess; runs are interleaved, rotating which goes first):

- ``raw``: one epoch of undecoded bytes, 2 DataLoader workers, batches of 64. The main process
  takes every ``jpg`` value as a bytes-like object (so a batch of mere locations pays for reading
  them) and the total is checked against the JPEG bytes on disk. Every tool has its own shuffle
  on: shardstream permutes shards and shuffles within windows of about four shards; webdataset
  ``shardshuffle`` plus ``.shuffle(1000)``; mosaic ``shuffle=True`` (its default ``py1e``
  algorithm); litdata ``shuffle=True`` (chunk order plus in-chunk blocks).
- ``pillow``: the same, decoding each JPEG with Pillow to a uint8 CHW tensor. shardstream uses
  ``decode="torch"`` in a process where ``import simplejpeg`` fails, so it takes its Pillow path;
  the others decode with the same code (``Image.open(...).convert("RGB")`` -> tensor) in their map.
- ``fast``: the same with simplejpeg (shardstream's default decoder when it is installed).
- ``limit``: the decode limit: Pillow (and simplejpeg) decode rate of the same JPEGs in one
  process, in a loop, from bytes in memory; the limit is that rate x the number of cores. The
  same loop in one process per core at once is reported too: what the cores really give together.
- ``memory``: shardstream, 3 epochs with persistent workers (simplejpeg decode); RSS after each.
- ``arrow``: a numeric table (2,000,000 rows x 8 float32 columns + an int64 label, Parquet)
  packed into Arrow shards; pyarrow's own read of those shard files into numpy vs. iterating
  ``ShardDataset(decode=None, shuffle=False, batch_size=4096)`` in-process.

``limit`` runs whatever ``--tools`` says; ``memory`` and ``arrow`` need shardstream among them.

Measured: samples/s over the epoch (from creating the loader's iterator to its last batch; the
best and median of the runs), the steady rate after the first batch (best run), time to first
batch (TTFB, from creating the iterator to the first batch; median), and peak RSS of the process
tree (main process and workers summed, sampled from /proc every 50 ms by this script, outside the
measured processes; a summed RSS counts shared pages, such as memory-mapped shards, once per
process; "anon" is the anonymous part alone). Before each run the script waits (``--quiet-wait``)
until other processes leave the CPUs, and it flags runs during which they did not. The issue's
targets are printed as met or missed. This is a benchmark, not a test: timings are reported, never
asserted; the exit status is non-zero only when a run fails or reads the wrong data.

Remote mode (``--remote s3``): the same converted data, read from object storage::

    .venv-bench/bin/python benchmarks/read.py --remote s3 --tools shardstream,webdataset,mosaic --modes raw
    .venv-bench/bin/python benchmarks/read.py --remote s3 --count 2000 --repeat 1     # a quick try
    .venv-bench/bin/python benchmarks/read.py --remote s3 --modes raw,pillow,fast --latency 0.1

It needs ``s3fs`` and ``moto[server]`` in ``.venv-bench`` (``requirements-bench.txt``) and
``tests/remote/`` of this repository (the moto endpoint and the fault proxy). The script starts a moto
S3 server in a process of its own on 127.0.0.1 (a free port, in-memory, dummy credentials in the
environment of every child), uploads each tool's converted folder into one bucket once (untimed, one PUT
per file), and starts two proxy processes (``FaultProxy`` of ``tests/remote/proxy.py``) in front of it:
one forwarding as is, one adding ``--latency`` (default 50 ms) to every request. Each loader mode then
runs for each tool at three places: ``@s3`` (moto directly), ``@s3 proxy`` and ``@s3 +50ms``; ``--modes``
defaults to ``raw`` and takes the loader modes only. Every run gets an empty scratch folder (removed
afterwards) for the tools' local caches, so every epoch starts cold and downloads everything, and its
TTFB includes the first downloads:

- shardstream: ``ShardDataset("s3://BUCKET/shardstream", storage_options={"endpoint_url": ...},
  cache_dir=<scratch>)`` with its default prefetch, retries and timeout; then a second epoch in the same
  process from the now warm local cache, reported apart (not in the table's rates);
- webdataset: the same tars as ``s3://`` URLs, opened through an fsspec (s3fs) handler registered in
  ``webdataset.gopen_schemes["s3"]`` (webdataset 1.0.2 has none of its own);
- mosaic: ``StreamingDataset(remote="s3://BUCKET/mosaic", local=<scratch>)``, its boto3 client pointed at
  the endpoint by ``S3_ENDPOINT_URL``; the client its constructor used (for ``index.json``) is dropped
  before the DataLoader forks, because streaming 0.13.0 lets forked workers share its kept-alive
  connection (crossed responses: 60 s stalls and corrupt shards through the proxy; moto itself closes
  every connection, so direct reads never show it);
- litdata: ``StreamingDataset("s3://BUCKET/litdata", storage_options={"endpoint_url": ...})``; litdata
  0.2.76 cannot read a plain-http endpoint (its obstore client refuses the scheme), which is tried once
  and reported as such, not as a failure.

The table adds each rate over webdataset's at the same place; a second table gives each tool's best rate
at the three places, the rate with the added latency over the rate through the plain proxy (only the
latency differs; the issue's target) and over the direct one, and the median TTFBs. The CPU seconds that
moto and the proxies use during each run are measured from /proc and reported; they are not counted as
other processes' load. Targets (issue 4, item 6): raw bytes from S3 >= 3x webdataset; TTFB <= 1 s;
with the added latency, >= 80% of the rate without. Caveats: moto is a single Python process on the same
2 cores as the readers, so serving competes with reading for CPU, and it copies a whole object for each
ranged GET (a tool that reads an object in parts pays for that); the proxies are Python processes that
buffer each response whole; a real S3 has other latency, bandwidth and parallelism (and charges per
request), so the rates say how the tools compare against this endpoint, not what they reach on S3.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _data import DEFAULT_DATA_DIR, FULL_COUNT, IMAGE_SIZE, ImageSet, ensure_image_folder, set_root, warm_page_cache
from pack import machine as pack_machine
from pack import shardstream_command

if TYPE_CHECKING:
    import torch
    from _remote import RemoteS3

TOOLS = ("shardstream", "webdataset", "mosaic", "litdata")
LOADER_MODES = ("raw", "pillow", "fast")
MODES = (*LOADER_MODES, "limit", "memory", "arrow")
BATCH_SIZE = 64
WORKERS = 2
SHARD_SIZE = "64MB"
SHARD_BYTES = 64_000_000
WDS_SHUFFLE_BUFFER = 1000
MEMORY_EPOCHS = 3
MEMORY_GROWTH_LIMIT = 0.05  # RSS after the last epoch at most 5% above the first's counts as "no growth"
ARROW_ROWS = 2_000_000
ARROW_FLOAT_COLUMNS = 8
ARROW_BATCH = 4096
ARROW_SEED = 7
LIMIT_IMAGES = 4000
SAMPLE_INTERVAL = 0.05  # seconds between RSS samples of a running child
QUIET_CORES = 0.2  # before each run, wait until other processes use less than this many cores
QUIET_PROBE, QUIET_RETRY = 0.5, 5.0  # seconds: how long one load probe lasts, and the pause between probes
NOISY_CORES = 0.1  # a run during which other processes used more than this is flagged
LOCAL = "local"  # where a job reads: converted data on local disk, or a place of _remote.RemoteS3
READ_DATA_VERSION = 1  # bump when a conversion changes, so old conversions are redone
RESULT_PREFIX = "RESULT="

# The targets.
RAW_RATE_TARGET = 50_000.0
RAW_VS_OTHERS_TARGET = 3.5
PILLOW_VS_LIMIT_TARGET = 0.85
PILLOW_VS_WDS_TARGET = 1.5
FAST_VS_WDS_PILLOW_TARGET = 2.5
TTFB_TARGET = 0.3
ARROW_VS_PYARROW_TARGET = 2.0
# ...and for --remote s3 (issue 4, item 6).
REMOTE_RAW_VS_WDS_TARGET = 3.0
REMOTE_TTFB_TARGET = 1.0
ADDED_LATENCY = 0.05  # seconds the proxy adds to every request
LATENCY_RATIO_TARGET = 0.8  # throughput with the added latency / without
REMOTE_CAVEATS = (
    "moto is one Python process on the same cores as the readers, so serving competes with reading for CPU, and "
    "it copies a whole object for every ranged GET; the proxy is another Python process and buffers each response "
    "whole; a real S3 has other latency, bandwidth and parallelism, so absolute rates here say little about S3.")

SHUFFLES = {
    "shardstream": "shard permutation + index shuffle in windows of ~4 shards",
    "webdataset": f"shardshuffle + .shuffle({WDS_SHUFFLE_BUFFER})",
    "mosaic": "shuffle=True (py1e, default block size)",
    "litdata": "shuffle=True (chunk order + in-chunk blocks)",
}


# -- memory of a process tree --------------------------------------------------------------


def _status(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, RSS bytes, anonymous RSS bytes) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except OSError:
        return None
    ppid = rss = anon = 0
    for line in text.split(b"\n"):
        if line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(b"VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"RssAnon:"):
            anon = int(line.split()[1]) * 1024
    return ppid, rss, anon


def descendants(root: int) -> list[int]:
    """``root`` and every process under it (a scan of /proc).

    Only processes with a larger pid than ``root`` are read: descendants are started after it
    (barring pid wrap-around), which keeps a scan cheap enough to repeat every 50 ms.
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) > root:
            status = _status(int(entry.name))
            if status is not None:
                children.setdefault(status[0], []).append(int(entry.name))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def tree_memory(pids: Iterable[int]) -> tuple[int, int, int]:
    """(RSS, anonymous RSS, processes alive) of ``pids``, summed."""
    rss = anon = count = 0
    for pid in pids:
        status = _status(pid)
        if status is not None:
            rss, anon, count = rss + status[1], anon + status[2], count + 1
    return rss, anon, count


class TreeSampler:
    """Peak memory of a process tree, summed over its processes at each sample."""

    def __init__(self, root: int):
        self.root = root
        self.peak_rss = self.peak_anon = self.peak_processes = 0

    def sample(self) -> None:
        rss, anon, processes = tree_memory(descendants(self.root))
        if rss > self.peak_rss:
            self.peak_rss, self.peak_processes = rss, processes
        self.peak_anon = max(self.peak_anon, anon)


# -- decoding, as the other tools' users would write it (shardstream.decode does the same) ---


def pil_chw(data: bytes) -> torch.Tensor:
    """A JPEG as a uint8 CHW RGB tensor, decoded by Pillow."""
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return torch.from_numpy(np.asarray(image.convert("RGB"))).permute(2, 0, 1)


def simplejpeg_chw(data: bytes) -> torch.Tensor:
    """A JPEG as a uint8 CHW RGB tensor, decoded by simplejpeg."""
    import simplejpeg
    import torch

    return torch.from_numpy(simplejpeg.decode_jpeg(data, colorspace="RGB")).permute(2, 0, 1)


def image_decoder(mode: str) -> Callable[[bytes], Any] | None:
    return {"raw": None, "pillow": pil_chw, "fast": simplejpeg_chw, "memory": simplejpeg_chw}[mode]


class DecodeSample:
    """A picklable per-sample transform: decode the ``jpg`` field of a dict sample."""

    def __init__(self, decode: Callable[[bytes], Any]):
        self.decode = decode

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return {**sample, "jpg": self.decode(sample["jpg"])}


# -- data conversion (untimed, cached) -----------------------------------------------------


def labelled_files(images: ImageSet) -> list[tuple[str, int]]:
    """(path, class index) of every image, in sorted (class, name) order, as shardstream packs them."""
    index = {name: i for i, name in enumerate(images.classes)}
    return [(str(p), index[p.parent.name]) for p in images.files()]


def write_mosaic(images: ImageSet, out: Path) -> None:
    from streaming import MDSWriter

    with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit=SHARD_BYTES) as writer:
        for path, label in labelled_files(images):
            writer.write({"jpg": Path(path).read_bytes(), "cls": label})


def litdata_sample(item: tuple[str, int]) -> dict[str, Any]:
    path, label = item
    return {"jpg": Path(path).read_bytes(), "cls": label}


def write_litdata(images: ImageSet, out: Path) -> None:
    from litdata import optimize

    optimize(fn=litdata_sample, inputs=labelled_files(images), output_dir=str(out), chunk_bytes=SHARD_SIZE,
             num_workers=WORKERS, reorder_files=False, verbose=False)


def write_table(out: Path, rows: int) -> None:
    """``rows`` x ``ARROW_FLOAT_COLUMNS`` float32 columns and an int64 label, as one Parquet file."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(ARROW_SEED)
    columns: dict[str, Any] = {f"x{i}": rng.standard_normal(rows, dtype=np.float32) for i in range(ARROW_FLOAT_COLUMNS)}
    columns["label"] = rng.integers(0, 1000, rows, dtype=np.int64)
    out.mkdir(parents=True)
    pq.write_table(pa.table(columns), out / "table.parquet")


@dataclass
class Conversion:
    """One tool's converted copy of the data, under ``<set>/read/<name>/``."""

    name: str
    path: Path
    seconds: float = 0.0
    nbytes: int = 0
    files: int = 0
    reused: bool = False
    problem: str | None = None


def folder_size(path: Path) -> tuple[int, int]:
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def conversion_argv(name: str, images: ImageSet, read_root: Path, args: argparse.Namespace) -> list[str]:
    out = read_root / name
    if name == "shardstream":
        return [*shardstream_command(), "pack", str(images.train), str(out), "--shard-size", SHARD_SIZE,
                "--overwrite", "-q"]
    if name == "arrow":
        return [*shardstream_command(), "pack", str(read_root / "table" / "table.parquet"), str(out),
                "--shard-size", SHARD_SIZE, "--overwrite", "-q"]
    return [sys.executable, str(Path(__file__).resolve()), "--convert", name, "--data", str(args.data),
            "--count", str(images.count), "--arrow-rows", str(args.arrow_rows)]


def convert(name: str, images: ImageSet, read_root: Path, args: argparse.Namespace) -> Conversion:
    """The tool's copy of the data: reused when its marker matches, else written now (untimed)."""
    out = read_root / name
    marker = read_root / f"{name}.json"
    expected = {"count": images.count, "version": READ_DATA_VERSION,
                "rows": args.arrow_rows if name in ("table", "arrow") else None}
    try:
        doc = json.loads(marker.read_text())
        if {k: doc.get(k) for k in expected} == expected and out.is_dir():
            return Conversion(name, out, doc["seconds"], doc["bytes"], doc["files"], reused=True)
    except (OSError, ValueError, KeyError):
        pass
    marker.unlink(missing_ok=True)
    shutil.rmtree(out, ignore_errors=True)
    read_root.mkdir(parents=True, exist_ok=True)
    print(f"converting for {name} into {out} ...", flush=True)
    started = time.perf_counter()
    proc = subprocess.run(conversion_argv(name, images, read_root, args), capture_output=True, text=True,
                          env=child_env())
    seconds = time.perf_counter() - started
    if proc.returncode != 0 or not out.is_dir():
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        return Conversion(name, out, seconds, problem=f"conversion failed (exit {proc.returncode}): {tail}")
    nbytes, files = folder_size(out)
    marker.write_text(json.dumps({**expected, "seconds": round(seconds, 2), "bytes": nbytes, "files": files}) + "\n")
    return Conversion(name, out, seconds, nbytes, files)


def child_convert(name: str, images: ImageSet, read_root: Path, rows: int) -> None:
    out = read_root / name
    if name == "mosaic":
        write_mosaic(images, out)
    elif name == "litdata":
        write_litdata(images, out)
    elif name == "table":
        write_table(out, rows)
    else:
        raise SystemExit(f"no conversion named {name!r}")


# -- loaders (built in the measured subprocess) --------------------------------------------


@dataclass(frozen=True)
class RemoteSource:
    """Where a remote run reads (``--remote``): an S3 endpoint (moto or a proxy to it), a bucket, and an
    empty scratch folder of this run for the tools' local caches, removed after the run."""

    endpoint: str
    bucket: str
    scratch: Path

    def url(self, prefix: str, name: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}" + (f"/{name}" if name else "")


def shardstream_loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    from shardstream import ShardDataset

    decode = None if mode == "raw" else "torch"
    if remote is None:
        dataset = ShardDataset(str(data), shuffle=True, seed=0, decode=decode)
    else:  # a fresh, empty cache: the epoch downloads every shard (default prefetch, retries and timeout)
        dataset = ShardDataset(remote.url("shardstream"), storage_options={"endpoint_url": remote.endpoint},
                               cache_dir=str(remote.scratch / "cache"), shuffle=True, seed=0, decode=decode)
    return dataset.loader(batch_size=BATCH_SIZE, num_workers=WORKERS)


class FsspecOpener:
    """A ``webdataset.gopen_schemes`` handler for ``s3://`` URLs through fsspec (s3fs) at ``endpoint``.

    webdataset 1.0.2 has no ``s3://`` handler of its own; this is what its users register.
    """

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kwargs: Any) -> Any:
        import fsspec

        return fsspec.open(url, mode, endpoint_url=self.endpoint).open()


def webdataset_loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    import webdataset as wds

    urls = sorted(str(p) for p in data.glob("*.tar"))
    if remote is not None:  # the same tars, in the bucket
        wds.gopen_schemes["s3"] = FsspecOpener(remote.endpoint)
        urls = [remote.url("shardstream", Path(u).name) for u in urls]
    dataset = wds.WebDataset(urls, shardshuffle=len(urls), seed=0, empty_check=False)  # a worker may get no shard
    dataset = dataset.shuffle(WDS_SHUFFLE_BUFFER).to_tuple("jpg", "cls")
    decode = image_decoder(mode)
    if decode is not None:
        dataset = dataset.map_tuple(decode, int)
    return wds.WebLoader(dataset.batched(BATCH_SIZE), batch_size=None, num_workers=WORKERS)


def mosaic_loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    decode = image_decoder(mode)

    class Decoded(StreamingDataset):
        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            sample = super().get_item(sample_id, retry)
            return sample if decode is None else {"jpg": decode(sample["jpg"]), "cls": sample["cls"]}

    if remote is None:
        dataset = Decoded(local=str(data), batch_size=BATCH_SIZE, shuffle=True, shuffle_seed=0)
    else:  # its boto3 client takes the endpoint from S3_ENDPOINT_URL; a fresh, empty local folder
        os.environ["S3_ENDPOINT_URL"] = remote.endpoint
        dataset = Decoded(remote=remote.url("mosaic"), local=str(remote.scratch / "mosaic"), batch_size=BATCH_SIZE,
                          shuffle=True, shuffle_seed=0)
        # streaming 0.13.0 keeps the boto3 client that fetched index.json here, and forked workers inherit it:
        # they share its kept-alive connection, their responses cross (a request waits out its 60 s timeout, or a
        # shard arrives corrupt). moto closes every connection, so only the proxy, like S3, shows it. Drop it.
        for stream in dataset.streams:
            stream._downloader.clean_up()
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS)


def litdata_loader(data: Path, mode: str, remote: RemoteSource | None = None) -> Any:
    from litdata import StreamingDataLoader, StreamingDataset

    decode = image_decoder(mode)
    transform = None if decode is None else DecodeSample(decode)
    if remote is None:
        dataset = StreamingDataset(input_dir=str(data), shuffle=True, seed=0, transform=transform)
    else:
        dataset = StreamingDataset(input_dir=remote.url("litdata"), cache_dir=str(remote.scratch / "litdata"),
                                   storage_options={"endpoint_url": remote.endpoint}, shuffle=True, seed=0,
                                   transform=transform)
    return StreamingDataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS)


LOADERS: dict[str, Callable[[Path, str, RemoteSource | None], Any]] = {
    "shardstream": shardstream_loader, "webdataset": webdataset_loader,
    "mosaic": mosaic_loader, "litdata": litdata_loader,
}
DATA_OF = {"shardstream": "shardstream", "webdataset": "shardstream", "mosaic": "mosaic", "litdata": "litdata"}


def batch_length(batch: Any) -> int:
    """Samples in a batch: a dict (its first field not named ``__...``) or a tuple (its last field)."""
    if isinstance(batch, dict):
        values = [v for k, v in batch.items() if not str(k).startswith("__")]
        return len(values[0])
    return len(batch[-1])


def describe_batch(batch: Any) -> str:
    """What a batch holds, e.g. ``jpg: torch.uint8[64, 3, 256, 256], cls: list[bytes] x64``."""
    items = batch.items() if isinstance(batch, dict) else enumerate(batch)
    parts = []
    for name, value in items:
        if str(name).startswith("__"):
            continue
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            parts.append(f"{name}: {value.dtype}{list(value.shape)}")
        elif isinstance(value, (list, tuple)) and value:
            parts.append(f"{name}: list[{type(value[0]).__name__}] x{len(value)}")
        elif hasattr(value, "__len__"):
            parts.append(f"{name}: {type(value).__name__} x{len(value)}")
        else:
            parts.append(f"{name}: {type(value).__name__}")
    return ", ".join(parts)


def payload_bytes(batch: Any) -> int:
    """Bytes of the batch's undecoded ``jpg`` values, each taken as a bytes-like object (0 once decoded).

    Raw mode counts this inside the epoch, so every tool hands over usable bytes in the main
    process (a batch that holds only locations pays for reading them here), and the total is
    checked against the JPEG bytes on disk.
    """
    values = batch.get("jpg") if isinstance(batch, dict) else batch[0]
    if values is None or hasattr(values, "dtype"):
        return 0
    return sum(memoryview(v).nbytes for v in values)


def timed_epoch(loader: Iterable[Any]) -> dict[str, Any]:
    """One pass: seconds, samples, payload bytes, TTFB (from creating the iterator) and the first batch's shape."""
    started = time.perf_counter()
    it = iter(loader)
    first = next(it)
    ttfb = time.perf_counter() - started
    samples = first_samples = batch_length(first)
    payload = payload_bytes(first)
    described = describe_batch(first)
    del first
    for batch in it:
        samples += batch_length(batch)
        payload += payload_bytes(batch)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "samples": samples, "payload_bytes": payload, "ttfb": ttfb,
            "first_samples": first_samples, "first_batch": described}


def run_loader(tool: str, mode: str, read_root: Path, remote: RemoteSource | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    loader = LOADERS[tool](read_root / DATA_OF[tool], mode, remote)
    setup = time.perf_counter() - started
    epochs = []
    # remote shardstream: a second epoch from the local cache the first one filled (reported apart)
    count = MEMORY_EPOCHS if mode == "memory" else 2 if remote is not None and tool == "shardstream" else 1
    for epoch in range(count):
        if mode == "memory" or epoch > 0:
            loader.dataset.set_epoch(epoch)
        result = timed_epoch(loader)
        rss, anon, processes = tree_memory(descendants(os.getpid()))
        epochs.append({**result, "rss": rss, "anon": anon, "processes": processes})
    first = epochs[0]
    # In pillow mode `import simplejpeg` fails in this process and its workers (see child_run), so
    # shardstream cannot take its simplejpeg path there.
    decoder = {"raw": "none", "pillow": "Pillow", "fast": "simplejpeg", "memory": "simplejpeg"}[mode]
    keep = ("samples", "seconds", "payload_bytes", "first_samples", "ttfb", "first_batch")
    return {"rate": first["samples"] / first["seconds"], **{k: first[k] for k in keep}, "setup": setup,
            "decoder": decoder, "epochs": epochs,
            "warm_rate": epochs[1]["samples"] / epochs[1]["seconds"] if count == 2 else None}


def decode_loop(decode: Callable[[bytes], Any], blobs: list[bytes]) -> float:
    """Seconds to decode every blob, one after the other."""
    started = time.perf_counter()
    for blob in blobs:
        decode(blob)
    return time.perf_counter() - started


def run_limit(tool: str, images: ImageSet, count: int) -> dict[str, Any]:
    """Decode ``count`` of the JPEGs (spread over the set) in a loop in this one process.

    Also measured, for comparison with the limit (cores x this rate): the same loop in one
    process per core at once (forked), which shows what the cores really give together.
    """
    import multiprocessing

    files = images.files()
    step = max(len(files) // count, 1)
    blobs = [p.read_bytes() for p in files[::step][:count]]
    decode = {"pillow": pil_chw, "simplejpeg": simplejpeg_chw}[tool]
    decode(blobs[0])  # imports, outside the timed loop
    seconds = decode_loop(decode, blobs)
    n = cores()
    with multiprocessing.get_context("fork").Pool(n) as pool:
        pool.starmap(decode_loop, [(decode, blobs[:8])] * n)  # started and warm before the clock
        started = time.perf_counter()
        pool.starmap(decode_loop, [(decode, blobs)] * n)
        parallel = time.perf_counter() - started
    return {"rate": len(blobs) / seconds, "samples": len(blobs), "seconds": seconds, "ttfb": None,
            "decoder": tool, "parallel_processes": n, "parallel_rate": n * len(blobs) / parallel}


def run_arrow(tool: str, read_root: Path) -> dict[str, Any]:
    data = read_root / "arrow"
    if tool == "pyarrow":
        import pyarrow as pa
        import pyarrow.ipc

        files = sorted(data.glob("*.arrow"))
        started = time.perf_counter()
        rows = 0
        first_batch = ""
        for path in files:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
                arrays = [column.to_numpy() for column in table.columns]
                rows += table.num_rows
                first_batch = first_batch or ", ".join(f"{n}: {a.dtype}[{len(a)}]" for n, a in
                                                       zip(table.column_names, arrays))
        seconds = time.perf_counter() - started
        return {"rate": rows / seconds, "samples": rows, "seconds": seconds, "ttfb": None, "setup": 0.0,
                "first_batch": first_batch, "shards": len(files)}
    from shardstream import ShardDataset

    started = time.perf_counter()
    dataset = ShardDataset(str(data), decode=None, shuffle=False, batch_size=ARROW_BATCH)
    setup = time.perf_counter() - started
    result = timed_epoch(dataset)
    return {"rate": result["samples"] / result["seconds"], "setup": setup, **result}


def child_run(tool: str, mode: str, images: ImageSet, read_root: Path, args: argparse.Namespace) -> dict[str, Any]:
    if mode == "pillow":
        sys.modules["simplejpeg"] = None  # type: ignore[assignment]  # `import simplejpeg` fails: Pillow path
    if args.endpoint is not None:
        return run_loader(tool, mode, read_root, RemoteSource(args.endpoint, args.bucket, args.scratch))
    if mode == "limit":
        return run_limit(tool, images, args.limit_images)
    if mode == "arrow":
        return run_arrow(tool, read_root)
    return run_loader(tool, mode, read_root)


# -- running the children --------------------------------------------------------------------


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores, from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and its finished (waited-for) descendants."""
    import resource

    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def wait_for_quiet(max_wait: float) -> float:
    """Wait (at most ``max_wait`` s) until other processes use under ``QUIET_CORES``; the load last seen."""
    deadline = time.perf_counter() + max_wait
    announced = False
    while True:
        busy, own = busy_seconds(), own_seconds()
        time.sleep(QUIET_PROBE)
        load = max(busy_seconds() - busy - (own_seconds() - own), 0.0) / QUIET_PROBE
        if load < QUIET_CORES or time.perf_counter() >= deadline:
            return load
        if not announced:
            print(f"  (other processes use {load:.1f} cores; waiting up to {max_wait:.0f} s for a quiet machine)",
                  flush=True)
            announced = True
        time.sleep(QUIET_RETRY)


@dataclass
class Job:
    tool: str
    mode: str
    place: str = LOCAL  # or one of RemoteS3.places: read from the bucket directly or through a proxy

    @property
    def label(self) -> str:
        return f"{self.tool}/{self.mode}" + ("" if self.place == LOCAL else f" @{self.place}")


@dataclass
class Result:
    tool: str
    mode: str
    place: str = LOCAL
    runs: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unsupported: str | None = None  # a known limitation of the tool (litdata and plain-http endpoints), not a failure

    @property
    def ok(self) -> bool:
        return bool(self.runs) and not self.problems and self.unsupported is None

    @property
    def label(self) -> str:
        """The mode and, for remote runs, where it read from: ``raw`` or ``raw @s3 +50ms``."""
        return self.mode if self.place == LOCAL else f"{self.mode} @{self.place}"

    def medians(self, key: str) -> float | None:
        found = self.values(key)
        return statistics.median(found) if found else None

    def values(self, key: str) -> list[float]:
        return [r[key] for r in self.runs if r.get(key) is not None]

    @property
    def best(self) -> float:
        return max(self.values("rate"))

    @property
    def median(self) -> float:
        return statistics.median(self.values("rate"))

    @property
    def steady(self) -> float | None:
        """Best rate after the first batch: the epoch without the start-up that TTFB measures."""
        found = [(r["samples"] - r["first_samples"]) / (r["seconds"] - r["ttfb"]) for r in self.runs
                 if r.get("ttfb") is not None and r.get("first_samples") is not None and r["seconds"] > r["ttfb"]]
        return max(found) if found else None

    @property
    def ttfb(self) -> float | None:
        found = self.values("ttfb")
        return statistics.median(found) if found else None

    @property
    def peak_rss(self) -> int:
        return max(int(v) for v in self.values("peak_rss"))

    @property
    def peak_anon(self) -> int:
        return max(int(v) for v in self.values("peak_anon"))


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.pop("WDS_SEED", None)
    return env


class ChildFailed(RuntimeError):
    """A run's subprocess failed; ``output`` is all it wrote to stderr (or stdout)."""

    def __init__(self, message: str, output: str):
        super().__init__(message)
        self.output = output


def run_job(job: Job, args: argparse.Namespace, images: ImageSet, remote: RemoteS3 | None = None) -> dict[str, Any]:
    """Run one (tool, mode) in a fresh subprocess, sampling its process tree's memory; its result.

    A remote job gets its endpoint and an empty scratch folder (removed afterwards); the CPU
    time of the servers (moto, the proxies) during the run is measured apart from other load.
    """
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", job.tool, job.mode, "--data", str(args.data),
            "--count", str(images.count), "--limit-images", str(args.limit_images),
            "--arrow-rows", str(args.arrow_rows)]
    scratch = None
    if job.place != LOCAL:
        assert remote is not None
        scratch = Path(tempfile.mkdtemp(prefix="read-bench-"))
        argv += ["--endpoint", remote.endpoints[job.place], "--bucket", remote.bucket, "--scratch", str(scratch)]
    try:
        return _run_child(argv, args, remote)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run_child(argv: list[str], args: argparse.Namespace, remote: RemoteS3 | None) -> dict[str, Any]:
    load_before = wait_for_quiet(args.quiet_wait)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        servers_before = remote.server_cpu() if remote is not None else {}
        busy, own = busy_seconds(), own_seconds()
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=child_env())
        try:
            sampler = TreeSampler(proc.pid)
            while proc.poll() is None:
                sampler.sample()
                if time.perf_counter() - started > args.timeout:
                    raise RuntimeError(f"timed out after {args.timeout:.0f} s")
                time.sleep(SAMPLE_INTERVAL)
        finally:
            if proc.poll() is None:  # interrupted or timed out: no child left behind
                proc.kill()
                proc.wait()
        wall = time.perf_counter() - started
        servers_after = remote.server_cpu() if remote is not None else {}
        server_cpu = {name: servers_after[name] - servers_before.get(name, 0.0) for name in servers_after}
        other = max(busy_seconds() - busy - (own_seconds() - own) - sum(server_cpu.values()), 0.0)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-4:])
        raise ChildFailed(f"exit status {proc.returncode}: {tail}", stderr or stdout)
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    result.update(peak_rss=sampler.peak_rss, peak_anon=sampler.peak_anon, peak_processes=sampler.peak_processes,
                  wall=wall, other_cores=other / wall, other_cores_before=load_before, server_cpu=server_cpu)
    return result


def unsupported(job: Job, exc: Exception) -> str | None:
    """The known limitation behind a remote job's failure, if that is what it is."""
    if job.tool == "litdata" and job.place != LOCAL and "BadScheme" in getattr(exc, "output", str(exc)):
        return "cannot read a plain-http S3 endpoint (its obstore client refuses the scheme: BadScheme)"
    return None


def run_all(jobs: list[Job], args: argparse.Namespace, images: ImageSet, remote: RemoteS3 | None = None
            ) -> list[Result]:
    results = {job.label: Result(job.tool, job.mode, job.place) for job in jobs}
    for attempt in range(1, args.repeat + 1):
        print(f"run {attempt}/{args.repeat}", flush=True)
        shift = (attempt - 1) % len(jobs)  # interleaved, each round starting one job later
        for job in jobs[shift:] + jobs[:shift]:
            result = results[job.label]
            if result.problems or result.unsupported:
                continue
            try:
                run = run_job(job, args, images, remote)
            except (RuntimeError, OSError, ValueError) as exc:
                limitation = unsupported(job, exc)
                if limitation:  # tried once: the same holds at the other places (the proxies)
                    for other in results.values():
                        if (other.tool, other.mode) == (job.tool, job.mode) and not other.runs:
                            other.unsupported = limitation
                    print(f"  {job.label:<32} {limitation}", flush=True)
                    continue
                result.problems.append(str(exc))
                print(f"  {job.label:<32} FAILED: {exc}", flush=True)
                continue
            result.runs.append(run)
            expected = args.arrow_rows if job.mode == "arrow" else None if job.mode == "limit" else images.count
            if expected is not None and run["samples"] != expected:
                result.problems.append(f"read {run['samples']:,} samples, expected {expected:,}")
            if job.mode == "raw" and run["payload_bytes"] != images.total_bytes:
                result.problems.append(f"read {run['payload_bytes']:,} JPEG bytes, expected {images.total_bytes:,}")
            ttfb = f"  TTFB {run['ttfb']:.3f} s" if run.get("ttfb") is not None else ""
            noisy = f"  NOISY: others used {run['other_cores']:.2f} cores" if run["other_cores"] > NOISY_CORES else ""
            warm = f"  warm 2nd epoch {run['warm_rate']:,.0f}/s" if run.get("warm_rate") else ""
            servers = (f"  servers {sum(run['server_cpu'].values()):.1f} CPU s" if job.place != LOCAL else "")
            print(f"  {job.label:<32} {run['rate']:>10,.0f}/s  {run['samples']:,} in {run['seconds']:.2f} s{ttfb}"
                  f"  peak RSS {run['peak_rss'] / 2**20:,.0f} MiB{warm}{servers}{noisy}", flush=True)
    return list(results.values())


# -- reporting -----------------------------------------------------------------------------


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass
class Target:
    name: str
    goal: str
    value: str
    met: bool | None  # None: not measured (a tool or mode left out, or a run failed)

    @property
    def verdict(self) -> str:
        return "n/a" if self.met is None else "met" if self.met else "MISSED"


def find(results: list[Result], tool: str, mode: str, place: str = LOCAL) -> Result | None:
    for r in results:
        if r.tool == tool and r.mode == mode and r.place == place and r.ok:
            return r
    return None


def ratio_target(name: str, goal: str, top: Result | None, bottom: float | None, target: float,
                 what: str) -> Target:
    if top is None or not bottom:
        return Target(name, goal, "n/a", None)
    value = top.best / bottom
    return Target(name, goal, f"{value:.2f}x ({what})", value >= target)


def targets(results: list[Result]) -> list[Target]:
    out: list[Target] = []
    raw = find(results, "shardstream", "raw")
    out.append(Target("raw bytes", f">= {RAW_RATE_TARGET:,.0f} samples/s", f"{raw.best:,.0f} samples/s" if raw else
                      "n/a", None if raw is None else raw.best >= RAW_RATE_TARGET))
    others = [r for tool in TOOLS[1:] if (r := find(results, tool, "raw")) is not None]
    fastest = max(others, key=lambda r: r.best) if others else None
    out.append(ratio_target("raw bytes vs others", f">= {RAW_VS_OTHERS_TARGET:g}x the fastest of webdataset/mosaic/"
                            "litdata", raw, fastest.best if fastest else None, RAW_VS_OTHERS_TARGET,
                            f"vs {fastest.tool}" if fastest else ""))
    pillow = find(results, "shardstream", "pillow")
    loop = find(results, "pillow", "limit")
    limit = loop.best * cores() if loop else None
    out.append(ratio_target("Pillow decode vs decode limit", f">= {PILLOW_VS_LIMIT_TARGET:.0%} of {cores()} x the "
                            "1-process Pillow rate", pillow, limit, PILLOW_VS_LIMIT_TARGET,
                            f"limit {limit:,.0f}/s" if limit else ""))
    wds_pillow = find(results, "webdataset", "pillow")
    out.append(ratio_target("Pillow decode vs webdataset", f">= {PILLOW_VS_WDS_TARGET:g}x webdataset (Pillow)", pillow,
                            wds_pillow.best if wds_pillow else None, PILLOW_VS_WDS_TARGET, "both Pillow"))
    out.append(ratio_target("fast decoder vs webdataset", f">= {FAST_VS_WDS_PILLOW_TARGET:g}x webdataset (Pillow)",
                            find(results, "shardstream", "fast"), wds_pillow.best if wds_pillow else None,
                            FAST_VS_WDS_PILLOW_TARGET, "simplejpeg vs Pillow"))
    for mode in LOADER_MODES:
        r = find(results, "shardstream", mode)
        ttfb = r.ttfb if r else None
        out.append(Target(f"TTFB ({mode})", f"<= {TTFB_TARGET:g} s (median)",
                          "n/a" if ttfb is None else f"{ttfb:.3f} s", None if ttfb is None else ttfb <= TTFB_TARGET))
    memory = find(results, "shardstream", "memory")
    if memory is None:
        out.append(Target("memory over 3 epochs", "no growth", "n/a", None))
    else:
        growth = max(memory_growth(run) for run in memory.runs)
        out.append(Target("memory over 3 epochs", f"no growth (RSS after epoch {MEMORY_EPOCHS} <= epoch 1 "
                          f"+ {MEMORY_GROWTH_LIMIT:.0%})", f"{growth:+.1%} (worst run)", growth <= MEMORY_GROWTH_LIMIT))
    ours, theirs = find(results, "shardstream", "arrow"), find(results, "pyarrow", "arrow")
    if ours is None or theirs is None:
        out.append(Target("Arrow batches vs pyarrow", f"within {ARROW_VS_PYARROW_TARGET:g}x", "n/a", None))
    else:
        slower = theirs.best / ours.best
        out.append(Target("Arrow batches vs pyarrow", f"within {ARROW_VS_PYARROW_TARGET:g}x of pyarrow's own read",
                          f"{slower:,.1f}x slower", slower <= ARROW_VS_PYARROW_TARGET))
    return out


def memory_growth(run: dict[str, Any]) -> float:
    epochs = run["epochs"]
    return epochs[-1]["rss"] / epochs[0]["rss"] - 1


def remote_modes(results: list[Result]) -> list[str]:
    return [m for m in LOADER_MODES if any(r.mode == m and r.place != LOCAL for r in results)]


def remote_targets(results: list[Result], places: list[str]) -> list[Target]:
    """Issue 4, item 6: raw bytes from S3 vs webdataset, TTFB from a cold cache, and the cost of added latency.

    ``places``: direct, through the proxy, through the proxy with the added latency. The latency
    ratio compares the last two, so that only the latency differs (the proxy's own cost is the
    same on both sides); the table also shows it against direct reads.
    """
    direct, proxied, slowed = places
    out: list[Target] = []
    raw, wds = find(results, "shardstream", "raw", direct), find(results, "webdataset", "raw", direct)
    out.append(ratio_target(f"raw bytes @{direct} vs webdataset", f">= {REMOTE_RAW_VS_WDS_TARGET:g}x webdataset "
                            "(fsspec opener)", raw, wds.best if wds else None, REMOTE_RAW_VS_WDS_TARGET,
                            f"{raw.best:,.0f} vs {wds.best:,.0f} samples/s" if raw and wds else ""))
    for mode in remote_modes(results):
        r = find(results, "shardstream", mode, direct)
        ttfb = r.ttfb if r else None
        out.append(Target(f"TTFB ({mode} @{direct}, cold cache)", f"<= {REMOTE_TTFB_TARGET:g} s (median)",
                          "n/a" if ttfb is None else f"{ttfb:.3f} s",
                          None if ttfb is None else ttfb <= REMOTE_TTFB_TARGET))
    for mode in remote_modes(results):
        slow, base = find(results, "shardstream", mode, slowed), find(results, "shardstream", mode, proxied)
        name = f"{mode} @{slowed} vs @{proxied}"
        goal = f">= {LATENCY_RATIO_TARGET:.0%} of the rate without the added latency"
        if slow is None or base is None:
            out.append(Target(name, goal, "n/a", None))
            continue
        ratio = slow.best / base.best
        out.append(Target(name, goal, f"{ratio:.0%} ({slow.best:,.0f} vs {base.best:,.0f} samples/s)",
                          ratio >= LATENCY_RATIO_TARGET))
    return out


LATENCY_HEADER = ["mode", "tool", "{0} /s", "{1} /s", "{2} /s", "{2} / {1}", "{2} / {0}", "TTFB s: {0} / {1} / {2}"]


def latency_header(places: list[str]) -> list[str]:
    return [cell.format(*places) for cell in LATENCY_HEADER]


def latency_rows(results: list[Result], places: list[str]) -> list[list[str]]:
    """Per tool and mode: best rates direct, through the proxy, and with the added latency; ratios; median TTFBs."""
    table = []
    for mode in remote_modes(results):
        for tool in TOOLS:
            found = [find(results, tool, mode, place) for place in places]
            if not any(r is not None and r.place != LOCAL for r in results if r.tool == tool and r.mode == mode):
                continue
            if all(r is None for r in found):
                continue  # failed or unsupported: the main table says which

            def ratio(top: Result | None, bottom: Result | None) -> str:
                return "-" if top is None or bottom is None else f"{top.best / bottom.best:.0%}"

            rates = ["-" if r is None else f"{r.best:,.0f}" for r in found]
            ttfbs = " / ".join("-" if r is None or r.ttfb is None else f"{r.ttfb:.2f}" for r in found)
            table.append([mode, tool, *rates, ratio(found[2], found[1]), ratio(found[2], found[0]), ttfbs])
    return table


def remote_lines(results: list[Result], places: list[str], uploads: list[Any]) -> list[str]:
    """What the remote tables leave out: the warm second epoch, the servers' CPU time, limitations, uploads."""
    lines = []
    for r in results:
        if r.place == LOCAL or not r.ok:
            continue
        warm = r.values("warm_rate")
        if warm:
            lines.append(f"{r.tool}/{r.label}: second epoch from the warm local cache {max(warm):,.0f} samples/s "
                         f"(best; the cold first epoch {r.best:,.0f}/s)")
    for r in results:
        if r.place == LOCAL or not r.ok:
            continue
        names = sorted({name for run in r.runs for name in run.get("server_cpu", {})})
        used = {name: statistics.median(run["server_cpu"].get(name, 0.0) for run in r.runs) for name in names}
        busy = ", ".join(f"{name} {seconds:.1f}" for name, seconds in used.items() if seconds >= 0.05)
        epoch = statistics.median(r.values("seconds"))
        lines.append(f"{r.tool}/{r.label}: server CPU s per run (median, whole run incl. setup): {busy or 'none'}; "
                     f"epoch {epoch:.2f} s")
    for tool, mode, limitation in dict.fromkeys((r.tool, r.mode, r.unsupported) for r in results if r.unsupported):
        lines.append(f"{tool}/{mode}: {limitation}")
    for u in uploads:
        lines.append(f"uploaded {u.prefix}: {u.files} objects, {u.nbytes / 1e6:,.1f} MB in {u.seconds:.1f} s (untimed)")
    return lines


def context_lines(results: list[Result]) -> list[str]:
    """Ratios without a target that explain the targets."""
    lines = []
    loop, fast_loop = find(results, "pillow", "limit"), find(results, "simplejpeg", "limit")
    for ref in (loop, fast_loop):
        if ref is not None:
            together = max(ref.values("parallel_rate"))
            lines.append(f"{ref.tool} decode loop: {ref.best:,.0f}/s in 1 process; {cores()} processes at once "
                         f"{together:,.0f}/s together ({together / ref.best:.2f}x one, measured, best run)")
    for mode, ref in (("pillow", loop), ("fast", fast_loop)):
        if ref is None:
            continue
        limit = ref.best * cores()
        for tool in TOOLS:
            r = find(results, tool, mode)
            if r is not None:
                lines.append(f"{tool} {mode}: {r.best / limit:.0%} of its decode limit ({cores()} x "
                             f"{ref.best:,.0f}/s = {limit:,.0f}/s)")
    wds_fast, ss_fast = find(results, "webdataset", "fast"), find(results, "shardstream", "fast")
    if wds_fast and ss_fast:
        lines.append(f"shardstream fast / webdataset fast (both simplejpeg): {ss_fast.best / wds_fast.best:.2f}x")
    memory = find(results, "shardstream", "memory")
    if memory is not None:
        for n, run in enumerate(memory.runs, 1):
            rss = ", ".join(f"{e['rss'] / 2**20:,.0f}" for e in run["epochs"])
            anon = ", ".join(f"{e['anon'] / 2**20:,.0f}" for e in run["epochs"])
            lines.append(f"memory run {n}: RSS after each epoch {rss} MiB (anonymous {anon} MiB)")
    noisy = [f"{r.tool}/{r.label} run {n} ({run['other_cores']:.2f})" for r in results
             for n, run in enumerate(r.runs, 1) if run.get("other_cores", 0.0) > NOISY_CORES]
    if noisy:
        lines.append(f"runs during which other processes used > {NOISY_CORES:g} cores: " + ", ".join(noisy))
    for r in results:
        if r.ok and r.runs[0].get("first_batch"):
            lines.append(f"{r.tool}/{r.label} first batch: {r.runs[0]['first_batch']}")
    return lines


HEADER = ["mode", "tool", "best /s", "median /s", "steady /s", "TTFB s", "peak RSS MiB", "anon MiB", "items",
          "setup s"]
VERSUS = "x webdataset"  # remote runs: the best rate over webdataset's best, same mode and place


def header(results: list[Result]) -> list[str]:
    remote = any(r.place != LOCAL for r in results)
    return [*HEADER[:3], VERSUS, *HEADER[3:]] if remote else HEADER


def rows(results: list[Result]) -> list[list[str]]:
    width = len(header(results))
    versus = width > len(HEADER)
    table = []
    for r in results:
        if not r.ok:
            table.append([r.label, r.tool, "unsupported" if r.unsupported else "failed", *["-"] * (width - 3)])
            continue
        ttfb, steady = r.ttfb, r.steady
        setup = r.values("setup")
        row = [
            r.label, r.tool, f"{r.best:,.0f}", f"{r.median:,.0f}", "-" if steady is None else f"{steady:,.0f}",
            "-" if ttfb is None else f"{ttfb:.3f}",
            f"{r.peak_rss / 2**20:,.0f}", f"{r.peak_anon / 2**20:,.0f}", f"{r.runs[0]['samples']:,}",
            f"{statistics.median(setup):.2f}" if setup else "-",
        ]
        if versus:
            wds = find(results, "webdataset", r.mode, r.place)
            row.insert(3, f"{r.best / wds.best:.2f}x" if wds else "-")
        table.append(row)
    return table


def print_table(results: list[Result]) -> None:
    print_grid([header(results), *rows(results)])


def print_grid(table: list[list[str]]) -> None:
    """Rows under a header: the first two columns left-aligned, the others right-aligned."""
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for n, row in enumerate(table):
        print("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def target_lines(found: list[Target]) -> list[str]:
    return [f"{t.name}: {t.value}; target {t.goal}: {t.verdict}" for t in found]


def conversion_lines(conversions: list[Conversion]) -> list[str]:
    lines = []
    for c in conversions:
        if c.problem:
            lines.append(f"{c.name}: {c.problem}")
        else:
            how = "reused" if c.reused else "written"
            lines.append(f"{c.name}: {c.files} files, {c.nbytes / 1e6:,.1f} MB in {c.path} ({how}; conversion took "
                         f"{c.seconds:.1f} s)")
    return lines


def markdown_table(table: list[list[str]]) -> list[str]:
    head, *body = table
    return ["| " + " | ".join(head) + " |", "|" + "|".join(["---", "---", *["---:"] * (len(head) - 2)]) + "|",
            *("| " + " | ".join(row) + " |" for row in body)]


def markdown(images: ImageSet, results: list[Result], found: list[Target], conversions: list[Conversion],
             args: argparse.Namespace, info: dict[str, Any], remote: dict[str, Any] | None = None) -> str:
    if remote is None:
        where = "warm page cache"
    else:
        where = (f"read from a moto S3 server on 127.0.0.1 (one Python process on the same {info['nproc']} cores) "
                 f"directly (@{remote['places'][0]}), through a proxy process (@{remote['places'][1]}) and through "
                 f"a proxy adding {args.latency * 1000:g} ms to every request (@{remote['places'][2]}); every run "
                 "starts with empty local caches (cold: TTFB includes the first downloads)")
    lines = [
        f"Reading {images.count:,} JPEGs ({IMAGE_SIZE}x{IMAGE_SIZE}, {images.total_bytes / 1e6:,.0f} MB) for one "
        f"epoch, {WORKERS} DataLoader workers, batches of {BATCH_SIZE}, shuffle on, {where}; best and median "
        f"of {args.repeat} runs, each in a fresh process. Peak RSS: the process tree's, summed (max over runs).",
        "",
        *markdown_table([header(results), *rows(results)]),
    ]
    if remote is not None:
        lines += ["", *markdown_table([latency_header(remote["places"]), *latency_rows(results, remote["places"])])]
    lines += ["", "| target | measured | goal | verdict |", "|---|---:|---|---|"]
    lines += [f"| {t.name} | {t.value} | {t.goal} | {t.verdict} |" for t in found]
    lines += ["", *(f"- {line}" for line in context_lines(results))]
    if remote is not None:
        lines += [f"- {line}" for line in remote_lines(results, remote["places"], remote["uploads"])]
    lines += ["", "Shuffle: " + "; ".join(f"{k}: {v}" for k, v in SHUFFLES.items()) + "."]
    lines += ["", "Data: " + "; ".join(conversion_lines(conversions)) + "."]
    if remote is not None:
        lines += ["", "Caveats: " + REMOTE_CAVEATS]
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    lines += [
        "",
        f"Machine: {info['nproc']} cores ({info['cpu']}), {info['memory_gib']} GiB RAM, {info['system']}, "
        f"Python {info['python']}; {versions}; repository commit {info['commit']}; shardstream imported from "
        f"{info['shardstream_path']} (source digest {info['shardstream_digest']}).",
    ]
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    info = pack_machine()
    versions: dict[str, str | None] = {}
    for package in ("shardstream", "torch", "webdataset", "mosaicml-streaming", "litdata", "simplejpeg", "pillow",
                    "pyarrow"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    info.pop("shardstream", None)
    info.pop("webdataset", None)
    return {**info, "versions": versions, "commit": commit(), **shardstream_source()}


def shardstream_source() -> dict[str, str | None]:
    """Where the children import shardstream from (``PYTHONPATH`` may point at a snapshot) and a digest of it."""
    import hashlib
    from importlib.util import find_spec

    spec = find_spec("shardstream")
    if spec is None or spec.origin is None:
        return {"shardstream_path": None, "shardstream_digest": None}
    package = Path(spec.origin).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes())
    return {"shardstream_path": str(package), "shardstream_digest": digest.hexdigest()[:12]}


def commit() -> str | None:
    """The repository's commit, with ``+dirty`` when shardstream/ has uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "shardstream"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def to_json(images: ImageSet, results: list[Result], found: list[Target], conversions: list[Conversion],
            args: argparse.Namespace, info: dict[str, Any], remote: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "benchmark": "read",
        "machine": info,
        "dataset": {"path": str(images.train), "count": images.count, "total_bytes": images.total_bytes},
        "settings": {"batch_size": BATCH_SIZE, "workers": WORKERS, "shard_size": SHARD_SIZE, "repeat": args.repeat,
                     "limit_images": args.limit_images, "arrow_rows": args.arrow_rows, "arrow_batch": ARROW_BATCH,
                     "shuffle": SHUFFLES},
        "conversions": [{"name": c.name, "path": str(c.path), "seconds": round(c.seconds, 2), "bytes": c.nbytes,
                         "files": c.files, "reused": c.reused, "problem": c.problem} for c in conversions],
        "results": [
            {"tool": r.tool, "mode": r.mode, "place": r.place, "ok": r.ok, "problems": r.problems,
             "unsupported": r.unsupported,
             "best_per_s": round(r.best, 1) if r.runs else None,
             "median_per_s": round(r.median, 1) if r.runs else None,
             "ttfb_median_s": None if r.ttfb is None else round(r.ttfb, 4),
             "steady_best_per_s": None if r.steady is None else round(r.steady, 1),
             "peak_rss_bytes": r.peak_rss if r.runs else None, "peak_anon_bytes": r.peak_anon if r.runs else None,
             "runs": r.runs}
            for r in results
        ],
        "targets": [{"name": t.name, "goal": t.goal, "measured": t.value, "met": t.met} for t in found],
        "remote": None if remote is None else {
            "kind": args.remote, "added_latency_s": args.latency, "places": remote["places"],
            "endpoints": remote["endpoints"],
            "uploads": [{"prefix": u.prefix, "files": u.files, "bytes": u.nbytes, "seconds": round(u.seconds, 2)}
                        for u in remote["uploads"]]},
    }


# -- main ----------------------------------------------------------------------------------


def jobs_for(tools: list[str], modes: list[str], places: list[str] | None = None) -> list[Job]:
    if places is not None:  # remote: the loader modes at each place
        return [Job(tool, mode, place) for place in places for mode in LOADER_MODES if mode in modes
                for tool in tools]
    jobs = [Job(tool, mode) for mode in LOADER_MODES if mode in modes for tool in tools]
    if "limit" in modes:
        jobs += [Job("pillow", "limit"), Job("simplejpeg", "limit")]
    if "memory" in modes and "shardstream" in tools:
        jobs.append(Job("shardstream", "memory"))
    if "arrow" in modes and "shardstream" in tools:
        jobs += [Job("pyarrow", "arrow"), Job("shardstream", "arrow")]
    return jobs


def conversions_for(jobs: list[Job]) -> list[str]:
    names: list[str] = []
    for job in jobs:
        needed = ["table", "arrow"] if job.mode == "arrow" else [] if job.mode == "limit" else [DATA_OF[job.tool]]
        names += [n for n in needed if n not in names]
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR,
                        help=f"folder for generated data and conversions [default: {DEFAULT_DATA_DIR}]")
    parser.add_argument("--count", type=int, default=FULL_COUNT,
                        help=f"number of images [default: {FULL_COUNT:,}]; other counts go to DATA/count-N/")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tool and mode [default: 3]")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated subset of {','.join(TOOLS)}")
    parser.add_argument("--modes", default=None, help=f"comma-separated subset of {','.join(MODES)} [default: all; "
                        f"with --remote: raw; --remote takes {','.join(LOADER_MODES)}]")
    parser.add_argument("--remote", choices=["s3"], default=None,
                        help="read from a local moto S3 server (directly, through a proxy, and through a proxy "
                             "adding --latency to every request) instead of local files")
    parser.add_argument("--latency", type=float, default=ADDED_LATENCY,
                        help=f"seconds the proxy adds to every request with --remote [default: {ADDED_LATENCY:g}]")
    parser.add_argument("--limit-images", type=int, default=LIMIT_IMAGES,
                        help=f"images decoded for the decode limit [default: {LIMIT_IMAGES:,}]")
    parser.add_argument("--arrow-rows", type=int, default=ARROW_ROWS,
                        help=f"rows of the table [default: {ARROW_ROWS:,}]")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take [default: 900]")
    parser.add_argument("--quiet-wait", type=float, default=300.0,
                        help="seconds to wait before a run for other processes to leave the CPUs [default: 300]")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    parser.add_argument("--child", nargs=2, metavar=("TOOL", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--convert", metavar="NAME", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)  # a remote child: its S3 endpoint, bucket, scratch
    parser.add_argument("--bucket", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.modes is None:
        args.modes = "raw" if args.remote else ",".join(MODES)
    if args.remote and set(args.modes.split(",")) - set(LOADER_MODES):
        parser.error(f"--remote runs the modes {', '.join(LOADER_MODES)} only")
    if args.latency <= 0:
        parser.error("--latency must be positive seconds")
    for option, allowed in (("tools", TOOLS), ("modes", MODES)):
        unknown = set(getattr(args, option).split(",")) - set(allowed)
        if unknown:
            parser.error(f"unknown {option} {sorted(unknown)}; choose from {', '.join(allowed)}")
    if min(args.repeat, args.count, args.limit_images, args.arrow_rows) < 1:
        parser.error("--repeat, --count, --limit-images and --arrow-rows must be at least 1")
    args.data = args.data.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child or args.convert:  # inside a subprocess started below
        images = ensure_image_folder(args.data, args.count)
        read_root = images.root / "read"
        if args.convert:
            child_convert(args.convert, images, read_root, args.arrow_rows)
            return 0
        result = child_run(args.child[0], args.child[1], images, read_root, args)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return 0

    info = machine()
    print(f"machine: {info['nproc']} cores ({info['cpu']}), Python {info['python']}, commit {info['commit']}, "
          f"shardstream from {info['shardstream_path']} ({info['shardstream_digest']})", flush=True)
    images = ensure_image_folder(args.data, args.count)
    print(f"data: {images.count:,} JPEGs in {images.train} ({'reused' if images.reused else 'generated'}), "
          f"{images.total_bytes / 1e6:,.1f} MB, mean {images.mean_bytes / 1e3:.1f} KB", flush=True)
    read_root = set_root(args.data, args.count) / "read"

    places = None
    if args.remote:
        from _remote import RemoteS3

        places = [RemoteS3.place(None), RemoteS3.place(0.0), RemoteS3.place(args.latency)]
    jobs = jobs_for(args.tools.split(","), args.modes.split(","), places)
    conversions = [convert(name, images, read_root, args) for name in conversions_for(jobs)]
    for line in conversion_lines(conversions):
        print(f"data for {line}", flush=True)
    failed = {c.name for c in conversions if c.problem}
    if "table" in failed:
        failed.add("arrow")
    skipped = [j for j in jobs if (j.mode == "arrow" and "arrow" in failed) or
               (j.mode not in ("arrow", "limit") and DATA_OF[j.tool] in failed)]
    jobs = [j for j in jobs if j not in skipped]

    remote = None
    if args.remote:
        remote = run_remote(jobs, conversions, args, images)
        results = remote["results"]
        found = remote_targets(results, remote["places"])
    else:
        files = [p for c in conversions if not c.problem for p in sorted(c.path.rglob("*")) if p.is_file()]
        warm = warm_page_cache(files + (images.files() if any(j.mode == "limit" for j in jobs) else []))
        print(f"warm-up: read {warm[0] / 1e6:,.1f} MB once, untimed ({warm[1]:.1f} s)", flush=True)
        results = run_all(jobs, args, images) if jobs else []
    for job in skipped:
        results.append(Result(job.tool, job.mode, job.place,
                              problems=[f"no data: {DATA_OF.get(job.tool, job.tool)} conversion failed"]))
    if not args.remote:
        found = targets(results)

    print()
    print_table(results)
    if remote is not None:
        print()
        print_grid([latency_header(remote["places"]), *latency_rows(results, remote["places"])])
    print()
    for line in target_lines(found):
        print(line)
    for line in context_lines(results):
        print(line)
    if remote is not None:
        for line in remote_lines(results, remote["places"], remote["uploads"]):
            print(line)
    print()
    print(markdown(images, results, found, conversions, args, info, remote))
    if args.json is not None:
        doc = to_json(images, results, found, conversions, args, info, remote)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\nresults written to {args.json}")
    problems = [f"{r.tool}/{r.label}: {p}" for r in results for p in r.problems]
    problems += [f"{c.name}: {c.problem}" for c in conversions if c.problem]
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def run_remote(jobs: list[Job], conversions: list[Conversion], args: argparse.Namespace,
               images: ImageSet) -> dict[str, Any]:
    """Start moto and the proxies, upload each tool's converted data once (untimed), run the jobs; then stop them."""
    from _remote import RemoteS3

    with RemoteS3(latencies=(0.0, args.latency)) as remote:
        endpoints = remote.endpoints
        print(f"remote: moto S3 server (pid {remote.moto.process.pid}) at {endpoints[remote.place(None)]}, "
              f"bucket {remote.bucket}; proxies: " + ", ".join(f"@{place} {url}" for place, url in endpoints.items()
                                                              if place != remote.place(None))
              + f" (started in {remote.start_seconds:.1f} s)", flush=True)
        for c in conversions:
            if not c.problem:
                u = remote.upload(c.path, c.name)
                print(f"uploaded {c.name}: {u.files} objects, {u.nbytes / 1e6:,.1f} MB to s3://{remote.bucket}/"
                      f"{u.prefix}/ in {u.seconds:.1f} s (untimed)", flush=True)
        results = run_all(jobs, args, images, remote) if jobs else []
        return {"results": results, "places": remote.places, "endpoints": endpoints, "uploads": remote.uploads}


if __name__ == "__main__":
    sys.exit(main())
