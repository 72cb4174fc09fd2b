"""NVIDIA DALI's webdataset reader, on the CPU, reads exactly the samples of a default tar pack and of
several shards: without indexes, with its own (``wds2idx``, written elsewhere), and split into 2 DALI
shards; shardstream still reads each after. DALI (about 520 MB of wheels) runs from an environment of
its own, ``.venv-dali``, that ``make dali-test`` builds; without it these tests skip."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.interop.clients import check_ours, check_samples, shards_of

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-dali" / "bin" / "python"
INSTALLED = ROOT / ".venv-dali" / ".installed"  # make dali-test's mark of a finished install
READER = Path(__file__).with_name("dali_read.py")

pytestmark = [
    pytest.mark.dali,
    pytest.mark.skipif(
        not INSTALLED.exists(), reason="DALI runs from .venv-dali, which make dali-test builds"
    ),
]


def dali_samples(*args: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(PYTHON), str(READER), *args],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return [
        {k: v if k == "__key__" else base64.b64decode(v) for k, v in json.loads(line).items()}
        for line in done.stdout.splitlines()
        if line.startswith("{")
    ]


@pytest.mark.parametrize("pack", ["tar_pack", "tar_shards"])
def test_dali_reads_the_shards(pack, images, request, tmp_path):
    folder = request.getfixturevalue(pack)
    paths = shards_of(folder)
    check_samples(dali_samples(*paths), images[1])
    (tmp_path / "idx").mkdir()
    check_samples(dali_samples("--index-dir", str(tmp_path / "idx"), *paths), images[1])
    check_samples(dali_samples("--shards", "2", *paths), images[1])
    check_ours(folder, images[1])
