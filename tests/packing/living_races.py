"""Writers and ``gc`` on one living dataset at once: one operation run at an exact point of another, and what
every version must look like afterwards.

:class:`Interleave` runs operation ``b`` before the ``k``-th storage call operation ``a`` makes (any read,
listing, write or removal, through any store of the local, fsspec and S3 backends), in a thread of its own,
and lets ``a`` go on once ``b`` has ended or waits for the folder lock ``a`` holds (local folders: a writer's
last check of its claim and its publish are one step under that lock, so there ``b`` goes on when ``a``
releases it). Run for ``k = 1, 2, ...`` until ``a`` makes fewer calls, it puts ``b`` at every point of ``a``:
a barrier at each window, not a sleep. :func:`check_versions` says what is wrong with a dataset afterwards:
every version it lists must read whole (each file it names there, with its size), and the latest must hold
exactly the samples expected.

The races at random offsets between real processes use :mod:`tests.packing.races` (its runners also run
``gc``).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from shardstream.manifest import load_manifest
from shardstream.manifest.side_names import index_names
from shardstream.manifest.versions import list_versions
from shardstream.storage import FsspecStore, LocalStore, Store
from shardstream.storage.s3_store import S3Store
from tests.folders import folder_files

# what a store does, one storage request (or a local file operation) each
CALLS = (
    "exists",
    "size",
    "read_bytes",
    "read_many",
    "read_ranges",
    "map_local",
    "read_tagged",
    "write_if",
    "write_bytes",
    "open_write",
    "remove",
    "makedirs",
    "is_dir",
    "list_files",
    "honours_conditions",
)
_LOCK_WAIT = 60.0  # seconds ``a`` waits for ``b`` at most (a hang is a failure, not a wait forever)


class Interleave:
    """``with Interleave(k, b) as point: a()``: ``b()`` runs before ``a``'s ``k``-th storage call (see the
    module); ``point.fired`` says whether ``a`` made that many, ``point.error`` what ``b`` raised (None: it
    returned ``point.result``)."""

    def __init__(self, at: int, b: Callable[[], Any]):
        self.at, self.b = at, b
        self.calls = 0
        self.fired = False
        self.result: Any = None
        self.error: BaseException | None = None
        self._a = threading.get_ident()
        self._thread: threading.Thread | None = None
        self._settled = threading.Event()  # b ended, or waits for a lock a holds
        self._a_locked = 0  # folder locks a holds now
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> Interleave:
        for cls in (LocalStore, FsspecStore, S3Store):
            for name in CALLS:
                if name in cls.__dict__:
                    self._patch(cls, name, self._counted(cls.__dict__[name]))
        self._patch(LocalStore, "locked", self._locking(LocalStore.__dict__["locked"]))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, original in reversed(self._saved):
            setattr(cls, name, original)
        if self._thread is not None:
            self._thread.join(_LOCK_WAIT)
            assert not self._thread.is_alive(), "the operation run in between did not end"

    def _patch(self, cls: type, name: str, value: Any) -> None:
        self._saved.append((cls, name, cls.__dict__[name]))
        setattr(cls, name, value)

    def _counted(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(store: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == self._a and not self.fired:
                self.calls += 1
                if self.calls == self.at:
                    self._run_b()
            return original(store, *args, **kwargs)

        return call

    def _locking(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @contextlib.contextmanager
        def locked(store: Any) -> Iterator[None]:
            mine = threading.get_ident() == self._a
            if not mine and self._a_locked:
                self._settled.set()  # b waits for a's lock: a goes on
            with original(store):
                self._a_locked += mine
                try:
                    yield
                finally:
                    self._a_locked -= mine

        return locked

    def _run_b(self) -> None:
        self.fired = True

        def run() -> None:
            try:
                self.result = self.b()
            except BaseException as exc:  # the test judges it
                self.error = exc
            finally:
                self._settled.set()

        self._thread = threading.Thread(target=run, name="interleaved")
        self._thread.start()
        assert self._settled.wait(_LOCK_WAIT), "the operation run in between did not settle"


def each_point(trial: Callable[[int], bool], most: int = 400) -> int:
    """``trial(k)`` for ``k = 1, 2, ...`` until it returns False (its ``Interleave`` did not fire: the
    operation made fewer calls); the number of points tried."""
    for k in itertools.count(1):
        assert k <= most, f"more than {most} points: the operation does not end"
        if not trial(k):
            return k - 1
    raise AssertionError("unreachable")  # pragma: no cover


def check_versions(store: Store, keys: set[str] | None = None) -> list[str]:
    """What is wrong with the dataset in ``store``: a version it lists that cannot be read, or names a file that
    is missing or of another size (a shard, or the sample index it records for one); with ``keys``, a latest
    version that does not hold exactly them (its samples read)."""
    import shardstream as ss

    problems = []
    sizes = _sizes(store)
    for number in list_versions(store):
        try:
            m = load_manifest(store, version=number)
        except ss.ShardstreamError as exc:
            problems.append(f"version {number} cannot be read: {' '.join(str(exc).split())}")
            continue
        for path, nbytes in zip(m.paths, m.nbytes.tolist()):
            if sizes.get(path) != nbytes:
                problems.append(f"version {number} names {path}, which is missing or cut")
                break
        for path, digest in zip(m.paths, list(m.index_sha256 or [])):
            if digest and not any(name in sizes for name in index_names(path)):
                problems.append(f"version {number} names the index of {path}, which is missing")
                break
    if keys is not None and not problems:
        ds = ss.ShardDataset(
            store.url, decode=None, shuffle=False, storage_options=store.storage_options
        )
        found = [s["__key__"] for s in ds]
        if sorted(found) != sorted(keys):
            problems.append(
                f"the latest version holds {len(found)} samples ({len(set(found) - keys)} unexpected, "
                f"{len(keys - set(found))} missing), not the {len(keys)} expected"
            )
    return problems


def _sizes(store: Any) -> dict[str, int]:
    """path -> size of every file under the dataset's folder (its ``.shardstream/`` too), from one listing."""
    if store.local:
        root = Path(store.root)
        return {n: (root / n).stat().st_size for n in folder_files(root)}
    store.fs.invalidate_cache()
    listed = store.fs.find(store.root, detail=True)
    prefix = store.root.rstrip("/") + "/"
    return {
        name[len(prefix) :]: info["size"]
        for name, info in listed.items()
        if info["type"] == "file" and name.startswith(prefix)
    }


Published = (
    tuple[int, str] | None
)  # what a writer said it published: (version, fingerprint), or None: it lost


def judge_overwrite_race(
    store: Store,
    before: set[str],
    over: Published,
    replacing: set[str],
    append: Published,
    appended: set[str],
    read: bool = True,
) -> tuple[set[str], list[str]]:
    """After an overwrite (of the samples ``replacing``) and an append (of ``appended``) ran at once over the
    dataset in ``store``, which held ``before``: the samples it holds now, and what is wrong. Each writer that
    said it published did (its version means what it published, unless a later overwrite removed it), and the
    latest version is what the later of them made: the overwrite's alone, or the overwrite's and then the
    append's (its samples read with ``read``; else the fingerprints say it)."""
    problems = []
    published = {name: r for name, r in (("overwrite", over), ("append", append)) if r is not None}
    if over is not None and append is not None and over[0] == append[0]:
        problems.append(f"both said they published version {over[0]}")
    if over is None:
        expected = before | appended if append is not None else before
    elif append is not None and append[0] > over[0]:
        expected = replacing | appended
    else:
        expected = replacing
    listed = list_versions(store)
    for name, (version, fingerprint) in published.items():
        if version in listed and load_manifest(store, version=version).fingerprint != fingerprint:
            problems.append(f"version {version} is not what the {name} published")
    latest = load_manifest(store).version
    if published and latest != max(v for v, _ in published.values()):
        problems.append(f"the latest version is {latest}, not the last one published")
    return expected, problems + check_versions(store, expected if read else None)


def text_source(root: Path, tag: str, n: int = 3) -> tuple[str, set[str]]:
    """A folder of ``n`` text samples keyed ``tag/000``...; its path and keys."""
    keys = {f"{tag}/{i:03d}" for i in range(n)}
    for key in keys:
        (root / f"{key}.txt").parent.mkdir(parents=True, exist_ok=True)
        (root / f"{key}.txt").write_text(f"{key} " * 30)
    return str(root), keys


def race(a: Any, b: Any, jobs: tuple[dict, dict], spread: float, rng: random.Random):
    """Runners ``a`` and ``b`` (:class:`tests.packing.races.Runner`) start their jobs at random offsets in
    ``[0, spread)`` s from a common start; their answers."""
    start_at = time.time() + 0.05
    for runner, job in zip((a, b), jobs):
        runner.submit({**job, "start_at": start_at + rng.uniform(0, spread)})
    return a.result(), b.result()


def append_and_gc_races(
    appender: Any,
    collector: Any,
    root: Path,
    url: str,
    options: dict[str, Any],
    gc_options: dict[str, Any],
    n: int,
    seed: int,
) -> list[str]:
    """``n`` races on one dataset: an append, and a ``gc --keep 1 --delete`` (through ``gc_options``: a slower
    link, say) of what the previous races left; what went wrong in each (the samples of the latest version are
    read once, at the end). ``options``: the packs' keywords. Every append must publish and stay
    readable, gc must succeed, and every version listed must read whole."""
    store = Store(url, options.get("storage_options"))
    base, keys = text_source(root / "base", "base", 4)
    assert appender.pack(base, url, **options)["ok"]
    first, more = text_source(root / "first", "first")
    started = time.perf_counter()
    answer = appender.pack(first, url, append=True, **options)
    spread = time.perf_counter() - started
    assert answer["ok"], answer["error"]
    keys |= more
    rng, problems = random.Random(seed), []
    for i in range(n):
        source, new = text_source(root / f"r{i}", f"r{i}")
        # a crashed run's leftover: something for gc to remove
        store.write_bytes(f"shard-000000-{i:016x}.tar", b"left")
        append = {"source": source, "dest": url, "options": {**options, "append": True}}
        gc = {"gc": 1, "dest": url, "options": gc_options}
        answers = race(appender, collector, (append, gc), spread, rng)
        for name, answer in zip(("the append", "gc"), answers):
            if not answer["ok"]:
                problems.append(f"race {i}: {name} failed: {answer['error']}")
        keys |= new if answers[0]["ok"] else set()
        problems += [f"race {i}: {p}" for p in check_versions(store)]
        said = answers[0].get("version")
        if said is not None and load_manifest(store, said).fingerprint != answers[0]["fingerprint"]:
            problems.append(f"race {i}: version {said} is not what the append published")
    # every append that said it published is in the latest version, and nothing else
    return problems + check_versions(store, keys)


def overwrite_and_append_races(
    appender: Any,
    overwriter: Any,
    root: Path,
    url: str,
    options: dict[str, Any],
    n: int,
    seed: int,
) -> tuple[list[str], dict[str, int]]:
    """``n`` races on one dataset: an append, and a ``pack --overwrite`` with other samples; what went wrong in
    each (see :func:`judge_overwrite_race`), and how they ended."""
    store = Store(url, options.get("storage_options"))
    base, keys = text_source(root / "base", "base", 4)
    started = time.perf_counter()
    assert overwriter.pack(base, url, **options)["ok"]
    spread = time.perf_counter() - started
    rng, problems, ends = random.Random(seed), [], {}
    for i in range(n):
        source, new = text_source(root / f"a{i}", f"a{i}")
        other, replacing = text_source(root / f"o{i}", f"o{i}")
        append = {"source": source, "dest": url, "options": {**options, "append": True}}
        over = {"source": other, "dest": url, "options": {**options, "overwrite": True}}
        answers = race(appender, overwriter, (append, over), spread, rng)
        for name, answer in zip(("the append", "the overwrite"), answers):
            if not answer["ok"] and answer.get("kind") != "DestinationLost":
                problems.append(f"race {i}: {name} failed: {answer['error']}")
        said = [(a["version"], a["fingerprint"]) if a["ok"] else None for a in answers]
        end = "+".join(name for name, a in zip(("append", "overwrite"), answers) if a["ok"])
        ends[end or "none"] = ends.get(end or "none", 0) + 1
        keys, found = judge_overwrite_race(store, keys, said[1], replacing, said[0], new)
        problems += [f"race {i}: {p}" for p in found]
    return problems, ends


__all__ = [
    "CALLS",
    "Interleave",
    "Published",
    "check_versions",
    "each_point",
    "append_and_gc_races",
    "judge_overwrite_race",
    "overwrite_and_append_races",
    "race",
    "text_source",
]
