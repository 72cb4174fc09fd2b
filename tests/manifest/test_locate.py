"""A local path that is no dataset is said as what it is: missing, a file, a folder of files to pack,
a folder of tars to index; each with the command that fixes it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.errors import ManifestError


def test_a_path_that_does_not_exist_says_so(tmp_path):
    with pytest.raises(
        ManifestError, match=r"imgs-shard does not exist; give the folder that 'shardstream pack'"
    ):
        ss.ShardDataset(str(tmp_path / "imgs-shard"))


def test_a_folder_of_images_suggests_packing_it_somewhere(tmp_path):
    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    (tmp_path / "imgs" / "cat" / "a.jpg").write_bytes(b"x")
    (tmp_path / "imgs" / "b.jpg").write_bytes(b"x")
    with pytest.raises(
        ManifestError,
        match=r"imgs is a folder of files, not a dataset .*shardstream pack .*imgs DEST",
    ):
        ss.ShardDataset(str(tmp_path / "imgs"))


def test_a_file_suggests_packing_it(tmp_path):
    (tmp_path / "table.parquet").write_bytes(b"x")
    with pytest.raises(
        ManifestError, match=r"table.parquet is a file, not a dataset; pack it first"
    ):
        ss.ShardDataset(str(tmp_path / "table.parquet"))


def test_a_folder_of_tars_suggests_indexing_them(tmp_path):
    (tmp_path / "wds").mkdir()
    (tmp_path / "wds" / "shard-0.tar").write_bytes(b"x")
    with pytest.raises(
        ManifestError, match=r"wds holds tars but no dataset .*shardstream index .*wds"
    ):
        ss.ShardDataset(str(tmp_path / "wds"))


def test_the_cli_says_it_in_one_line(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(b"x")
    for path, says in (
        (tmp_path / "nowhere", "nowhere does not exist"),
        (tmp_path / "imgs", "shardstream pack"),
    ):
        result = CliRunner().invoke(cli, ["info", str(path)])
        assert result.exit_code != 0
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]


def test_an_empty_folder_still_says_no_dataset(tmp_path):
    with pytest.raises(ManifestError, match="holds no dataset"):
        ss.ShardDataset(str(tmp_path))
