"""Megatron-Energon and shardstream in one folder, in either order: ``energon prepare`` on a pack, then
both read; ``shardstream index --overwrite`` on the prepared folder, then both read and Energon's
``<shard>.tar.idx`` files are left byte for byte; and a folder Energon prepared first (tars webdataset
wrote), indexed by shardstream after. Energon runs in processes of its own (it registers fork hooks)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardstream as ss
from tests.interop.clients import check_ours, check_samples, shards_of
from tests.interop.conftest import copy_of

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None
    or importlib.util.find_spec("megatron.energon") is None,
    reason="megatron-energon is not installed (the test extras)",
)
READER = Path(__file__).with_name("energon_read.py")
ENERGON = "import sys; from megatron.energon.cli.main import main; sys.exit(main())"


def run(*args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def prepare(folder: Path) -> None:
    run("-c", ENERGON, "prepare", str(folder), "--non-interactive", "--split-ratio", "1,0,0",
        "--sample-type", "CrudeWebdataset", "--no-progress")  # fmt: skip


def energon_samples(folder: Path) -> list[dict]:
    lines = run(str(READER), str(folder)).splitlines()
    return [
        {k: v if k == "__key__" else base64.b64decode(v) for k, v in json.loads(line).items()}
        for line in lines
        if line.startswith("{")
    ]


def energon_indexes(folder: Path) -> dict[str, str]:
    """Energon's tar indexes (``<shard>.tar.idx`` beside each shard) by name, as sha256."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.tar.idx"))
    }


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_energon_prepares_a_pack_and_both_read_it_in_either_order(pack, images, request, tmp_path):
    folder = copy_of(request.getfixturevalue(pack), tmp_path)
    prepare(folder)
    theirs = energon_indexes(folder)
    assert sorted(theirs) == sorted(Path(p).name + ".idx" for p in shards_of(folder))
    check_samples(energon_samples(folder), images[1])
    check_ours(folder, images[1])  # verify: our sample indexes are still ours
    # shardstream after Energon: a new version, its indexes written again; Energon's left as they are
    result = ss.index(str(folder), overwrite=True)
    assert result.manifest.version == 2
    assert energon_indexes(folder) == theirs
    check_samples(energon_samples(folder), images[1])
    check_ours(folder, images[1])


def test_shardstream_indexes_a_folder_energon_prepared(images, tmp_path):
    wds = pytest.importorskip("webdataset", reason="webdataset is not installed (the test extras)")
    folder = tmp_path / "written"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%06d.tar"), maxcount=10, verbose=0) as sink:
        for key in sorted(images[1]):
            sink.write({"__key__": key, **images[1][key]})
    prepare(folder)
    theirs = energon_indexes(folder)
    assert len(theirs) == 3
    result = ss.index(str(folder))
    assert result.manifest.paths == [f"part-{i:06d}.tar" for i in range(3)]
    assert energon_indexes(folder) == theirs
    check_ours(folder, images[1])
    check_samples(energon_samples(folder), images[1])
