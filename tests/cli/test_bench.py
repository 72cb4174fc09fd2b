"""shardstream bench: the documented JSON, cold and warm passes over remote storage, the recommendation,
the plots as real PNG files, and a Ctrl-C that keeps what was measured."""

from __future__ import annotations

import json
import re
import struct
import sys
import uuid

import matplotlib.pyplot as plt
import pytest
from click.testing import CliRunner

from shardstream.cli import bench_run, cli
from shardstream.cli.plots import bench_figure, data_wait_figure
from shardstream.errors import UsageError
from shardstream.storage import Store
from tests.sample_datasets import write_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

COUNTS = [12, 9, 11, 8]
POINT_KEYS = {
    "workers",
    "phase",
    "samples",
    "seconds",
    "first_batch_s",
    "samples_per_s",
    "mb_per_s",
    "peak_rss_mb",
    "stages",
    "stats",
    "data_wait",
    "interrupted",
}
RESULT_KEYS = {
    "dataset",
    "dataset_samples",
    "decoders",
    "batch_size",
    "decode",
    "samples_per_point",
    "seconds_per_point",
    "device",
    "step_ms",
    "cores",
    "points",
    "recommended_workers",
    "best_samples_per_s",
    "ideal",
    "headroom",
    "ideal_skipped",
    "interrupted",
}


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
    out = run(
        url,
        "--workers",
        "0,1",
        "--samples",
        "24",
        "--batch-size",
        "8",
        "--ideal",
        "--device",
        "cpu",
        "--step-ms",
        "1",
        "--plot",
        str(tmp_path / "bench.png"),
    )
    assert set(out) == RESULT_KEYS
    assert [(p["workers"], p["phase"]) for p in out["points"]] == [(0, "local"), (1, "local")]
    for p in out["points"]:
        assert (
            set(p) == POINT_KEYS
            and p["samples"] == 24
            and p["samples_per_s"] > 0
            and not p["interrupted"]
        )
        assert set(p["stages"]) == {"download", "read", "decode", "transform", "collate", "wait"}
        assert p["stats"]["samples"] >= 24 and p["stats"]["steps"] == 3 and len(p["data_wait"]) == 3
        assert p["peak_rss_mb"] > 0 and p["first_batch_s"] > 0
    assert (
        out["recommended_workers"] in (0, 1)
        and out["ideal"]["phase"] == "ideal"
        and out["headroom"] > 0
    )
    assert out["ideal_skipped"] is None
    # three panels: the device run adds data wait
    assert png_size(tmp_path / "bench.png") == (
        1300,
        420,
    )


def test_bench_reads_a_remote_dataset_cold_then_warm(url):
    local, remote = Store(url), Store(f"memory://bench-{uuid.uuid4().hex}/ds")
    for name in local.list_files(recursive=True):  # .shardstream/ too: the shards' indexes
        remote.write_bytes(name, bytes(local.read_bytes(name)))
    out = run(
        remote.url, "--workers", "1", "--samples", "40", "--batch-size", "10", "--decode", "none"
    )
    cold, warm = out["points"]
    assert (cold["phase"], warm["phase"]) == ("cold", "warm")
    assert cold["stats"]["cache_misses"] > 0 and cold["stats"]["cache_hits"] == 0
    assert (
        warm["stats"]["cache_misses"] == 0
        and warm["stats"]["cache_hits"] == cold["stats"]["cache_misses"]
    )
    assert out["recommended_workers"] == 1


def test_the_table_names_the_recommendation(url):
    result = CliRunner().invoke(
        cli, ["bench", url, "--workers", "0", "--samples", "16", "--batch-size", "8"]
    )
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
    point = {
        "workers": 1,
        "phase": "local",
        "samples": 10,
        "samples_per_s": 50.0,
        "interrupted": False,
        "stages": {"read": 0.5, "decode": 0.5, "wait": 0.2},
        "data_wait": [],
    }
    result = {
        "dataset": "ds",
        "batch_size": 8,
        "decode": "torch",
        "recommended_workers": 1,
        "points": [point, {**point, "workers": 2, "samples_per_s": 51.0}],
        "ideal": None,
    }
    bench_figure(result, str(tmp_path / "two.png"))
    assert png_size(tmp_path / "two.png") == (900, 420)
    data_wait_figure([(0.01, 0.02), (0.0, 0.02), (0.03, 0.02)], str(tmp_path / "wait.png"))
    assert png_size(tmp_path / "wait.png") == (650, 420)


def test_plots_without_matplotlib_say_which_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match=r"shardstream\[plot\]"):
        data_wait_figure([(0.01, 0.02)], str(tmp_path / "x.png"))


# -- what the output says, and what the plot shows (issue 24) ----------------------------------------------


def table_of(*args: str) -> str:
    result = CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_ideal_without_a_step_or_device_is_not_measured_and_says_why(url):
    """Replaying batches to a consumer that does nothing times an empty loop (thousands of times any loader):
    not a number to print as the ideal."""
    out = run(url, "--workers", "0", "--samples", "16", "--batch-size", "8", "--ideal")
    assert out["ideal"] is None and out["headroom"] is None
    assert "--step-ms" in out["ideal_skipped"] and "not measured" in out["ideal_skipped"]
    text = table_of(url, "--workers", "0", "--samples", "16", "--batch-size", "8", "--ideal")
    assert re.search(r"^ideal: +not measured: nothing takes the batches", text, re.M), text
    assert "the best measured" not in text


# said, and expected here
@pytest.mark.filterwarnings("ignore:DeviceLoader. device 'cuda' asked for:RuntimeWarning")
def test_ideal_with_a_device_that_fell_back_to_the_cpu_says_so(url):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: --device cuda copies, and the ideal is measured")
    out = run(
        url, "--workers", "0", "--samples", "16", "--batch-size", "8", "--ideal", "--device", "cuda"
    )
    assert out["ideal"] is None and "--device cuda is the CPU here" in out["ideal_skipped"]


def test_ideal_goes_through_the_same_step(url):
    out = run(
        url, "--workers", "0", "--samples", "24", "--batch-size", "8", "--ideal", "--step-ms", "5"
    )
    assert out["ideal"]["phase"] == "ideal" and out["ideal_skipped"] is None
    # each batch sleeps 5 ms: bounded by the step, by construction
    assert out["ideal"]["samples_per_s"] < 8 * 1000 / 5
    text = table_of(
        url, "--workers", "0", "--samples", "24", "--batch-size", "8", "--ideal", "--step-ms", "5"
    )
    assert "ideal (the same batches from memory, through a 5 ms step): " in text, text


def test_the_table_explains_the_wait_column(url):
    idle = table_of(url, "--workers", "0", "--samples", "16", "--batch-size", "8")
    lines = idle.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("wait:"))
    wait = " ".join(" ".join(lines[first:]).split("recommended:")[0].split())  # the note, unwrapped
    assert wait.startswith(
        "wait: share of the main process's time spent waiting for the next batch"
    ), idle
    assert "near 100%" in wait and "--step-ms" in wait
    stepped = table_of(
        url, "--workers", "0", "--samples", "16", "--batch-size", "8", "--step-ms", "3"
    )
    assert "beside a 3 ms step per batch" in stepped and "near 100%" not in stepped
    # the notes wrap at the table's width
    assert max(len(line) for line in stepped.splitlines()) <= 120


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions make, kept open for inspection instead of closed."""
    made, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: made.append(fig))
    yield made
    for fig in made:
        close(fig)


def fake_result(step_ms: float = 20.0) -> dict:
    def point(workers: int, rate: float, wait: float) -> dict:
        return {
            "workers": workers,
            "phase": "local",
            "samples": 64,
            "samples_per_s": rate,
            "interrupted": False,
            "stages": {"read": 0.2, "decode": 0.7, "collate": 0.1, "wait": wait},
            "data_wait": [0.05, 0.01, 0.002, 0.0] if workers == 0 else [],
        }

    # the best point is the first (x at the left edge) and the highest (y at the top)
    return {
        "dataset": "ds",
        "batch_size": 8,
        "decode": "torch",
        "recommended_workers": 0,
        "step_ms": step_ms,
        "points": [point(0, 900.0, 0.35), point(1, 700.0, 0.6), point(2, 650.0, 0.7)],
        "ideal": None,
    }


def inside(ax, line) -> bool:
    """Whether every marker of ``line`` lies wholly inside ``ax``'s frame."""
    radius = line.get_markersize() / 2 * ax.figure.dpi / 72
    box = ax.get_window_extent()
    xy = ax.transData.transform(list(zip(line.get_xdata(), line.get_ydata())))
    return all(
        box.x0 + radius <= x <= box.x1 - radius and box.y0 + radius <= y <= box.y1 - radius
        for x, y in xy
    )


def test_recommended_and_measured_markers_are_not_cut_by_the_frame(figures, tmp_path):
    bench_figure(fake_result(), str(tmp_path / "b.png"))
    (fig,) = figures
    fig.canvas.draw()
    throughput = next(ax for ax in fig.axes if ax.get_title() == "throughput against num_workers")
    star = next(line for line in throughput.get_lines() if line.get_marker() == "*")
    assert inside(throughput, star)
    assert all(
        inside(throughput, line)
        for line in throughput.get_lines()
        if line.get_marker() not in ("None", "")
    )


def test_main_process_wait_has_its_own_axes_not_the_stages_scale(figures, tmp_path):
    bench_figure(fake_result(), str(tmp_path / "b.png"))
    (fig,) = figures
    stages = next(ax for ax in fig.axes if "per stage" in ax.get_title())
    assert stages.get_ylabel() == "share of worker time (%)"
    assert not stages.get_lines()  # nothing but the stacked stage bars on their scale
    assert not any("wait" in text.get_text() for text in stages.get_legend().get_texts())
    (waits,) = [ax for ax in fig.axes if "waiting" in ax.get_ylabel()]
    assert waits is not stages and "main process" in waits.get_ylabel()
    assert [round(bar.get_height()) for bar in waits.patches] == [35, 60, 70]


def test_the_data_wait_panel_says_on_its_axis_what_its_title_says(figures, tmp_path):
    bench_figure(fake_result(), str(tmp_path / "b.png"))
    (fig,) = figures
    (panel,) = [ax for ax in fig.axes if ax.get_title().startswith("data wait per step")]
    assert panel.get_ylabel() == "data wait per step (ms)"
    assert any(line.get_label() == "the step (--step-ms 20)" for line in panel.get_lines())
    data_wait_figure([(0.01, 0.02), (0.0, 0.02)], str(tmp_path / "w.png"))
    ax = figures[-1].axes[0]
    assert (
        ax.get_title() == "data wait and compute per step"
        and ax.get_ylabel() == "time per step (ms)"
    )
    assert {line.get_label() for line in ax.get_lines()} == {"waiting for data", "computing"}


def test_bench_names_the_library_that_decodes_each_field():
    from importlib.metadata import version

    fields = ["cls", "jpg", "png", "clip.mp4", "wav", "json"]
    assert bench_run.decoders(fields, "none") == {}
    assert bench_run.decoders(fields, "fast")["jpg"] == f"simplejpeg {version('simplejpeg')}"
    pil = bench_run.decoders(fields, "pil")
    assert pil == {"jpg": f"Pillow {version('pillow')}", "png": f"Pillow {version('pillow')}"}
    torch_ = bench_run.decoders(fields, "torch")
    assert torch_["clip.mp4"] == torch_["wav"] == f"PyAV {version('av')}"
    assert set(torch_) == {"jpg", "png", "clip.mp4", "wav"}


def test_the_table_names_the_decoders(tmp_path):
    import io

    from PIL import Image

    def image(i: int) -> dict:
        out = io.BytesIO()
        Image.new("RGB", (8, 8), (i, 0, 0)).save(out, format="PNG")
        return {"__key__": f"{i:04d}", "png": out.getvalue(), "cls": i % 2}

    images = write_dataset(tmp_path, [4, 4], make=image)
    args = ["bench", images, "--workers", "0", "--samples", "8", "--batch-size", "4"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"^decoders: png: Pillow [\d.]+$", result.output, re.M), result.output
    text = CliRunner().invoke(cli, ["bench", write_dataset(tmp_path, [4], name="t"), *args[2:]])
    assert text.exit_code == 0 and "decoders:" not in text.output  # nothing decoded by a library
