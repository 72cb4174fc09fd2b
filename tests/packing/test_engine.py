"""The local engine: results in plan order from worker processes; forked workers take their jobs from
the memory they start with (nothing pickled on the way in), and the jobs are let go afterwards."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardstream.errors import SourceError
from shardstream.packing import engine

FORKS = "fork" in multiprocessing.get_all_start_methods()


def pid_and(lock: object, x: int) -> tuple[int, int]:
    return os.getpid(), x * x


def fails_at_3(x: int) -> int:
    if x == 3:
        raise SourceError(f"cannot read file {x}; fix it")
    return x


def test_results_come_in_plan_order_from_other_processes():
    done: list[int] = []
    results = engine.run_local(pid_and, [(None, i) for i in range(7)], 2, True, done.append)
    assert [r[1] for r in results] == [i * i for i in range(7)] and done == list(range(7))
    assert os.getpid() not in {pid for pid, _ in results}
    assert not engine._INHERITED


_UNPICKLABLE = """
import threading
from shardstream.packing import engine
from tests.packing.test_engine import pid_and
assert threading.active_count() == 1  # else the pool spawns, and pickles
results = engine.run_local(pid_and, [(threading.Lock(), i) for i in range(4)], 2, True, lambda i: None)
assert [r[1] for r in results] == [0, 1, 4, 9] and not engine._INHERITED
print("ok")
"""


@pytest.mark.skipif(not FORKS, reason="no fork on this system")
def test_forked_workers_get_arguments_that_cannot_be_pickled():
    # in a fresh process: earlier tests of a session leave threads (fsspec's loop, prefetchers) behind
    done = subprocess.run(
        [sys.executable, "-c", _UNPICKLABLE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_failing_job_stops_the_run_with_its_error_and_lets_go_of_the_jobs():
    with pytest.raises(SourceError, match="cannot read file 3; fix it"):
        engine.run_local(fails_at_3, [(i,) for i in range(6)], 2, True, lambda i: None)
    assert not engine._INHERITED


def test_threads_for_remote_stores_run_the_same_jobs():
    results = engine.run_local(pid_and, [(None, i) for i in range(5)], 3, False, lambda i: None)
    assert results == [(os.getpid(), i * i) for i in range(5)]
