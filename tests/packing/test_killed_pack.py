"""Killing ``pack`` cannot damage the next dataset (issue 10, finding 10).

Worker processes die with the process that started them, and a destination claimed by a newer
run accepts nothing from an older one: workers write shards under names carrying their run's
token, and only the run that still holds the ``.shardstream-writing`` claim renames them into
place and publishes.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from shardstream import ShardWriter, pack
from shardstream.errors import ShardstreamError
from shardstream.manifest import MANIFEST_NAME
from shardstream.manifest.files import IN_PROGRESS
from shardstream.manifest.verify import verify
from shardstream.packing.folder import ShardJob, plan_shards, write_shard
from shardstream.sources import open_source
from tests.folders import folder_bytes, folder_files, indexed
from tests.sample_datasets import doc_without_runs, make_files, without_run

ROOT = Path(__file__).resolve().parents[2]
folder_module = importlib.import_module("shardstream.packing.folder")

# A pack whose workers write shards 0 and 1, then block on the next ones (a stand-in for long shards),
# after saying so with a file named by their pid: the test kills the main process meanwhile.
PACK_SCRIPT = """
import os, sys, time
import shardstream
from shardstream.packing import driver, folder

real_write_shard = folder.write_shard


def blocking_write_shard(job):
    if job.index >= 2:
        open(os.path.join(os.environ["PIDS"], str(os.getpid())), "w").close()
        time.sleep(float(os.environ["BLOCK"]))
    return real_write_shard(job)


driver.write_shard = blocking_write_shard

if __name__ == "__main__":
    shardstream.pack(sys.argv[1], sys.argv[2], workers=2, samples_per_shard=2, progress=False)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: only its exit status waits for its new parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.1)


@pytest.fixture
def source(tmp_path):
    return make_files(
        tmp_path / "src", {f"s{i:03d}.txt": f"sample {i}".encode() * 50 for i in range(16)}
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_of_a_killed_pack_die_and_a_rerun_with_another_shard_size_verifies(
    tmp_path, source
):
    dest, pids_dir = tmp_path / "out", tmp_path / "pids"
    pids_dir.mkdir()
    script = tmp_path / "pack_script.py"
    script.write_text(textwrap.dedent(PACK_SCRIPT))
    env = {**os.environ, "PIDS": str(pids_dir), "BLOCK": "600", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(source), str(dest)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    workers: list[int] = []
    try:
        wait_until(
            lambda: len(os.listdir(pids_dir)) >= 2 or proc.poll() is not None,
            120,
            "both workers are mid-pack",
        )
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        workers = [int(name) for name in os.listdir(pids_dir)]
        assert (dest / IN_PROGRESS).exists() and not (dest / MANIFEST_NAME).exists()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        wait_until(
            lambda: not any(alive(pid) for pid in workers), 60, f"the workers {workers} exit"
        )
    finally:
        proc.kill()
        proc.wait(timeout=60)
        for pid in workers:  # only if the test failed: leave no orphan behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not (dest / MANIFEST_NAME).exists()

    # no --overwrite needed
    result = pack(str(source), str(dest), workers=2, samples_per_shard=3, progress=False)
    report = verify(str(dest))
    assert report.ok, report.problems
    assert result.shards == 6 and result.samples == 16
    paths = result.manifest.paths
    assert folder_files(dest) == sorted([MANIFEST_NAME, *indexed(*paths)])


def test_a_worker_of_an_older_run_cannot_touch_a_newer_runs_dataset(tmp_path, source):
    """What an orphaned worker of a killed run does when it goes on after the next run claimed the folder."""
    dest = tmp_path / "out"
    first = pack(
        str(source), str(dest), workers=1, samples_per_shard=2, overwrite=True, progress=False
    )
    old_token = "0123456789abcdef"  # the killed run's claim, replaced since
    src = open_source(str(source), "auto")
    plan = plan_shards(src.samples, 10**9, 3)  # the old run cut other shards
    before = folder_bytes(dest)
    with pytest.raises(ShardstreamError, match="claimed by another pack"):
        write_shard(
            ShardJob(str(dest), None, 0, f"shard-000000-{old_token}.tar", None, plan[0], old_token)
        )
    assert folder_bytes(dest) == before  # nothing renamed, nothing left behind
    assert verify(str(dest)).ok and first.shards == 8


def test_a_writer_that_lost_its_destination_to_another_does_not_publish(tmp_path):
    dest = tmp_path / "out"
    old = ShardWriter(str(dest), samples_per_shard=1)
    old.write({"__key__": "old", "txt": "old"})
    old.finish()
    with ShardWriter(
        str(dest), samples_per_shard=1
    ) as new:  # claims the folder: the old run's shard is ours
        for i in range(3):
            new.write({"__key__": f"new{i}", "txt": "new"})
    with pytest.raises(ShardstreamError, match="claimed by another pack") as info:
        old.close()
    assert "\n" not in str(info.value)
    doc = json.loads((dest / MANIFEST_NAME).read_bytes())
    assert doc["num_samples"] == 3 and verify(str(dest)).ok


def test_a_run_whose_marker_was_removed_does_not_publish(tmp_path, source):
    dest = tmp_path / "out"
    real = folder_module.write_shard
    calls = []

    def remove_marker_midway(*args):
        calls.append(args[0].index)
        if len(calls) == 2:
            (dest / IN_PROGRESS).unlink()
        return real(*args)

    driver = importlib.import_module("shardstream.packing.driver")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "write_shard", remove_marker_midway)
        with pytest.raises(ShardstreamError, match="claimed by another pack"):
            pack(str(source), str(dest), workers=1, samples_per_shard=4, progress=False)
    assert not (dest / MANIFEST_NAME).exists()


def test_a_worker_whose_parent_is_gone_exits_at_once():
    """The race in the pool initializer: the parent died before the death signal was armed."""
    code = (
        "from shardstream.packing.engine import die_with_parent; die_with_parent(0); print('alive')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "")


def test_a_rerun_has_the_same_fingerprint_and_shards_but_another_creation_time(tmp_path, source):
    dest = tmp_path / "out"
    first = pack(str(source), str(dest), workers=2, samples_per_shard=5, progress=False)
    shards = {without_run(p): (dest / p).read_bytes() for p in first.manifest.paths}
    doc = doc_without_runs(json.loads((dest / MANIFEST_NAME).read_bytes()))
    second = pack(
        str(source), str(dest), workers=1, samples_per_shard=5, overwrite=True, progress=False
    )
    # the run's token in shard names is not part of it
    assert second.fingerprint == first.fingerprint
    assert {without_run(p): (dest / p).read_bytes() for p in second.manifest.paths} == shards
    # new names; the replaced shards and their indexes are gone
    assert not set(indexed(*first.manifest.paths)) & set(folder_files(dest))
    again = doc_without_runs(json.loads((dest / MANIFEST_NAME).read_bytes()))
    # an overwrite is the dataset's next version
    assert again.pop("version") == 2 and "version" not in doc
    assert {k: v for k, v in again.items() if k != "created"} == {
        k: v for k, v in doc.items() if k != "created"
    }
