"""Random-access benchmark: ``ShardMap`` against wids, LitData, Mosaic, HF ``datasets`` and Lance, and Parquet in place.

Run it in the benchmark environment (``.venv-bench``, see ``benchmarks/read.py``; ``wids`` and HF
``datasets`` come from ``requirements-bench.txt``; Lance is ``pip install pylance``, its ``--no-deps``
wheel beside the venv's pyarrow and numpy if the environment must keep its own)::

    .venv-bench/bin/python benchmarks/random_access.py                       # everything
    .venv-bench/bin/python benchmarks/random_access.py --parts random --tools shardstream,hf,lance
    .venv-bench/bin/python benchmarks/random_access.py --hf-site /tmp/hf      # datasets installed apart

Parts (each measurement is a fresh subprocess; the table prints ratios against peers of the same run):

- ``random``: uniform random reads of the 20,000-JPEG set (``benchmarks/_data.py``), raw bytes, batches
  of 64, the indexes of a seeded random permutation (a ``SubsetRandomSampler``-like sampler), in each of
  ``--modes``: ``loop`` (one process, no ``DataLoader``: each batch read by the dataset's
  ``__getitems__`` where it has one, else ``ds[i]`` each, as a ``DataLoader`` would), ``w0`` and ``w2`` (a
  ``DataLoader`` with 0 or 2 workers, its default settings but the sampler and a collate that takes the
  bytes): samples/s over ``--samples`` reads, the first batch, and the first sample's latency (making the
  dataset and reading one random sample, in a fresh process); then the same reads again in the same
  process ("again": what the first pass opened and mapped stays, so it is each reader's own cost without
  the first touch of each page of a memory-mapped file, which a reader that reads its whole file when it
  opens it has paid before the timed reads). Peers: ``wids.ShardListDataset`` on the
  very tars shardstream packed, LitData and Mosaic ``__getitem__`` on their own packs (``readbench``
  conversions), HF ``Dataset.from_parquet`` on a Parquet copy (its Arrow conversion counted in its
  first-sample latency, and reported apart), and Lance (``lance.write_dataset`` of the Parquet copy's
  rows, read by ``take`` of a batch through a map-style dataset). HF and Lance read the same images in
  the same order as the readers of the tars (their rows found by key, untimed).
- ``remote``: a SeaweedFS server (``weed mini``, real S3) holding the tars and their sample indexes, and
  the Lance copy; ``ShardMap`` reads single random samples with an empty cache: the median latency per
  sample (each one's shard not cached), and the same for the first read of a fresh map; Lance ``take``
  of single random rows from the same server, alternating with it.
- ``parquet``: sequential epochs (``shuffle=False``, raw bytes, 2 workers, batch 64) of the Parquet copy
  indexed in place, against the same rows packed as Arrow shards, and HF ``datasets`` streaming the
  same Parquet files (``load_dataset("parquet", streaming=True)``).

The goals are printed as met or missed. Timings on a shared machine are
noisy: every ratio compares runs of the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(REPO_ROOT)]

BATCH, WORKERS, SEED = 64, 2, 17
MODES = {"loop": None, "w0": 0, "w2": 2}  # one process without a DataLoader; a DataLoader's workers
GOAL_RATIO = {"loop": 1.25, "w0": 1.25, "w2": 1.0}  # issue 43: shardstream / the best peer
MODE_NAMES = {
    "loop": "one process, batches by __getitems__",
    "w0": "DataLoader, 0 workers",
    "w2": "DataLoader, 2 workers",
}
PARQUET_ROWS_PER_FILE, PARQUET_ROW_GROUP = 2_500, 250  # about 64 MB files, 6 MB row groups
GOALS = {
    "remote": "a random sample from SeaweedFS in <= 100 ms median, its shard not cached",
    "parquet": "a Parquet epoch in place >= 0.9x the same rows packed as Arrow shards",
}


# -- data -------------------------------------------------------------------------------------------
def prepare(data: Path, tools: list[str]) -> dict[str, Path]:
    """The converted copies each tool reads (made once, untimed): shardstream tars, LitData, Mosaic,
    Parquet (indexed in place) and Arrow shards of the same rows."""
    import argparse as _argparse

    from _data import ensure_image_folder
    from readbench.convert import convert

    images = ensure_image_folder(data)
    read_root = data / "read"
    args = _argparse.Namespace(data=data, arrow_rows=1)  # no table conversion here
    out = {"images": images.train}
    for name in ["shardstream"] + [t for t in ("litdata", "mosaic") if t in tools]:
        done = convert(name, images, read_root, args)
        if done.problem:
            print(f"{name}: {done.problem}", flush=True)
            continue
        out[name] = done.path
    out["parquet"] = _parquet_copy(images, read_root / "parquet")
    out["arrow"] = _arrow_copy(out["parquet"], read_root / "parquet-arrow")
    if "lance" in tools:
        out["lance"] = _lance_copy(out["parquet"], read_root / "lance")
    return out


def _parquet_copy(images: Any, folder: Path) -> Path:
    """The JPEGs as Parquet files (``__key__``, ``jpg``, ``cls``), indexed in place by shardstream."""
    if (folder / "_manifest.json").exists():
        return folder
    import pyarrow as pa
    import pyarrow.parquet as pq
    from readbench.tools.base import labelled_files

    from shardstream.manifest.index_parquet import index_parquet

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    files = labelled_files(images)
    for f, start in enumerate(range(0, len(files), PARQUET_ROWS_PER_FILE)):
        part = files[start : start + PARQUET_ROWS_PER_FILE]
        table = pa.table(
            {
                "__key__": [Path(p).stem for p, _ in part],
                "jpg": [Path(p).read_bytes() for p, _ in part],
                "cls": [label for _, label in part],
            }
        )
        pq.write_table(table, folder / f"train-{f:05d}.parquet", row_group_size=PARQUET_ROW_GROUP)
    index_parquet([str(folder / "*.parquet")])
    return folder


def _arrow_copy(parquet: Path, folder: Path) -> Path:
    """The same rows packed as Arrow shards (``shardstream pack --format arrow``)."""
    if (folder / "_manifest.json").exists():
        return folder
    import pyarrow.parquet as pq

    from shardstream.packing.writer import ShardWriter

    shutil.rmtree(folder, ignore_errors=True)
    with ShardWriter(str(folder), format="arrow", shard_size="64MB") as writer:
        for path in sorted(parquet.glob("*.parquet")):
            for row in pq.read_table(path).to_pylist():
                writer.write(row)
    return folder


def _lance_copy(parquet: Path, folder: Path) -> Path:
    """The Parquet copy's rows, in their order, as one Lance dataset (``lance.write_dataset``)."""
    if (folder / "_versions").exists():
        return folder
    import lance
    import pyarrow.parquet as pq

    shutil.rmtree(folder, ignore_errors=True)
    files = sorted(parquet.glob("*.parquet"))
    schema = pq.read_schema(files[0])
    batches = (b for path in files for b in pq.ParquetFile(path).iter_batches(batch_size=500))
    lance.write_dataset(batches, str(folder), schema=schema)
    return folder


class LanceMap:
    """A Lance dataset as a map-style dataset: ``m[i]`` and ``__getitems__`` by ``take`` (one call per
    batch, what a ``DataLoader`` asks of a dataset that has it). Each process opens its own: a dataset
    opened before a fork hangs in the forked worker (its runtime's threads are not there)."""

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        self.uri, self.storage_options = uri, storage_options
        self.rows = self._dataset().count_rows()

    def _dataset(self) -> Any:
        opened = self.__dict__.get("_opened")
        if opened is None or opened[0] != os.getpid():
            import lance

            opened = self._opened = (
                os.getpid(),
                lance.dataset(self.uri, storage_options=self.storage_options),
            )
        return opened[1]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_opened"}

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indexes: list[int]) -> list[dict[str, Any]]:
        return self._dataset().take(indexes).to_pylist()


# -- the measured children --------------------------------------------------------------------------
def open_tool(tool: str, paths: dict[str, str], scratch: str) -> tuple[Any, str]:
    """The tool's map-style dataset over the JPEGs, and the name of its JPEG field."""
    if tool == "shardstream":
        from shardstream import ShardMap

        return ShardMap(paths["shardstream"], decode=None), "jpg"
    if tool == "wids":
        import wids

        from shardstream.manifest import load_manifest
        from shardstream.storage import Store

        root = Path(paths["shardstream"])
        m = load_manifest(Store(str(root)))
        shards = [
            {"url": str(root / p), "nsamples": int(n)}
            for p, n in zip(m.paths, m.stored_counts.tolist())
        ]
        return wids.ShardListDataset(shards, transformations=[], cache_dir=scratch), ".jpg"
    if tool == "litdata":
        from litdata import StreamingDataset

        return MapView(StreamingDataset(paths["litdata"])), "jpg"
    if tool == "mosaic":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        return MapView(
            StreamingDataset(local=paths["mosaic"], batch_size=BATCH, shuffle=False)
        ), "jpg"
    if tool == "hf":
        import datasets

        files = sorted(str(p) for p in Path(paths["parquet"]).glob("*.parquet"))
        return datasets.Dataset.from_parquet(files, cache_dir=scratch), "jpg"
    if tool == "lance":
        return LanceMap(paths["lance"]), "jpg"
    raise SystemExit(f"unknown tool {tool}")


ROWS_OF_PARQUET = ("hf", "lance")  # tools reading the Parquet copy's rows (in its order)


def same_rows(paths: dict[str, str], order: list[int]) -> list[int]:
    """``order`` (indexes of the packed tars) as the Parquet copy's rows holding the same images."""
    import pyarrow.parquet as pq

    from shardstream import ShardMap

    files = sorted(Path(paths["parquet"]).glob("*.parquet"))
    keys = [k for f in files for k in pq.read_table(f, columns=["__key__"]).column(0).to_pylist()]
    row = {k: r for r, k in enumerate(keys)}
    packed = list(ShardMap(paths["shardstream"], decode=None).keys())
    packed = [k.rsplit("/", 1)[-1] for k in packed]
    return [row[packed[i]] for i in order]


class Order:
    """A sampler over fixed indexes (a seeded random permutation)."""

    def __init__(self, indexes: list[int]):
        self.indexes = indexes

    def __iter__(self):
        return iter(self.indexes)

    def __len__(self) -> int:
        return len(self.indexes)


class TakeBytes:
    """A collate function: the batch's JPEG bytes (what every tool hands the main process)."""

    def __init__(self, field: str):
        self.field = field

    def __call__(self, samples: list[dict[str, Any]]) -> list[bytes]:
        return [raw_bytes(s[self.field]) for s in samples]


def raw_bytes(value: Any) -> bytes:
    """A field's bytes (wids hands out ``io.BytesIO`` objects)."""
    return value.getvalue() if hasattr(value, "getvalue") else bytes(value)


class MapView:
    """A map-style view of a dataset that is iterable too (LitData's ``StreamingDataset``): the
    ``DataLoader`` then takes a sampler."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]


def child_random(tool: str, paths: dict[str, str], samples: int, mode: str) -> dict[str, Any]:
    """Random reads of ``tool`` in ``mode``: ``loop`` (batches of the order read in this process by what a
    ``DataLoader`` calls, ``__getitems__`` where the dataset has it, else ``ds[i]`` each), ``w0`` or
    ``w2`` (a ``DataLoader`` with 0 or 2 workers, its default settings but the sampler and collate)."""
    import random

    scratch = tempfile.mkdtemp(prefix="ra-bench-")
    try:
        started = time.perf_counter()
        ds, field = open_tool(tool, paths, scratch)
        opened = time.perf_counter() - started
        order = list(range(len(ds)))
        random.Random(SEED).shuffle(order)
        if tool in ROWS_OF_PARQUET:  # the same images in the same order as the tars' readers
            order = same_rows(paths, order)
        first = raw_bytes(ds[order[0]][field])
        latency = time.perf_counter() - started
        assert len(first) > 0
        order = order[:samples]
        first_pass = _timed_reads(ds, order, field, mode, tool)
        again = _timed_reads(
            ds, order, field, mode, tool
        )  # the same reads again: what is open stays
        return {
            **first_pass,
            "rate_again": again["rate"],
            "latency": latency,
            "open": opened,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _timed_reads(ds: Any, order: list[int], field: str, mode: str, tool: str) -> dict[str, Any]:
    """Read the samples ``order`` of ``ds`` in batches as ``mode`` says (see :func:`child_random`): the rate,
    the first batch's time and the bytes read."""
    from torch.utils.data import DataLoader

    collate = TakeBytes(field)
    if mode == "loop":
        many = getattr(ds, "__getitems__", None)
        batches = (
            collate(many(b) if many else [ds[i] for i in b])
            for b in (order[k : k + BATCH] for k in range(0, len(order), BATCH))
        )
    else:
        batches = DataLoader(
            ds,
            batch_size=BATCH,
            sampler=Order(order),
            num_workers=MODES[mode],
            collate_fn=collate,
            # Lance is not fork-safe (it says so, and a forked worker hangs): its workers spawned
            multiprocessing_context="spawn" if tool == "lance" and MODES[mode] else None,
        )
    started = time.perf_counter()
    count = nbytes = 0
    first_batch = None
    for batch in batches:
        count += len(batch)
        nbytes += sum(map(len, batch))
        if first_batch is None:
            first_batch = time.perf_counter() - started
    seconds = time.perf_counter() - started
    assert count == len(order), (count, len(order))
    return {"rate": count / seconds, "first_batch": first_batch, "bytes": nbytes, "samples": count}


def child_epoch(tool: str, paths: dict[str, str]) -> dict[str, Any]:
    """One sequential epoch of raw rows: shardstream over Parquet in place or Arrow shards, or HF streaming."""
    from torch.utils.data import DataLoader

    started = time.perf_counter()
    count = 0
    if tool == "hf-streaming":
        import datasets

        files = sorted(str(p) for p in Path(paths["parquet"]).glob("*.parquet"))
        ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
        loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=TakeBytes("jpg"))
        for batch in loader:
            count += len(batch)
    else:
        from shardstream import ShardDataset

        ds = ShardDataset(paths[tool], shuffle=False, decode=None, rank=0, world_size=1)
        for batch in ds.loader(batch_size=BATCH, num_workers=WORKERS):
            count += len(batch["jpg"])
    return {"rate": count / (time.perf_counter() - started), "samples": count}


def child_remote(paths: dict[str, str], endpoint: str, reads: int) -> dict[str, Any]:
    """Single random samples of a map over a SeaweedFS bucket, each from a shard not cached."""
    import random

    from shardstream import ShardMap

    scratch = tempfile.mkdtemp(prefix="ra-remote-")
    try:
        options = {"endpoint_url": endpoint}
        started = time.perf_counter()
        m = ShardMap(paths["remote"], decode=None, storage_options=options, cache_dir=scratch)
        rng = random.Random(SEED)
        samples = m.sample_set
        shards = len(samples.per_shard)
        first_index = rng.randrange(len(m))
        m[first_index]
        first = time.perf_counter() - started
        times = []
        for k in range(reads):  # one sample per shard: none of them is dense, none is cached
            shard = k % shards
            i = samples.first(shard) + rng.randrange(int(samples.per_shard[shard]))
            t = time.perf_counter()
            assert len(m[i]["jpg"]) > 0
            times.append(time.perf_counter() - t)
        cached = any(m._opened.sparse.fetcher.cached(s) for s in range(shards))
        return {"median": statistics.median(times), "first": first, "cached": cached}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def child_remote_lance(uri: str, endpoint: str, reads: int) -> dict[str, Any]:
    """Single random rows of the Lance copy in a SeaweedFS bucket (``take`` of one row each)."""
    import random

    options = {
        "aws_endpoint": endpoint,
        "allow_http": "true",
        "aws_region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"],
    }
    started = time.perf_counter()
    ds = LanceMap(uri, options)
    rng = random.Random(SEED)
    assert len(ds[rng.randrange(len(ds))]["jpg"]) > 0
    first = time.perf_counter() - started
    times = []
    for _ in range(reads):
        i = rng.randrange(len(ds))
        t = time.perf_counter()
        assert len(ds[i]["jpg"]) > 0
        times.append(time.perf_counter() - t)
    return {"median": statistics.median(times), "first": first, "cached": False}


def run_child(args: argparse.Namespace, *child: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if (
        args.hf_site and "hf" in child[1]
    ):  # HF's own packages, apart from the peers' (see the requirements)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), args.hf_site]))
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *child], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the parent -------------------------------------------------------------------------------------
def part_random(args: argparse.Namespace, paths: dict[str, str]) -> list[str]:
    lines: list[str] = []
    for mode in args.modes:
        lines += _random_mode(args, paths, mode) + [""]
    return lines[:-1]


def _random_mode(args: argparse.Namespace, paths: dict[str, str], mode: str) -> list[str]:
    """One mode's table: the tools run in turn, each round starting with the next one."""
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in args.tools}
    for r in range(args.repeat):
        for tool in args.tools[r % len(args.tools) :] + args.tools[: r % len(args.tools)]:
            found = run_child(args, "random", tool, json.dumps(paths), str(args.samples), mode)
            print(f"  random {mode} {tool}: {found}", flush=True)
            runs[tool].append(found)
    lines = [
        f"{MODE_NAMES[mode]}, batch {BATCH}, {args.samples:,} random reads:",
        "",
        f"| tool | samples/s (median of {args.repeat}) | shardstream vs it | the same reads again "
        "| shardstream vs it | first sample (s) | first batch (ms) | open (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ok = {t: [r for r in rs if "error" not in r] for t, rs in runs.items()}
    rate = {t: statistics.median(r["rate"] for r in rs) for t, rs in ok.items() if rs}
    again = {t: statistics.median(r["rate_again"] for r in rs) for t, rs in ok.items() if rs}
    for tool in args.tools:
        if tool not in rate:
            lines.append(f"| {tool} | failed: {runs[tool][0].get('error', '')[:120]} |||||||")
            continue
        latency = statistics.median(r["latency"] for r in ok[tool])
        first_batch = statistics.median(r["first_batch"] for r in ok[tool])
        opened = statistics.median(r["open"] for r in ok[tool])
        ratio = rate.get("shardstream", 0) / rate[tool]
        ratio_again = again.get("shardstream", 0) / again[tool]
        lines.append(
            f"| {tool} | {rate[tool]:,.0f} | {ratio:.2f}x | {again[tool]:,.0f} | {ratio_again:.2f}x "
            f"| {latency:.3f} | {first_batch * 1000:.1f} | {opened:.3f} |"
        )
    peers = {t: v for t, v in rate.items() if t != "shardstream"}
    if "shardstream" in rate and peers:
        best = max(peers, key=peers.get)  # type: ignore[arg-type]
        ratio = rate["shardstream"] / peers[best]
        goal = GOAL_RATIO[mode]
        verdict = "met" if ratio >= goal else "missed"
        best_again = max(peers, key=lambda t: again[t])
        lines.append(
            f"\nGoal (random access >= {goal}x the best peer, {MODE_NAMES[mode]}): "
            f"{verdict}: {ratio:.2f}x {best} (the same reads again: "
            f"{again['shardstream'] / again[best_again]:.2f}x {best_again})"
        )
    return lines


def part_remote(args: argparse.Namespace, paths: dict[str, str]) -> list[str]:
    from _remote import RemoteSeaweed

    with RemoteSeaweed(latencies=()) as remote:
        remote.upload(Path(paths["shardstream"]), "ds")
        remote_paths = {**paths, "remote": f"s3://{remote.bucket}/ds"}
        lance = "lance" in args.tools and "lance" in paths
        if lance:
            remote.upload(Path(paths["lance"]), "lance")
        results, lance_results = [], []
        for _ in range(args.repeat):  # alternating
            results.append(
                run_child(
                    args, "remote", json.dumps(remote_paths), remote.endpoint_url, str(args.reads)
                )
            )
            if lance:
                uri = f"s3://{remote.bucket}/lance"
                lance_results.append(
                    run_child(args, "remote-lance", uri, remote.endpoint_url, str(args.reads))
                )
    print(f"  remote: {results}", flush=True)
    print(f"  remote lance: {lance_results}", flush=True)
    ok = [r for r in results if "error" not in r]
    if not ok:
        return [f"remote: failed: {results[0]['error']}"]
    median = statistics.median(r["median"] for r in ok)
    first = statistics.median(r["first"] for r in ok)
    verdict = "met" if median <= 0.1 else "missed"
    lines = [
        "| SeaweedFS (weed mini, 127.0.0.1) | median per sample, shard not cached | first sample of a fresh map |",
        "|---|---:|---:|",
        f"| ShardMap, ranged reads | {median * 1000:.1f} ms | {first * 1000:.0f} ms |",
    ]
    lance_ok = [r for r in lance_results if "error" not in r]
    if lance_ok:
        lance_median = statistics.median(r["median"] for r in lance_ok)
        lance_first = statistics.median(r["first"] for r in lance_ok)
        lines.append(
            f"| Lance `take` of one row | {lance_median * 1000:.1f} ms | {lance_first * 1000:.0f} ms |"
        )
    elif lance_results:
        lines.append(f"| Lance | failed: {lance_results[0]['error'][:120]} | |")
    return [
        *lines,
        f"\nGoal ({GOALS['remote']}): {verdict}: {median * 1000:.1f} ms"
        + (" (a shard ended up cached: check)" if any(r["cached"] for r in ok) else ""),
    ]


def part_parquet(args: argparse.Namespace, paths: dict[str, str]) -> list[str]:
    tools = ["parquet", "arrow"] + (["hf-streaming"] if "hf" in args.tools else [])
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for r in range(args.repeat):
        for tool in tools[r % len(tools) :] + tools[: r % len(tools)]:
            found = run_child(args, "epoch", tool, json.dumps(paths))
            print(f"  epoch {tool}: {found}", flush=True)
            runs[tool].append(found)
    rate = {
        t: statistics.median(r["rate"] for r in rs if "error" not in r)
        for t, rs in runs.items()
        if any("error" not in r for r in rs)
    }
    names = {
        "parquet": "shardstream, Parquet in place",
        "arrow": "shardstream, Arrow shards",
        "hf-streaming": "HF datasets streaming",
    }
    lines = [
        f"| sequential epoch | samples/s (median of {args.repeat}) | vs Parquet in place |",
        "|---|---:|---:|",
    ]
    for tool in tools:
        if tool not in rate:
            lines.append(f"| {names[tool]} | failed: {runs[tool][0].get('error', '')[:120]} | |")
            continue
        lines.append(
            f"| {names[tool]} | {rate[tool]:,.0f} | {rate.get('parquet', 0) / rate[tool]:.2f}x |"
        )
    if "parquet" in rate and "arrow" in rate:
        ratio = rate["parquet"] / rate["arrow"]
        verdict = "met" if ratio >= 0.9 else "missed"
        lines.append(f"\nGoal ({GOALS['parquet']}): {verdict}: {ratio:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO_ROOT / "bench-data")
    parser.add_argument("--parts", default="random,remote,parquet")
    parser.add_argument("--tools", default="shardstream,wids,litdata,mosaic,hf,lance")
    parser.add_argument(
        "--modes", default="loop,w0,w2", help="random part: loop (one process), w0, w2 (workers)"
    )
    parser.add_argument("--samples", type=int, default=20_000, help="random reads per run")
    parser.add_argument("--reads", type=int, default=40, help="remote single reads per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hf-site", default=None, help="a folder to add to the children's path")
    parser.add_argument("--child", nargs="+", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "random":
            out = child_random(rest[0], json.loads(rest[1]), int(rest[2]), rest[3])
        elif kind == "remote-lance":
            out = child_remote_lance(rest[0], rest[1], int(rest[2]))
        elif kind == "epoch":
            out = child_epoch(rest[0], json.loads(rest[1]))
        else:
            out = child_remote(json.loads(rest[0]), rest[1], int(rest[2]))
        print(json.dumps(out))
        return 0
    args.tools = [t for t in args.tools.split(",") if t]
    paths = {k: str(v) for k, v in prepare(args.data, args.tools).items()}
    args.tools = [t for t in args.tools if t in paths or t in ("wids", "hf")]
    args.modes = [m for m in args.modes.split(",") if m]
    report = [f"machine: {os.cpu_count()} CPUs (shared), python {sys.version.split()[0]}"]
    parts = {"random": part_random, "remote": part_remote, "parquet": part_parquet}
    for name in args.parts.split(","):
        print(f"{name} ...", flush=True)
        report += ["", f"### {name}", "", *parts[name](args, paths)]
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
