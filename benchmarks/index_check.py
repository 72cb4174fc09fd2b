"""What checking a local shard against its sample index costs, beside what the index saves.

A local tar shard with a sample index (``<shard>.idx``) is opened from the index instead of parsing its
tar headers; before that, the index is checked against the tar (each indexed member's header at its
offset: name, size, checksum; ``shardstream.formats.index_check``), once per host for each version of
the file. This times, per shard of the dataset, with the files in the page cache (each read once first):

- ``header parse``: ``tar.index_samples`` (what opening a shard costs without an index);
- ``index open``: reading the index, its sha256, ``parse_index`` and ``index.samples()``;
- ``check``: ``check_index`` (the once-per-version cost, paid by the first open on the host);
- ``record hit``: ``check_index_once`` when the record is there (what every later open pays).

Usage (the 20,000-JPEG set of ``benchmarks/_data.py``, packed with indexes)::

    PYTHONPATH=. .venv/bin/python benchmarks/index_check.py --dataset bench-data/read/shardstream --repeat 7

It prints the summed milliseconds per dataset (median of the repeats) and ratios to the header parse;
timings are noise on a busy machine, compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from shardstream.dataset.shards.checked_index import check_index_once  # noqa: E402
from shardstream.dataset.shards.mapped import file_identity  # noqa: E402
from shardstream.formats import tar as tar_format  # noqa: E402
from shardstream.formats.index_check import _plain_match, check_index  # noqa: E402
from shardstream.formats.tar_index import parse_index  # noqa: E402
from shardstream.manifest import dataset_store, load_manifest  # noqa: E402
from shardstream.storage import DiskCache, ShardFetcher  # noqa: E402


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", required=True, help="a local dataset packed with indexes")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    store = dataset_store(args.dataset)
    manifest = load_manifest(store)
    if not manifest.index_sha256:
        raise SystemExit(f"{args.dataset} has no sample indexes: pack it with --index")
    shards = []
    for i, rel in enumerate(manifest.paths):
        path = store.path(rel)
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        hashlib.sha256(data).digest()  # into the page cache
        idx_path = path + ".idx"
        shards.append((path, data, idx_path, int(manifest.samples[i]), manifest.index_sha256[i]))

    def index_open(s):
        raw = Path(s[2]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == s[4]
        index = parse_index(raw, s[2], s[3], len(s[1]))
        index.samples(s[0])
        return index

    indexes = [index_open(s) for s in shards]
    fast = sum(_plain_match(s[1], ix) for s, ix in zip(shards, indexes))
    records = tempfile.mkdtemp(prefix="index-check-records-")
    fetcher = ShardFetcher(store, manifest, cache=DiskCache(records))
    versions = [file_identity(s[0]) for s in shards]
    for s, ix, version in zip(shards, indexes, versions):  # the records, for "record hit"
        check_index_once(fetcher, s[0], version, s[1], ix, s[0], s[4])

    rows = {
        "header parse": lambda: [tar_format.index_samples(s[1], s[0]) for s in shards],
        "index open": lambda: [index_open(s) for s in shards],
        "check": lambda: [check_index(s[1], ix, s[0]) for s, ix in zip(shards, indexes)],
        "record hit": lambda: [
            check_index_once(fetcher, s[0], v, s[1], ix, s[0], s[4])
            for s, ix, v in zip(shards, indexes, versions)
        ],
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for r in range(args.repeat):
        names = list(rows)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in names:
            times[name].append(_timed(rows[name]))
    members = sum(len(ix.sizes) for ix in indexes)
    print(
        f"{len(shards)} shards, {sum(s[3] for s in shards):,} samples, {members:,} members, "
        f"{sum(len(s[1]) for s in shards) / 1e6:.0f} MB; {fast}/{len(shards)} shards took the "
        f"vectorised path; median of {args.repeat}"
    )
    base = statistics.median(times["header parse"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>14}: {median * 1e3:8.2f} ms  ({median / base:5.2f}x the header parse)")
    first = statistics.median(times["index open"]) + statistics.median(times["check"])
    later = statistics.median(times["index open"]) + statistics.median(times["record hit"])
    print(
        f"opening every shard through its index: first time on a host {first / base:.2f}x the header "
        f"parse, afterwards {later / base:.2f}x"
    )


if __name__ == "__main__":
    main()
