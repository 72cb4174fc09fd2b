"""Several reads in one call (``read_ranges``, ``read_many``: a batch of ranged GETs) are retried request by
request: only the requests that failed are made again, each with the whole retry budget, and an error
names the object whose request failed. The filesystem is fsspec's memory://, whose reads are made to
fail here the way a flaky object store fails some requests of a batch."""

from __future__ import annotations

import uuid

import pytest

from shardstream.errors import CorruptShardError, StorageError
from shardstream.storage import RetryPolicy, Store

OBJECTS = 16


@pytest.fixture
def store() -> Store:
    store = Store(
        f"memory://batch-test-{uuid.uuid4().hex}/s",
        retry=RetryPolicy(retries=5, backoff=0.001, max_backoff=0.001),
    )
    for i in range(OBJECTS):
        store.write_bytes(f"o{i}", bytes([i]) * 1000)
    return store


class Flaky:
    """``fs.cat_ranges`` / ``fs.cat`` whose n-th request (counted over every call, from 1) fails when
    ``fails(n, path)`` says so, as a reset would; ``calls`` records each call's paths."""

    def __init__(self, fs, fails):
        self.fs, self.fails, self.seen, self.calls = fs, fails, 0, []
        self.real_ranges, self.real_cat = fs.cat_ranges, fs.cat

    def _flaky(self, paths, results):
        self.calls.append([p.rsplit("/", 1)[1] for p in paths])
        out = []
        for path, result in zip(paths, results):
            self.seen += 1
            failed = self.fails(self.seen, path.rsplit("/", 1)[1])
            out.append(ConnectionResetError("reset by peer") if failed else result)
        return out

    def cat_ranges(self, paths, starts, ends, on_error="return", **kw):
        results = self._flaky(paths, self.real_ranges(paths, starts, ends, on_error="return"))
        if on_error == "raise":
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def cat(self, paths, on_error="return", **kw):
        found = self.real_cat(paths, on_error="return", **kw)
        results = self._flaky(paths, [found[p] for p in paths])
        if on_error == "raise":
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return dict(zip(paths, results))


def flaky(store, monkeypatch, fails) -> Flaky:
    fake = Flaky(store.fs, fails)
    monkeypatch.setattr(store.fs, "cat_ranges", fake.cat_ranges)
    monkeypatch.setattr(store.fs, "cat", fake.cat)
    return fake


def ranges(store):
    names = [f"o{i}" for i in range(OBJECTS)]
    return store.read_ranges(names, [10 * i for i in range(OBJECTS)], [500] * OBJECTS)


def expected_ranges():
    return [bytes([i]) * (500 - 10 * i) for i in range(OBJECTS)]


def test_only_the_failed_requests_of_a_batch_are_made_again(store, monkeypatch):
    # every 10th request fails: every whole batch of 16 would hold one, so retrying batches never ends
    fake = flaky(store, monkeypatch, lambda n, name: n % 10 == 0)
    assert ranges(store) == expected_ranges()
    assert fake.calls == [[f"o{i}" for i in range(OBJECTS)], ["o9"]]


def test_whole_objects_read_together_are_retried_alone_too(store, monkeypatch):
    fake = flaky(store, monkeypatch, lambda n, name: n % 10 == 0)
    names = [f"o{i}" for i in range(OBJECTS)]
    assert store.read_many(names) == [bytes([i]) * 1000 for i in range(OBJECTS)]
    assert fake.calls == [names, ["o9"]]


def test_each_request_has_the_whole_retry_budget(store, monkeypatch):
    # o3 fails 5 times in a row, o7 3 times, at different attempts: each within its own 5 retries
    failures = {"o3": 5, "o7": 3}

    def fails(n, name):
        if failures.get(name, 0) > 0:
            failures[name] -= 1
            return True
        return False

    fake = flaky(store, monkeypatch, fails)
    assert ranges(store) == expected_ranges()
    assert fake.calls[1:] == [["o3", "o7"]] * 3 + [["o3"]] * 2


def test_a_request_that_never_succeeds_names_its_object(store, monkeypatch):
    fake = flaky(store, monkeypatch, lambda n, name: name == "o5")
    with pytest.raises(StorageError, match=r"cannot read .*/s/o5: .*gave up after 6 attempts"):
        ranges(store)
    assert fake.calls[1:] == [["o5"]] * 5


def test_a_missing_object_among_others_is_named(store):
    names = [f"o{i}" for i in range(4)] + ["gone"]
    with pytest.raises(StorageError, match=r"cannot read .*/s/gone: no such file"):
        store.read_ranges(names, [0] * 5, [10] * 5)


def test_damaged_bytes_of_one_request_are_read_again_alone(store, monkeypatch):
    calls = []
    real = store.fs.cat_ranges

    def spy(paths, starts, ends, **kw):
        calls.append(len(paths))
        return real(paths, starts, ends, **kw)

    monkeypatch.setattr(store.fs, "cat_ranges", spy)
    damaged = {"o4": 2}  # its bytes fail their check twice (a flipped byte on the way), then pass

    def check(i, data):
        name = f"o{i}"
        if damaged.get(name, 0) > 0:
            damaged[name] -= 1
            return "a sample differs from its sha256"
        return None

    names = [f"o{i}" for i in range(OBJECTS)]
    got = store.read_ranges(names, [0] * OBJECTS, [100] * OBJECTS, check, "re-pack it")
    assert got == [bytes([i]) * 100 for i in range(OBJECTS)]
    assert calls == [OBJECTS, 1, 1]
    damaged["o4"] = 10
    with pytest.raises(
        CorruptShardError, match=r"/s/o4: a sample differs .* on each of 6 downloads"
    ):
        store.read_ranges(names, [0] * OBJECTS, [100] * OBJECTS, check, "re-pack it")
