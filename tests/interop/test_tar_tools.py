"""GNU tar and bsdtar extract every shard of a default tar pack and of several shards: one file per
member, ``KEY.EXT``, the image's bytes and the label's digits; shardstream still reads each after."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.interop.clients import check_ours, check_samples, shards_of

TOOLS = {"GNU tar": "tar", "bsdtar": "bsdtar"}


def tool_command(tool: str) -> str:
    command = shutil.which(TOOLS[tool])
    if command is None:
        pytest.skip(f"no {TOOLS[tool]} command (bsdtar: apt-get install libarchive-tools)")
    version = subprocess.run([command, "--version"], capture_output=True, text=True).stdout
    if tool == "GNU tar" and "GNU tar" not in version:
        pytest.skip("tar is not GNU tar here")
    return command


def extracted(folder) -> list[dict]:
    """The extracted files as samples: ``{"__key__", ext: bytes}`` by the WebDataset convention."""
    samples: dict[str, dict] = {}
    for top, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            head, _, base = rel.rpartition("/")
            stem, _, ext = base.partition(".")
            key = f"{head}/{stem}" if head else stem
            with open(path, "rb") as f:
                samples.setdefault(key, {"__key__": key})[ext] = f.read()
    return list(samples.values())


@pytest.mark.parametrize("tool", sorted(TOOLS))
@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_tar_extracts_exactly_the_samples(pack, tool, images, request, tmp_path):
    command = tool_command(tool)
    folder = request.getfixturevalue(pack)
    out = tmp_path / "out"
    out.mkdir()
    for shard in shards_of(folder):
        subprocess.run([command, "-xf", shard, "-C", str(out)], check=True, capture_output=True)
    samples = extracted(out)
    assert all(set(s) == {"__key__", "jpg", "cls"} for s in samples)
    check_samples(samples, images[1])
    check_ours(folder, images[1])


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_tar_extracts_a_zstd_pack(tool, tar_zst, images, tmp_path):
    command = tool_command(tool)
    if shutil.which("zstd") is None and tool == "GNU tar":
        pytest.skip("GNU tar needs the zstd command for --zstd")
    out = tmp_path / "out"
    out.mkdir()
    flags = ["--zstd", "-xf"] if tool == "GNU tar" else ["-xf"]
    for shard in shards_of(tar_zst):
        assert shard.endswith(".tar.zst")
        subprocess.run([command, *flags, shard, "-C", str(out)], check=True, capture_output=True)
    check_samples(extracted(out), images[1])
    check_ours(tar_zst, images[1])
