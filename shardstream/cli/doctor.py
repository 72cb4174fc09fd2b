"""``shardstream doctor``: is this machine (or container) ready to feed a training job?

It reports ``/dev/shm`` (size and free space), the usable cores (CPU affinity and a cgroup
CPU quota), CUDA and pinned memory, the DataLoader start method, and, given a dataset URL,
whether the storage answers and its manifest reads. It exits non-zero, with the
``--shm-size`` advice of :func:`shardstream.loader.guards.check_shm`, when ``/dev/shm`` is too
small for the loader configured by ``--workers`` and ``--batch-size``: the check is the
loader's own (with a URL the real ``ShardLoader`` is built), so the doctor and a training
run never disagree. Containers run it as their preflight or ``HEALTHCHECK``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from ..errors import ShardstreamError
from ..host import usable_cores
from ..sizes import count, format_size, parse_size
from .common import cli, safe, safe_json, storage_option, storage_options_for

CGROUP_ROOT = "/sys/fs/cgroup"
# A decoded 224 x 224 RGB uint8 image: the bytes per sample the check assumes without a dataset.
DEFAULT_SAMPLE_SIZE = "150KB"


# -- the machine --------------------------------------------------------------------------------


def shm_report(path: str | None = None) -> dict[str, Any]:
    """Size and free bytes of the shared-memory file system (None where there is none)."""
    from ..loader import guards

    path = path or guards.SHM_PATH
    try:
        st = os.statvfs(path)
    except OSError:
        return {"path": path, "total": None, "free": None}
    return {"path": path, "total": st.f_blocks * st.f_frsize, "free": guards.shm_free_bytes(path)}


def _cgroup_dirs(root: str, controller: str) -> list[str]:
    """Where this process's cgroup files may be: its own group (from /proc/self/cgroup), then the root."""
    dirs: list[str] = []
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        names = controllers.split(",")
        if controller == "" and controllers == "":  # cgroup v2's unified line "0::/path"
            dirs.append(os.path.join(root, path.lstrip("/")))
        elif controller and controller in names:
            dirs.append(os.path.join(root, controllers, path.lstrip("/")))
    dirs.append(os.path.join(root, controller) if controller else root)
    return dirs


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root: str = CGROUP_ROOT) -> tuple[float, str] | None:
    """The cgroup's CPU quota in cores and the file it came from (cgroup v2 ``cpu.max``, v1
    ``cpu.cfs_quota_us``), or None when there is no quota."""
    for d in _cgroup_dirs(root, ""):
        text = _read(os.path.join(d, "cpu.max"))
        if text:
            quota, _, period = text.partition(" ")
            if quota == "max" or not quota.isdigit() or not (period or "100000").isdigit():
                return None
            return int(quota) / int(period or 100000), os.path.join(d, "cpu.max")
    for controller in ("cpu,cpuacct", "cpu"):
        for d in _cgroup_dirs(root, controller):
            quota, period = (
                _read(os.path.join(d, "cpu.cfs_quota_us")),
                _read(os.path.join(d, "cpu.cfs_period_us")),
            )
            if quota is not None and period:
                if not quota.isdigit() or not period.isdigit() or int(period) == 0:  # -1: no quota
                    return None
                return int(quota) / int(period), os.path.join(d, "cpu.cfs_quota_us")
    return None


def cores_report(root: str = CGROUP_ROOT) -> dict[str, Any]:
    """Cores this process may run on (affinity), the cgroup quota, and the usable count: the smaller."""
    affinity = usable_cores()
    limit = cgroup_cpu_limit(root)
    quota = limit[0] if limit else None
    usable = affinity if quota is None else max(1, min(affinity, math.ceil(quota)))
    return {
        "affinity": affinity,
        "cgroup_quota": quota,
        "cgroup_file": limit[1] if limit else None,
        "usable": usable,
    }


def cuda_report() -> dict[str, Any]:
    """CUDA devices torch sees, and whether pinned (page-locked) host memory can be allocated."""
    import torch

    available = torch.cuda.is_available()
    doc: dict[str, Any] = {
        "torch": torch.__version__,
        "available": available,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if available
        else [],
        "pinned_memory": False,
        "pinned_error": None,
    }
    if not available:
        doc["pinned_error"] = "no CUDA: batches stay in pageable memory"
        return doc
    try:
        doc["pinned_memory"] = bool(
            torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True).is_pinned()
        )
    except RuntimeError as exc:  # e.g. a locked-memory ulimit (ulimit -l) too low
        doc["pinned_error"] = " ".join(str(exc).split())[:200]
    return doc


# -- the loader and the storage -----------------------------------------------------------------


def _in_flight(pin: bool, num_workers: int, default_collate: bool = True) -> tuple[float, int]:
    """The loader's own count of batches in shared memory per worker and in the main process."""
    from ..loader.shard_loader import in_flight as loader_in_flight

    prefetch = 2  # ShardLoader's default prefetch_factor, and its ring of prefetch + 2 arenas
    ring = num_workers > 0 and not pin and default_collate
    return loader_in_flight({"prefetch_factor": prefetch, "pin_memory": pin}, ring, prefetch + 2)


def loader_check_bytes(
    batch_bytes: int, num_workers: int, pin: bool, basis: str, free: int | None
) -> dict[str, Any]:
    """:func:`guards.check_shm` for a loader of ``num_workers`` whose batches take ``batch_bytes``."""
    from ..loader import guards

    per_worker, extra = _in_flight(pin, num_workers)
    needed = guards.check_shm(
        batch_bytes, num_workers, per_worker, extra_batches=extra, action="off"
    )
    doc = {"batch_bytes": batch_bytes, "needed": needed, "basis": basis, "ok": True, "error": None}
    try:
        guards.check_shm(
            batch_bytes, num_workers, per_worker, extra_batches=extra, basis=basis, free=free
        )
    except guards.SharedMemoryError as exc:
        doc.update(ok=False, error=str(exc))
    return doc


def loader_check_dataset(
    make: Callable[[], Any],
    batch_size: int,
    num_workers: int,
    pin: bool,
    read_batch: bool,
    free: int | None,
) -> dict[str, Any]:
    """Build the real ``ShardLoader`` over the dataset ``make()`` opens (its guard runs on the
    manifest's sizes); with ``read_batch``, also read the first batch in this process (no workers,
    no shared memory) and check its measured size, as each worker does before sending it."""
    from ..loader import ShardLoader, guards

    ds = make()
    estimate = ds.batch_bytes(batch_size)
    per_worker, extra = _in_flight(pin, num_workers, ds.default_collate)
    needed = guards.check_shm(estimate, num_workers, per_worker, extra_batches=extra, action="off")
    doc = {
        "batch_bytes": estimate,
        "needed": needed,
        "ok": True,
        "error": None,
        "basis": "estimated from the manifest's stored sample sizes; decoded images take more",
    }
    try:
        ShardLoader(ds, batch_size, num_workers, pin_memory=pin)
    except guards.SharedMemoryError as exc:
        return dict(doc, ok=False, error=str(exc))
    if read_batch:
        batch = next(iter(ShardLoader(make(), batch_size, 0, pin_memory=False)))
        doc.update(
            loader_check_bytes(
                guards.batch_nbytes(batch), num_workers, pin, "measured on the first batch", free
            )
        )
    return doc


_DENIED = (
    "Forbidden",
    "AccessDenied",
    "Access Denied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "the signature you provided",  # S3's text of SignatureDoesNotMatch, as a GET's error carries it
    "permission denied",
    "credentials",
    "Unauthorized",
    "401",
    "403",
)


def storage_report(url: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Whether the dataset's storage answers: its manifest read (one line on failure)."""
    from ..manifest import dataset_store, load_manifest
    from ..storage import RetryPolicy

    start = time.perf_counter()
    try:
        store = dataset_store(url, options, RetryPolicy(retries=1, timeout=timeout, backoff=0.2))
        m = load_manifest(store)
    except ShardstreamError as exc:
        text = str(exc)
        if any(word in text for word in _DENIED) and "AWS_ACCESS_KEY_ID" not in text:
            text += (
                "; check the credentials this process gets (for s3://: AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or --profile; in a container: the env_file or the mounted secret)"
            )
        return {"url": url, "ok": False, "error": text}
    return {
        "url": store.url,
        "ok": True,
        "error": None,
        "samples": m.num_samples,
        "shards": m.num_shards,
        "bytes": m.total_bytes,
        "format": m.shard_format,
        "seconds": round(time.perf_counter() - start, 3),
    }


# -- the command --------------------------------------------------------------------------------


def _size(n: int | None) -> str:
    return "-" if n is None else format_size(n)


def _text(doc: dict[str, Any]) -> list[str]:
    shm, cores, cuda, loader = doc["shm"], doc["cores"], doc["cuda"], doc["loader"]
    quota = (
        f", cgroup quota {cores['cgroup_quota']:g} core{'' if cores['cgroup_quota'] == 1 else 's'} "
        f"({cores['cgroup_file']})"
        if cores["cgroup_quota"] is not None
        else ", no cgroup CPU quota"
    )
    gpus = ", ".join(cuda["devices"]) if cuda["available"] else "not available"
    lines = [
        ("shm", f"{shm['path']}: {_size(shm['total'])}, {_size(shm['free'])} free"),
        ("cores", f"{cores['usable']} usable ({cores['affinity']} in the CPU affinity{quota})"),
        ("cuda", f"{gpus} (torch {cuda['torch']})"),
        ("pinned memory", "yes" if cuda["pinned_memory"] else f"no: {cuda['pinned_error']}"),
        ("start method", doc["start_method"]),
    ]
    if loader is not None:
        verdict = "ok" if loader["ok"] else "TOO SMALL"
        lines.append(
            (
                "loader",
                f"{count(doc['workers'], 'worker')} x batch {doc['batch_size']}"
                f"{' x ' + str(doc['local_ranks']) + ' local ranks' if doc['local_ranks'] > 1 else ''}"
                f" (pin_memory={doc['pin_memory']}): about {_size(loader['needed'])} in shared memory, "
                f"{_size(loader['batch_bytes'])} per batch ({loader['basis']}): {verdict}",
            )
        )
    storage = doc["storage"]
    if storage is not None:
        lines.append(
            (
                "storage",
                f"{safe(storage['url'])}: "
                + (
                    f"{count(storage['samples'], 'sample')} in {count(storage['shards'], storage['format'] + ' shard')}, "
                    f"{_size(storage['bytes'])}; manifest read in {storage['seconds']:.2f} s"
                    if storage["ok"]
                    else "FAILED"
                ),
            )
        )
    return [f"{name:<14}{value}" for name, value in lines]


@cli.command()
@click.argument("url", required=False)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="DataLoader workers per rank [default: what ShardLoader picks here].",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--sample-size",
    default=DEFAULT_SAMPLE_SIZE,
    show_default=True,
    metavar="SIZE",
    help="Bytes per sample in a batch when no URL is given (150KB: a decoded 224x224 RGB image).",
)
@click.option(
    "--decode",
    type=click.Choice(["none", "pil", "torch"]),
    default="torch",
    show_default=True,
    help="How the dataset at URL is decoded (for --read-batch).",
)
@click.option(
    "--read-batch",
    is_flag=True,
    help="Read the first batch of URL here and check its measured size (decoded images take more).",
)
@click.option(
    "--local-ranks",
    type=click.IntRange(min=1),
    default=None,
    help="Training processes on this machine sharing /dev/shm [default: LOCAL_WORLD_SIZE or 1].",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds one storage request may take.",
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Retry reading URL's manifest for up to this long (a store or a pack job still starting).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@storage_option
@click.pass_context
def doctor(  # noqa: PLR0913 - one per option
    ctx: click.Context,
    url: str | None,
    workers: int | None,
    batch_size: int,
    sample_size: str,
    decode: str,
    read_batch: bool,
    local_ranks: int | None,
    timeout: float,
    wait: float,
    as_json: bool,
    storage_options: tuple[str, ...],
) -> None:
    """Check /dev/shm, cores, CUDA, pinned memory and the start method for a loader of --workers
    and --batch-size, and that URL's storage answers; exit 1 with the fix when something would fail."""
    with _local_world_size(local_ranks):
        doc = _examine(
            Checkup(
                url,
                workers,
                batch_size,
                sample_size,
                decode,
                read_batch,
                timeout,
                wait,
                storage_options,
            )
        )
    if as_json:
        click.echo(safe_json(doc, indent=2))
    else:
        click.echo("\n".join(_text(doc)))
        for line in doc["warnings"]:
            click.echo(f"warning: {safe(line)}", err=True)
    for line in doc["problems"]:
        click.echo(f"error: {safe(line)}", err=True)
    if doc["problems"]:
        ctx.exit(1)


@contextlib.contextmanager
def _local_world_size(local_ranks: int | None) -> Iterator[None]:
    """``LOCAL_WORLD_SIZE`` (what the guard counts, as torchrun sets it) for the duration, then as it was."""
    if local_ranks is None:
        yield
        return
    before = os.environ.get("LOCAL_WORLD_SIZE")
    os.environ["LOCAL_WORLD_SIZE"] = str(local_ranks)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        else:
            os.environ["LOCAL_WORLD_SIZE"] = before


@dataclasses.dataclass(frozen=True)
class Checkup:
    """What the doctor is asked to check: a loader of ``workers`` x ``batch_size`` (of ``url``'s samples, or
    of ``sample_size`` each), and the storage behind ``url`` (waiting up to ``wait`` seconds for it)."""

    url: str | None
    workers: int | None
    batch_size: int
    sample_size: str
    decode: str
    read_batch: bool
    timeout: float
    wait: float
    storage_options: tuple[str, ...]


def _examine(asked: Checkup) -> dict[str, Any]:
    """Every check of the doctor, as one document (``problems`` fail it, ``warnings`` do not)."""
    from ..loader import default_num_workers, guards

    url, batch_size, timeout = asked.url, asked.batch_size, asked.timeout
    workers = asked.workers
    cuda = cuda_report()
    workers = default_num_workers() if workers is None else workers
    pin = bool(cuda["available"])  # ShardLoader's default
    shm = shm_report()
    doc: dict[str, Any] = {
        "shm": shm,
        "cores": cores_report(),
        "cuda": cuda,
        "start_method": guards.start_method(),
        "workers": workers,
        "batch_size": batch_size,
        "local_ranks": guards.local_ranks(),
        "pin_memory": pin,
        "loader": None,
        "storage": None,
    }
    if url is None:
        doc["loader"] = loader_check_bytes(
            batch_size * parse_size(asked.sample_size, "sample size"),
            workers,
            pin,
            f"{batch_size} x --sample-size {asked.sample_size}",
            shm["free"],
        )
    else:
        options = storage_options_for(asked.storage_options, url)
        deadline = time.monotonic() + asked.wait
        doc["storage"] = storage_report(url, options, timeout)
        while not doc["storage"]["ok"] and time.monotonic() < deadline:
            time.sleep(min(1.0, max(deadline - time.monotonic(), 0)))
            doc["storage"] = storage_report(url, options, timeout)
        if doc["storage"]["ok"]:
            from ..dataset import ShardDataset
            from .bench_run import DECODE

            def make() -> Any:
                return ShardDataset(
                    url,
                    shuffle=False,
                    decode=DECODE[asked.decode],
                    storage_options=options,
                    retries=1,
                    timeout=timeout,
                )

            doc["loader"] = loader_check_dataset(
                make, batch_size, workers, pin, asked.read_batch, shm["free"]
            )
    problems = [
        part["error"]
        for part in (doc["loader"], doc["storage"])
        if part is not None and not part["ok"]
    ]
    if cuda["available"] and not cuda["pinned_memory"]:
        problems.append(
            f"CUDA is available but pinned memory is not ({cuda['pinned_error']}); raise the "
            "locked-memory limit (docker run --ulimit memlock=-1) or pass pin_memory=False"
        )
    warnings = []
    if workers > max(doc["cores"]["usable"] - 1, 1) * 2:
        warnings.append(
            f"{count(workers, 'worker')} on {count(doc['cores']['usable'], 'usable core')}: they will "
            "fight over them; "
            f"use about {max(doc['cores']['usable'] - 1, 1)} (cores - 1, shared by the local ranks)"
        )
    doc.update(ok=not problems, problems=problems, warnings=warnings)
    return doc
