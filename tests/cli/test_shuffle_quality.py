"""``shardstream info --shuffle-quality`` (issue 11)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from shardstream import pack
from shardstream.cli import cli
from tests.sample_datasets import make_files


def test_info_reports_classes_per_batch_against_iid(tmp_path):
    files = {f"c{c}/{i:03d}.png": b"x" * 10 for c in range(8) for i in range(20)}
    src = make_files(tmp_path / "src", files)
    pack(src, tmp_path / "ds", samples_per_shard=20, shuffle=False, progress=False)
    result = CliRunner().invoke(
        cli, ["info", str(tmp_path / "ds"), "--shuffle-quality", "--batch-size", "16"]
    )
    assert result.exit_code == 0, result.output
    assert "classes per batch of 16 (i.i.d.:" in result.output
    args = ["info", str(tmp_path / "ds"), "--shuffle-quality", "--batch-size", "16", "--json"]
    result = CliRunner().invoke(cli, args)
    q = json.loads(result.output)["shuffle_quality"]
    assert q["classes_per_batch"] >= 0.9 * q["iid_classes_per_batch"]


def test_info_shuffle_quality_needs_a_cls_field(tmp_path):
    src = make_files(tmp_path / "src", {"a.txt": b"1", "b.txt": b"2"})
    pack(src, tmp_path / "ds", progress=False)
    result = CliRunner().invoke(cli, ["info", str(tmp_path / "ds"), "--shuffle-quality"])
    assert result.exit_code != 0 and "needs a 'cls' field" in result.output
