"""pack(inputs, dest, fn=...): a function over inputs, in parallel, written in input order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardstream as ss
from shardstream.errors import ShardstreamError, SourceError
from tests.sample_datasets import without_run


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' bytes by their names without the run's token."""
    return {without_run(p.name): p.read_bytes() for p in sorted(dest.glob("shard-*"))}


def features(i: int):
    """Yields 0, 1 or 2 samples per input, with arrays, numbers, text and JSON."""
    for j in range(i % 3):
        yield {
            "__key__": f"in{i:03d}/{j}",
            "x.npy": np.full((2, 3), i, np.float32),
            "cls": i,
            "txt": f"input {i}",
            "meta.json": {"i": i, "j": j},
        }


def one(name: str) -> dict:
    return {"txt": name.upper()}


def test_round_trip_in_input_order(tmp_path: Path) -> None:
    result = ss.pack(
        list(range(30)), tmp_path / "out", fn=features, samples_per_shard=7, progress=False
    )
    assert result.samples == 30 and result.manifest.created["layout"] == "function"
    got = list(ss.ShardDataset(str(tmp_path / "out"), shuffle=False, decode="numpy"))
    expected = [s for i in range(30) for s in features(i)]
    assert [g["__key__"] for g in got] == [e["__key__"] for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g["x.npy"], e["x.npy"])
        assert (g["cls"], g["txt"], g["meta.json"]) == (e["cls"], e["txt"], e["meta.json"])


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_any_worker_count_gives_the_same_bytes(tmp_path: Path, fmt: str) -> None:
    inputs = [f"name{i}" for i in range(25)]
    for workers in (1, 2, 3):
        ss.pack(
            inputs,
            tmp_path / f"w{workers}",
            fn=one,
            format=fmt,
            workers=workers,
            samples_per_shard=4,
            progress=False,
        )
    assert (
        shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2") == shard_bytes(tmp_path / "w3")
    )
    keys = [s["__key__"] for s in ss.ShardDataset(str(tmp_path / "w2"), shuffle=False, decode=None)]
    assert keys == [f"{i:09d}" for i in range(25)]  # numbered in input order when fn gives no key


def test_a_lambda_works_with_workers(tmp_path: Path) -> None:
    offset = 5
    ss.pack(
        [1, 2, 3], tmp_path / "out", fn=lambda i: {"cls": i + offset}, workers=2, progress=False
    )
    assert [s["cls"] for s in ss.ShardDataset(str(tmp_path / "out"), shuffle=False)] == [6, 7, 8]


def flaky(i: int) -> dict:
    if i == 13:
        raise OSError(f"cannot fetch item {i}\nretry later")
    return {"txt": str(i)}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_input_is_named_and_nothing_is_published(tmp_path: Path, workers: int) -> None:
    with pytest.raises(
        ShardstreamError,
        match=r"fn flaky on input 13 \(13\) failed: OSError: cannot fetch item 13 "
        r"retry later; fix it or leave it out",
    ) as info:
        ss.pack(
            list(range(20)),
            tmp_path / "out",
            fn=flaky,
            workers=workers,
            samples_per_shard=2,
            progress=False,
        )
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out" / "_manifest.json").exists()
    # a re-run just works
    ss.pack(list(range(13)), tmp_path / "out", fn=flaky, workers=workers, progress=False)
    assert (tmp_path / "out" / "_manifest.json").exists()


def bad_value(i: int) -> dict:
    return {"blob": object()} if i == 2 else {"blob": b"ok"}


def test_bad_results_are_named(tmp_path: Path) -> None:
    with pytest.raises(
        ShardstreamError, match=r"fn bad_value on input 2 \(2\) failed: .*cannot store a object"
    ):
        ss.pack([0, 1, 2], tmp_path / "out", fn=bad_value, progress=False)
    with pytest.raises(
        ShardstreamError, match=r"on input 0 \('a'\) failed: TypeError: gave a str, not a dict"
    ):
        ss.pack(["a"], tmp_path / "out", fn=lambda s: [s], progress=False)
    with pytest.raises(SourceError, match="gave no samples"):
        ss.pack(["a", "b"], tmp_path / "out", fn=lambda s: None, progress=False)
    with pytest.raises(ShardstreamError, match="list of inputs for fn"):
        ss.pack("some/folder", tmp_path / "out", fn=one, progress=False)
    assert not (tmp_path / "out" / "_manifest.json").exists()


def test_unpicklable_fn_under_spawn_runs_in_threads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where workers are spawned (this process runs threads), a lambda cannot reach them: threads run it,
    with a warning saying how to get processes, and the shards are the same bytes."""
    import multiprocessing

    from shardstream.packing import function

    ss.pack(
        list(range(9)),
        tmp_path / "forked",
        fn=one_number,
        workers=2,
        samples_per_shard=2,
        progress=False,
    )
    monkeypatch.setattr(function, "pool_context", lambda: multiprocessing.get_context("spawn"))
    with caplog.at_level("WARNING", logger="shardstream.packing.function"):
        ss.pack(
            list(range(9)),
            tmp_path / "threads",
            fn=lambda i: {"cls": i},
            workers=2,
            samples_per_shard=2,
            progress=False,
        )
    assert "running it in 2 threads instead" in caplog.text
    assert shard_bytes(tmp_path / "threads") == shard_bytes(tmp_path / "forked")


def one_number(i: int) -> dict:
    return {"cls": i}
