"""shardstream bench: the documented JSON, cold and warm passes over remote storage, the recommendation,
the plots as real PNG files, and a Ctrl-C that keeps what was measured."""

from __future__ import annotations

import json
import struct
import sys
import uuid

import pytest
from click.testing import CliRunner

from shardstream.cli import bench_run, cli
from shardstream.cli.plots import bench_figure, data_wait_figure
from shardstream.errors import UsageError
from shardstream.storage import Store
from tests.sample_datasets import write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [12, 9, 11, 8]
POINT_KEYS = {"workers", "phase", "samples", "seconds", "first_batch_s", "samples_per_s", "mb_per_s", "peak_rss_mb",
              "stages", "stats", "data_wait", "interrupted"}
RESULT_KEYS = {"dataset", "batch_size", "decode", "samples_per_point", "seconds_per_point", "device", "step_ms",
               "cores", "points", "recommended_workers", "best_samples_per_s", "ideal", "headroom", "interrupted"}


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> str:
    return write_dataset(tmp_path_factory.mktemp("bench"), COUNTS)


def run(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["bench", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_bench_json_has_the_documented_keys_and_a_recommendation(url, tmp_path):
    out = run(url, "--workers", "0,1", "--samples", "24", "--batch-size", "8", "--ideal", "--device", "cpu",
              "--plot", str(tmp_path / "bench.png"))
    assert set(out) == RESULT_KEYS
    assert [(p["workers"], p["phase"]) for p in out["points"]] == [(0, "local"), (1, "local")]
    for p in out["points"]:
        assert set(p) == POINT_KEYS and p["samples"] == 24 and p["samples_per_s"] > 0 and not p["interrupted"]
        assert set(p["stages"]) == {"download", "read", "decode", "transform", "collate", "wait"}
        assert p["stats"]["samples"] >= 24 and p["stats"]["steps"] == 3 and len(p["data_wait"]) == 3
        assert p["peak_rss_mb"] > 0 and p["first_batch_s"] > 0
    assert out["recommended_workers"] in (0, 1) and out["ideal"]["phase"] == "ideal" and out["headroom"] > 0
    assert png_size(tmp_path / "bench.png") == (1300, 420)  # three panels: the device run adds data wait


def test_bench_reads_a_remote_dataset_cold_then_warm(url):
    local, remote = Store(url), Store(f"memory://bench-{uuid.uuid4().hex}/ds")
    for name in local.list_files():
        remote.write_bytes(name, bytes(local.read_bytes(name)))
    out = run(remote.url, "--workers", "1", "--samples", "40", "--batch-size", "10", "--decode", "none")
    cold, warm = out["points"]
    assert (cold["phase"], warm["phase"]) == ("cold", "warm")
    assert cold["stats"]["cache_misses"] > 0 and cold["stats"]["cache_hits"] == 0
    assert warm["stats"]["cache_misses"] == 0 and warm["stats"]["cache_hits"] == cold["stats"]["cache_misses"]
    assert out["recommended_workers"] == 1


def test_the_table_names_the_recommendation(url):
    result = CliRunner().invoke(cli, ["bench", url, "--workers", "0", "--samples", "16", "--batch-size", "8"])
    assert result.exit_code == 0, result.output
    assert "samples/s" in result.output and "recommended: num_workers=0" in result.output


@pytest.mark.parametrize("bad", ["1,x", "-1", ","])
def test_bad_worker_lists_are_refused(url, bad):
    result = CliRunner().invoke(cli, ["bench", url, "--workers", bad])
    assert result.exit_code == 2 and "worker counts" in result.output


def test_recommendation_is_the_fewest_workers_within_5_percent_of_the_best():
    assert bench_run.recommend({1: 100.0, 2: 190.0, 4: 200.0, 8: 205.0}) == 4
    assert bench_run.recommend({1: 100.0, 2: 99.0}) == 1
    assert bench_run.recommend({}) is None


def test_recommendation_is_monotone_in_a_fake_stage_timing():
    """Workers decode in parallel up to what the main process takes: a dearer decode never needs fewer."""
    counts = [1, 2, 4, 8, 16]
    main_cap = 5_000.0  # samples/s the main process takes at most
    picks = []
    for decode_ms in (0.1, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0):
        throughput = {w: min(w * 1000 / decode_ms, main_cap) for w in counts}
        picks.append(bench_run.recommend(throughput))
    assert picks == sorted(picks) and picks[0] == 1 and picks[-1] == 16


def test_default_workers_sweep_up_to_the_cores(monkeypatch):
    monkeypatch.setattr(bench_run.os, "sched_getaffinity", lambda pid: set(range(12)))
    assert bench_run.default_workers() == [1, 2, 4, 8, 12]


def test_ctrl_c_keeps_what_was_measured(url):
    class Bar:  # the progress bar of the second point is where the user presses Ctrl-C
        n = 0

        def __init__(self, label: str):
            self.label = label

        def update(self, k: int) -> None:
            if self.label.startswith("1 "):
                raise KeyboardInterrupt
            self.n += k

        def close(self) -> None:
            pass

    settings = bench_run.Settings(batch_size=4, samples=12, seconds=None, decode="none")
    points = bench_run.sweep(url, [0, 1, 2], settings, remote=False, progress=Bar)
    assert [(p.workers, p.interrupted) for p in points] == [(0, False), (1, True)]
    assert points[0].samples == 12 and points[1].samples == 4  # the batch it was taking counts


def test_plots_are_pngs_of_the_expected_size(tmp_path):
    point = {"workers": 1, "phase": "local", "samples": 10, "samples_per_s": 50.0, "interrupted": False,
             "stages": {"read": 0.5, "decode": 0.5, "wait": 0.2}, "data_wait": []}
    result = {"dataset": "ds", "batch_size": 8, "decode": "torch", "recommended_workers": 1,
              "points": [point, {**point, "workers": 2, "samples_per_s": 51.0}], "ideal": None}
    bench_figure(result, str(tmp_path / "two.png"))
    assert png_size(tmp_path / "two.png") == (900, 420)
    data_wait_figure([(0.01, 0.02), (0.0, 0.02), (0.03, 0.02)], str(tmp_path / "wait.png"))
    assert png_size(tmp_path / "wait.png") == (650, 420)


def test_plots_without_matplotlib_say_which_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match=r"shardstream\[plot\]"):
        data_wait_figure([(0.01, 0.02)], str(tmp_path / "x.png"))
