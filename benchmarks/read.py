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
the machine line names that path and a digest of its sources. The benchmark uses shardstream's
top-level names only, so it reads any source tree.

Data. The JPEG set of ``benchmarks/_data.py`` (``bench-data/train``, generated on first use) is
converted once per tool into ``<set>/read/<tool>/``, untimed, and reused while its marker
``<set>/read/<tool>.json`` matches: shardstream ``pack --shard-size 64MB`` (tar shards);
webdataset reads those same tars (they are WebDataset tars, so both read identical bytes);
mosaicml-streaming ``MDSWriter`` and litdata ``optimize`` (fields ``jpg`` bytes and ``cls``, 64 MB
shards). A tool that cannot be imported or fails to convert is reported and left out; the others
still run. Every converted file is read once, untimed, before the timed runs (a warm page cache).

Modes (each run is a fresh subprocess; runs are interleaved, rotating which goes first):

- ``raw``: one epoch of undecoded bytes, 2 DataLoader workers, batches of 64. The main process
  takes every ``jpg`` value as a bytes-like object (so a batch of mere locations pays for reading
  them) and the total is checked against the JPEG bytes on disk. Every tool has its own shuffle
  on: shardstream permutes shards and shuffles within its default window (about 64 shards; over remote
  shards at most 1 GiB of them); webdataset
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
TTFB includes the first downloads. shardstream reads with its default prefetch, retries and timeout, then
a second epoch in the same process from the now warm local cache, reported apart (not in the table's
rates); webdataset opens the same tars through an fsspec (s3fs) handler (it has none of its own); litdata
0.2.76 cannot read a plain-http endpoint, which is tried once and reported as such, not as a failure. How
each tool is pointed at the endpoint is described in ``readbench/tools/<tool>.py``.

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

Code: this script is the entry point (the parent and, with hidden options, every child); the rest is in
``benchmarks/readbench/``: ``tools/`` (one module per tool: its conversion and its loader), ``convert``,
``epoch``, ``limit`` and ``arrow`` (what runs in a measured child), ``procfs`` and ``harness`` (sampling
and running the children), ``jobs``, ``targets``, ``report`` and ``cli`` (the options and the main flow).
"""

from __future__ import annotations

import sys

from readbench.cli import main as _main


def main(argv: list[str] | None = None) -> int:
    return _main(argv, description=__doc__.split("\n", 1)[0])


if __name__ == "__main__":
    sys.exit(main())
