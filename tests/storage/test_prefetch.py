"""Prefetcher: background loading in order of need, within a byte budget."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

import pytest

from shardstream.storage.prefetch import Prefetcher


class Loads:
    """A load function that records calls and can be held back per item."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str]] = []
        self.gates: dict[int, threading.Event] = {}
        self.lock = threading.Lock()

    def hold(self, *items: int) -> None:
        for item in items:
            self.gates[item] = threading.Event()

    def release(self, item: int) -> None:
        self.gates[item].set()

    def __call__(self, item: int) -> str:
        with self.lock:
            self.calls.append((item, threading.current_thread().name))
        gate = self.gates.get(item)
        if gate is not None:
            assert gate.wait(10), f"item {item} was never released"
        if item < 0:
            raise OSError(f"cannot load {item}")
        return f"shard-{item}"

    def started(self) -> list[int]:
        with self.lock:
            return [item for item, _ in self.calls]


def wait_until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.005)


def test_wanted_items_load_in_the_background_once_each():
    loads = Loads()
    p = Prefetcher(loads, lambda i: 10, budget=1000)
    p.want([3, 1, 2, 3, 1])
    wait_until(lambda: len(loads.started()) == 3)
    assert [p.take(i) for i in (3, 1, 2)] == ["shard-3", "shard-1", "shard-2"]
    assert sorted(loads.started()) == [1, 2, 3]
    assert all(name.startswith("shardstream-prefetch") for _, name in loads.calls)
    p.close()


def test_bytes_in_flight_stay_under_the_budget():
    loads = Loads()
    loads.hold(0, 1, 2, 3)
    p = Prefetcher(loads, lambda i: 10, budget=25, threads=4)
    p.want([0, 1, 2, 3])
    assert p.queued() == ([0, 1], [2, 3])  # a third would make 30 > 25: it waits, in order of need
    assert p.in_flight() == 20
    wait_until(lambda: len(loads.started()) == 2)
    assert sorted(loads.started()) == [0, 1]
    loads.release(0)
    assert p.take(0) == "shard-0"
    wait_until(lambda: len(loads.started()) == 3)
    assert sorted(loads.started()) == [0, 1, 2]  # taking one let the next start, in order of need
    for item in (1, 2, 3):
        loads.release(item)
    assert [p.take(i) for i in (1, 2, 3)] == ["shard-1", "shard-2", "shard-3"]
    assert p.in_flight() == 0
    p.close()


def test_an_item_larger_than_the_budget_still_loads():
    loads = Loads()
    p = Prefetcher(loads, lambda i: 1000, budget=10)
    p.want([5, 6])
    assert p.queued() == ([5], [6])  # one at a time
    wait_until(lambda: loads.started() == [5])
    assert p.take(5) == "shard-5"
    assert p.take(6) == "shard-6"
    p.close()


def test_budget_zero_loads_nothing_ahead():
    loads = Loads()
    p = Prefetcher(loads, lambda i: 10, budget=0)
    p.want([1, 2])
    assert p.queued() == ([], [1, 2])  # nothing handed to the threads, so nothing can load ahead
    assert p.take(1) == "shard-1"
    assert loads.calls == [
        (1, threading.current_thread().name)
    ]  # loaded when needed, by who needs it
    assert p.queued() == ([], [2])
    p.close()


def test_an_item_taken_is_not_loaded_again_while_the_plan_still_names_it():
    loads = Loads()
    p = Prefetcher(loads, lambda i: 10, budget=100)
    p.want([1, 2])
    assert p.take(1) == "shard-1"
    p.want([1, 2, 3])  # the next chunks still read from 1
    assert p.take(3) == "shard-3"
    assert sorted(loads.started()) == [1, 2, 3]
    p.keep_only([2, 3])  # the plan moved past 1
    p.want([1])  # and came back to it
    wait_until(lambda: loads.started().count(1) == 2)
    p.close()


def test_an_item_never_wanted_loads_in_the_callers_thread():
    loads = Loads()
    p = Prefetcher(loads, lambda i: 10, budget=100)
    assert p.take(7) == "shard-7"
    assert loads.calls == [(7, threading.current_thread().name)]
    p.close()


def test_a_wanted_item_not_started_yet_is_taken_at_once():
    loads = Loads()
    loads.hold(0)
    p = Prefetcher(loads, lambda i: 10, budget=10)
    p.want([0, 1])  # 1 waits for budget
    wait_until(lambda: loads.started() == [0])
    assert p.take(1) == "shard-1"  # needed now: loaded here rather than after 0
    loads.release(0)
    assert p.take(0) == "shard-0"
    assert sorted(loads.started()) == [0, 1]
    p.close()


def test_errors_reach_whoever_takes_the_item():
    loads = Loads()
    p = Prefetcher(loads, lambda i: 10, budget=100)
    p.want([-1, 2])
    with pytest.raises(OSError, match="cannot load -1"):
        p.take(-1)
    assert p.take(2) == "shard-2"
    assert p.in_flight() == 0
    p.close()


def test_keep_only_forgets_what_the_plan_moved_past():
    loads = Loads()
    loads.hold(1)
    p = Prefetcher(loads, lambda i: 10, budget=20)
    p.want([0, 1, 2, 3])
    wait_until(lambda: sorted(loads.started()) == [0, 1])
    wait_until(lambda: p._started[0].done())
    assert 3 not in loads.started()  # 0 and 1 fill the budget
    p.keep_only([1, 3])  # 0 is loaded but no longer needed; 2 was only wanted
    wait_until(lambda: 3 in loads.started())  # 0's bytes were freed, so 3 (not 2) could start
    assert p.in_flight() == 20
    loads.release(1)
    assert p.take(1) == "shard-1"
    assert p.take(3) == "shard-3"
    assert 2 not in loads.started()
    p.close()


def test_close_stops_the_threads_and_cancels_what_is_pending():
    loads = Loads()
    loads.hold(0)
    p = Prefetcher(loads, lambda i: 10, budget=100, threads=1)
    p.want([0, 1])
    wait_until(lambda: loads.started() == [0])
    pending = p._started[1]
    p.close()
    with pytest.raises(CancelledError):
        pending.result(timeout=1)
    loads.release(0)
    for t in p._threads:
        t.join(timeout=5)
        assert not t.is_alive()
    assert loads.started() == [0]  # 1 was never loaded


def test_threads_must_be_positive():
    with pytest.raises(ValueError, match="threads"):
        Prefetcher(lambda i: i, lambda i: 1, budget=1, threads=0)


# -- close calls off what runs (issue 10) ---------------------------------------------------------------------


def test_close_keeps_a_download_whose_bytes_arrived_and_ends_its_thread(tmp_path):
    """A download called off after its bytes arrived is written to the cache all the same (other
    processes may be waiting for that file: dropping it made each of them download it again); the thread
    ends with it. Downloads still under way are called off at their next check (the test below)."""
    import hashlib
    import os

    from shardstream.storage.cache import DiskCache

    cache = DiskCache(tmp_path, limit=1 << 20)
    arrived, release = threading.Event(), threading.Event()
    payload = b"x" * 1000
    key = hashlib.sha256(payload).hexdigest()

    def download() -> bytes:
        arrived.set()
        assert release.wait(10)
        return payload

    p = Prefetcher(
        lambda i: cache.get(key, download, content=True), lambda i: 1000, budget=10_000, threads=1
    )
    p.want([1])
    assert arrived.wait(10)
    p.close()  # the download is still under way: close waits a bounded time, then calls it off
    release.set()
    for t in p._threads:
        t.join(10)
        assert not t.is_alive()
    with open(cache.path(key), "rb") as f:
        assert f.read() == payload
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".part")]
    assert (
        bytes(cache.open(key, 1000, content=True)) == payload
    )  # served from the cache, no download


def test_close_wakes_a_download_waiting_to_retry(monkeypatch):
    import uuid

    from shardstream.storage import RetryPolicy, Store

    store = Store(
        f"memory://prefetch-{uuid.uuid4().hex}/s",
        retry=RetryPolicy(retries=5, backoff=30, max_backoff=30),
    )
    store.write_bytes("a", b"x")
    failed = threading.Event()

    def unreachable(path, **kwargs):
        failed.set()
        raise ConnectionResetError("connection reset by peer")

    # the memory filesystem is shared: put it back after
    monkeypatch.setattr(store.fs, "cat_file", unreachable)
    p = Prefetcher(lambda i: store.read_bytes("a"), lambda i: 1, budget=10, threads=1)
    p.want([0])
    assert failed.wait(10)  # now it waits 15 s or more before its next attempt
    p.close()
    for t in p._threads:
        t.join(10)
        assert not t.is_alive()
