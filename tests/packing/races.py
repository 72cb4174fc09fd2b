"""Two packs racing into one destination: warm runner processes, a watcher, and the judgement of each race.

A :class:`Runner` is a Python process with shardstream imported that runs the packs it is sent (one JSON
line each, on stdin) at a given wall-clock time plus an offset, and answers each with one JSON line. Two
runners given different sources and the same destination race for real: two processes, each with its own
storage clients. While they run, a :class:`Watcher` thread reads every manifest that appears at the
destination and checks each shard it names against it (size and sha256), as a reader would. After both
end, :func:`judge` says what a race left: which run published (its shards' checksums are exactly those of
a clean pack of its source), whether ``verify`` passes, and whether the runs' reports agree with that.

Runner side: ``python -m tests.packing.races`` (the repository on ``PYTHONPATH``). A runner also runs ``gc``
(a job with ``gc``: the versions to keep), for the races of living datasets (:mod:`tests.packing.living_races`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULT_TIMEOUT = 120.0  # seconds one pack may take before the harness gives up on its runner


class Runner:
    """A warm process that packs on request (see the module's documentation)."""

    def __init__(self, env: dict[str, str] | None = None, ray: dict[str, Any] | None = None):
        environ = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.packing.races"],
            cwd=str(REPO),
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.hello = self._send({"hello": True, "ray": ray})

    def _send(self, job: dict[str, Any]) -> dict[str, Any]:
        self.submit(job)
        return self.result()

    def submit(self, job: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()

    def result(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        box: list[str] = []
        reader = threading.Thread(
            target=lambda: box.append(self.process.stdout.readline()), daemon=True
        )
        reader.start()
        reader.join(RESULT_TIMEOUT)
        if not box or not box[0]:
            raise AssertionError(
                f"a pack runner gave no answer in {RESULT_TIMEOUT:.0f} s (exit status "
                f"{self.process.poll()})"
            )
        return json.loads(box[0])

    def pack(self, source: str, dest: str, **options: Any) -> dict[str, Any]:
        """Pack now, in the runner; its answer (``ok``, ``error``, ``seconds``)."""
        return self._send({"source": source, "dest": dest, "options": options, "start_at": 0.0})

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=60)


def _digest(data: Any) -> tuple[int, str]:
    return len(data), hashlib.sha256(data).hexdigest()


class Watcher(threading.Thread):
    """Polls ``dest`` while a race runs: every manifest seen there must match the shards it names (their bytes
    read and hashed), unless it was replaced by the time a shard did not match. Between two full checks of the
    same manifest, one listing tells whether any of its objects changed (its ETag on object storage, inode,
    time and size locally); a change is checked in full."""

    def __init__(
        self, dest: str, storage_options: dict[str, Any] | None = None, pause: float = 0.01
    ):
        super().__init__(daemon=True)
        from shardstream.storage import Store

        self.store = Store(dest, storage_options)
        self.pause = pause
        self.stop = threading.Event()
        self.violations: list[str] = []
        self.seen = 0  # full checks that found the manifest whole
        # a manifest found whole, its objects' versions
        self._checked: tuple[bytes, dict[str, Any]] | None = None

    def manifest_bytes(self) -> bytes | None:
        from shardstream.errors import StorageError

        try:
            return bytes(self.store.read_bytes("_manifest.json"))
        except StorageError:
            return None

    def versions(self) -> dict[str, Any]:
        """path -> version of every object in the destination now (its ``.shardstream/`` too: relative
        POSIX paths)."""
        if self.store.local:
            out = {}
            for dirpath, _, files in os.walk(self.store.root):
                rel = os.path.relpath(dirpath, self.store.root)
                for name in files:
                    with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                        st = os.stat(os.path.join(dirpath, name))
                        path = name if rel == "." else f"{Path(rel).as_posix()}/{name}"
                        out[path] = (st.st_ino, st.st_mtime_ns, st.st_size)
            return out
        fs = self.store.fs
        fs.invalidate_cache()
        try:
            listed = fs.find(self.store.root, detail=True)
        except FileNotFoundError:
            return {}
        prefix = self.store.root.rstrip("/") + "/"
        return {
            name[len(prefix) :]: info.get("ETag")
            for name, info in listed.items()
            if info["type"] == "file" and name.startswith(prefix)
        }

    def check_once(self, full: bool = False) -> None:
        from shardstream.errors import ShardstreamError
        from shardstream.manifest import Manifest
        from shardstream.manifest.side_names import index_name

        raw = self.manifest_bytes()
        if raw is None:
            return
        if not full and self._checked is not None and self._checked[0] == raw:
            versions = self.versions()
            if all(versions.get(name) == version for name, version in self._checked[1].items()):
                return  # nothing it names changed since it was found whole
        try:
            m = Manifest.from_json(
                raw, self.store.url, lambda name: bytes(self.store.read_bytes(name))
            )
        # its shard table went with a manifest that replaced it: no longer published
        except ShardstreamError:
            if self.manifest_bytes() == raw:
                self.violations.append("the published manifest cannot be read")
            return
        expected = {p: (n, sha) for p, n, sha in zip(m.paths, m.nbytes.tolist(), list(m.sha256))}
        expected.update(
            {index_name(p): (None, d) for p, d in zip(m.paths, list(m.index_sha256 or [])) if d}
        )
        names = list(expected)
        before = self.versions()
        for path, (nbytes, sha) in expected.items():
            try:
                found = _digest(self.store.read_bytes(path))
            except ShardstreamError:
                found = None
            if found is None or found[1] != sha or nbytes not in (None, found[0]):
                if self.manifest_bytes() == raw:
                    problem = "is missing" if found is None else "holds other bytes"
                    self.violations.append(f"the published manifest names {path}, which {problem}")
                return
        after = self.versions()
        # (else changed while read: checked in full again)
        if all(before.get(n) == after.get(n) for n in names):
            self._checked = (raw, {n: after.get(n) for n in names})
        self.seen += 1

    def run(self) -> None:
        while not self.stop.is_set():
            self.check_once()
            time.sleep(self.pause)


@dataclass
class Race:
    """What one race left behind, and what is wrong with it (``problems`` empty: nothing)."""

    dest: str
    offsets: tuple[float, float]
    results: tuple[dict[str, Any], dict[str, Any]]
    # "A", "B", "before" (the dataset there before the race) or "?" (none of them)
    published: str | None = None
    problems: list[str] = field(default_factory=list)
    # files there that the manifest (if any) does not name
    leftovers: list[str] = field(default_factory=list)


def judge(
    dest: str,
    results: tuple[dict[str, Any], dict[str, Any]],
    clean: dict[str, list[str]],
    storage_options: dict[str, Any] | None,
    watcher: Watcher,
    offsets: tuple[float, float],
    before: bytes | None,
    overwrite: bool = False,
) -> Race:
    """The race's outcome: exactly one run published its own shards (and said so, the other failing), or none
    did (both said so, and the manifest is still ``before``, the bytes it held before the race). ``clean`` maps
    "A", "B" (and "before") to the sha256 column of a clean pack of each source. ``overwrite``: both runs
    replace what is there, so both may succeed one after the other, the later one's dataset standing."""
    from shardstream.errors import ManifestError
    from shardstream.manifest.side_names import index_name, version_name
    from shardstream.manifest.verify import verify

    race = Race(dest, offsets, results)
    after = watcher.manifest_bytes()
    try:
        report = verify(dest, storage_options, workers=1) if after is not None else None
    except ManifestError as exc:
        race.problems.append(f"the manifest cannot be read: {' '.join(str(exc).split())}")
        report = None
    won = [name for name, r in zip("AB", results) if r["ok"]]
    if report is not None:
        sha = list(report.manifest.sha256)
        race.published = next((name for name, column in clean.items() if column == sha), "?")
        if not report.ok:
            race.problems.append(f"verify fails: {report.problems[0]}")
        if race.published == "?":
            race.problems.append("the published shards are those of neither run")
    if not won:
        if after != before:
            race.problems.append(
                f"no run reported success, but the manifest changed (published: {race.published})"
            )
    elif after == before:
        race.problems.append(
            f"{won} reported success, but the manifest is the one from before the race"
        )
    elif race.published not in won:
        race.problems.append(f"{won} reported success, but the dataset there is {race.published}'s")
    elif len(won) == 2:  # both published: only one after the other, replacing what is there
        later = max(zip("AB", results), key=lambda item: item[1]["ended_at"])[0]
        if not overwrite or race.published != later:
            race.problems.append(f"both runs reported success; published: {race.published}")
    race.problems += watcher.violations[:1]
    named = {"_manifest.json"}
    if report is not None:
        m = report.manifest
        named |= {
            *m.paths,
            *(index_name(p) for p, d in zip(m.paths, list(m.index_sha256 or [])) if d),
        }
        shards = json.loads(after or b"{}").get("shards", {})
        named |= {shards["table"]} if isinstance(shards, dict) and "table" in shards else set()
        for side in (m.selection, m.image_sizes):  # side files the manifest names
            named |= {side.reference["file"]} if side is not None else set()
    # the published version's file (an overwrite's, the next version), and no older one
    version = json.loads(after or b"{}").get("version")
    named |= {version_name(version)} if isinstance(version, int) else set()
    race.leftovers = sorted(set(watcher.versions()) - named)
    return race


def race_pair(
    a: Runner,
    b: Runner,
    sources: tuple[str, str],
    dest: str,
    options: dict[str, Any],
    clean: dict[str, list[str]],
    spread: float,
    rng: random.Random,
    storage_options: dict[str, Any] | None = None,
) -> Race:
    """One race: ``a`` packs ``sources[0]`` and ``b`` packs ``sources[1]`` into ``dest``, each starting at a
    random offset in ``[0, spread)`` s from a common start; a watcher reads ``dest`` meanwhile."""
    offsets = (rng.uniform(0, spread), rng.uniform(0, spread))
    watcher = Watcher(dest, storage_options, pause=0.01 if storage_options is None else 0.1)
    before = watcher.manifest_bytes()
    start_at = time.time() + 0.05
    watcher.start()
    for runner, source, offset in zip((a, b), sources, offsets):
        runner.submit(
            {"source": source, "dest": dest, "options": options, "start_at": start_at + offset}
        )
    try:
        results = (a.result(), b.result())
    finally:
        watcher.stop.set()
        watcher.join(30)
    watcher.check_once(full=True)  # what both left: a reader that comes later
    return judge(
        dest,
        results,
        clean,
        storage_options,
        watcher,
        offsets,
        before,
        bool(options.get("overwrite")),
    )


def run_races(
    pairs: list[tuple[Runner, Runner]],
    n: int,
    sources: tuple[str, str],
    dest_of: Callable[[int, int], str],
    options: dict[str, Any],
    clean: dict[str, list[str]],
    spread: float,
    seed: int = 0,
    storage_options: dict[str, Any] | None = None,
    prepare: Callable[[str, Runner], None] | None = None,
) -> list[Race]:
    """``n`` races, as many at once as there are ``pairs`` of runners: race ``i`` run by pair ``k`` goes to
    ``dest_of(i, k)`` (one destination per race, or one per pair for races that follow each other there);
    ``prepare(dest, runner)`` runs first, e.g. to publish a dataset there to overwrite."""
    races: list[Race | None] = [None] * n
    errors: list[BaseException] = []
    lock = threading.Lock()
    todo = iter(range(n))

    def work(k: int) -> None:
        a, b = pairs[k]
        rng = random.Random(seed * 1000 + k)
        while True:
            with lock:
                i = next(todo, None)
            if i is None or errors:
                return
            try:
                if prepare is not None:
                    prepare(dest_of(i, k), a)
                races[i] = race_pair(
                    a, b, sources, dest_of(i, k), options, clean, spread, rng, storage_options
                )
            except BaseException as exc:  # re-raised below, in the caller's thread
                errors.append(exc)
                return

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(pairs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [r for r in races if r is not None]


def summary(races: list[Race]) -> str:
    """``damaged/total`` and how the races ended, for a report."""
    damaged = [r for r in races if r.problems]
    ends: dict[str, int] = {}
    for r in races:
        ends[str(r.published)] = ends.get(str(r.published), 0) + 1
    overlapped = sum(
        1
        for r in races
        if max(x["started_at"] for x in r.results) < min(x["ended_at"] for x in r.results)
    )
    both = sum(1 for r in races if all(x["ok"] for x in r.results))
    left = [r for r in races if r.leftovers]
    kept = f"; files left in {len(left)} (e.g. {left[0].leftovers[:3]})" if left else ""
    first = f"; first: {damaged[0].problems[0]}" if damaged else ""
    return (
        f"{len(damaged)}/{len(races)} damaged ({overlapped} with both runs at once; both reported success in "
        f"{both}), published {ends}{kept}{first}"
    )


# -- the runner process ----------------------------------------------------------------------------------------


def _run(job: dict[str, Any]) -> dict[str, Any]:
    """One job: a pack (``source``, ``dest``, ``options``), or with ``gc`` (the versions to keep) a ``gc --delete``
    of ``dest`` (``options``: its ``storage_options``); what it published or removed."""
    import shardstream
    from shardstream.packing.gc import collect
    from shardstream.storage import Store

    if "gc" in job:
        store = Store(job["dest"], job["options"].get("storage_options"))
        done = collect(store, job["gc"], delete=True)
        return {"removed": len(done.files), "versions_removed": done.versions}
    result = shardstream.pack(job["source"], job["dest"], progress=False, **job["options"])
    return {"version": result.manifest.version, "fingerprint": result.manifest.fingerprint}


def _serve() -> None:
    import shardstream
    import shardstream.formats.arrow
    import shardstream.packing.driver
    import shardstream.packing.table  # imported before the first race, not during it

    with contextlib.suppress(ImportError):
        import s3fs  # noqa: F401

    out = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write on the answer channel
    for line in sys.stdin:
        job = json.loads(line)
        if job.get("hello"):
            answer: dict[str, Any] = {"ok": True, "pid": os.getpid()}
            if job.get("ray"):
                import ray

                ray.init(**job["ray"])
                answer["ray_address"] = ray.get_runtime_context().gcs_address
            out.write(json.dumps(answer) + "\n")
            out.flush()
            continue
        delay = job["start_at"] - time.time()
        if delay > 0:
            time.sleep(delay)
        started = time.perf_counter()
        try:
            answer = {"ok": True, "error": "", **_run(job)}
        except shardstream.ShardstreamError as exc:
            answer = {"ok": False, "error": str(exc), "kind": type(exc).__name__}
        except Exception as exc:  # reported to the test, which fails on it
            answer = {
                "ok": False,
                "error": f"unexpected {type(exc).__name__}: {exc}",
                "unexpected": True,
            }
        answer["seconds"] = time.perf_counter() - started
        answer["started_at"] = time.time() - answer["seconds"]
        answer["ended_at"] = time.time()
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
