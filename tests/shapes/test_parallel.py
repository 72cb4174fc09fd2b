"""Parallel: tensor-parallel members read identical batches, data-parallel groups split the data, and
a state resumes on another data-parallel size; with real processes (torchrun, gloo, DP 2 x TP 2)."""

from __future__ import annotations

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardstream import ShardWriter
from shardstream.dataset import MixedDataset, ShardDataset, TokenDataset
from shardstream.dataset.parallel import Parallel
from shardstream.errors import UsageError
from tests.sample_datasets import key_of, write_dataset
from tests.torchrun import torchrun as run_ranks

SCRIPT = Path(__file__).with_name("parallel_reader.py")
COUNTS = [5, 9, 4, 8]  # 26: 13 per DP rank of 2; after a batch of 3 each, 20 left: 5 on each of 4
PICS, ASPECTS = 29, [(16, 8), (8, 8), (8, 16)]  # images of three aspect buckets


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height)).save(out, format="JPEG")
    return out.getvalue()


def text(name: str):
    return lambda i: {"__key__": f"{name}{i:03d}", "txt": f"{name} {i}"}


def skewed(i: int) -> dict:
    """Short sequences in the first half (the first DP rank's, unshuffled), long ones in the second."""
    return {"__key__": key_of(i), "ids.npy": np.arange(1 + i % 3 if i < 16 else 12 + i % 9)}


def test_parallel_plans_for_the_data_parallel_rank(tmp_path):
    url = write_dataset(tmp_path, COUNTS)
    by_parallel = ShardDataset(url, decode=None, parallel=Parallel(dp_rank=1, dp_size=2))
    by_rank = ShardDataset(url, decode=None, rank=1, world_size=2)
    assert (by_parallel.rank, by_parallel.world_size) == (1, 2) and len(by_parallel) == 13
    assert [s["__key__"] for s in by_parallel] == [s["__key__"] for s in by_rank]


def test_parallel_refuses_bad_coordinates_and_a_second_rank(tmp_path):
    url = write_dataset(tmp_path, COUNTS)
    for bad in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(UsageError, match="dp_rank must be in"):
            Parallel(*bad)
    with pytest.raises(UsageError, match="must be an int"):
        Parallel(0.5, 2)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="either parallel= or rank="):
        ShardDataset(url, decode=None, rank=0, parallel=Parallel(0, 2))
    with pytest.raises(UsageError, match="takes a shardstream.Parallel"):
        ShardDataset(url, decode=None, parallel=(0, 2))  # type: ignore[arg-type]


class FakeMesh:
    """A DeviceMesh's naming surface (a real one needs a process group: see the torchrun test)."""

    mesh_dim_names = ("pp", "dp_replicate", "dp_shard", "tp")
    shape = (2, 2, 3, 2)
    coords = (1, 1, 2, 0)

    def size(self, dim: int) -> int:
        return self.shape[dim]

    def get_local_rank(self, name: str) -> int:
        return self.coords[self.mesh_dim_names.index(name)]


def test_from_mesh_flattens_the_named_dimensions():
    assert Parallel.from_mesh(FakeMesh(), dp="dp_shard") == Parallel(2, 3)
    assert Parallel.from_mesh(FakeMesh(), dp=("dp_replicate", "dp_shard")) == Parallel(5, 6)
    with pytest.raises(UsageError, match="no dimension 'dp'"):
        Parallel.from_mesh(FakeMesh())


def test_token_and_mixed_datasets_take_parallel(tmp_path):
    from tests.dataset.test_mixed import token_dataset

    url = token_dataset(tmp_path, "t", [list(range(1, 40)), list(range(50, 90))])
    tokens = TokenDataset(url, 4, parallel=Parallel(1, 2))
    assert (tokens.rank, tokens.world_size) == (1, 2)
    data = write_dataset(tmp_path / "m", COUNTS)
    mix = MixedDataset([ShardDataset(data, decode=None)], parallel=Parallel(1, 3))
    assert (mix.rank, mix.world_size, len(mix)) == (1, 3, 9)


def torchrun(root: Path, out: Path) -> list[dict]:
    run_ranks(4, SCRIPT, str(root), str(out), timeout=240)
    return json.loads((out / "result.json").read_text())


def test_dp2_tp2_processes_split_by_data_parallel_group(tmp_path):
    write_dataset(tmp_path, COUNTS, name="data")
    write_dataset(tmp_path, [7, 6], name="a", make=text("a"))
    write_dataset(tmp_path, [4, 5], name="b", make=text("b"))
    write_dataset(tmp_path, [16, 16], name="seqs", make=skewed)
    with ShardWriter(str(tmp_path / "pics"), samples_per_shard=9) as writer:  # image sizes recorded
        for i in range(PICS):
            writer.write({"__key__": key_of(i), "jpg": jpeg(*ASPECTS[i % len(ASPECTS)])})
    out = tmp_path / "out"
    out.mkdir()
    got = torchrun(tmp_path, out)
    assert [g["rank"] for g in got] == [0, 1, 2, 3]
    assert [tuple(g["dp"]) for g in got] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    assert [g["tp"] for g in got] == [0, 1, 0, 1]
    for a, b in ((0, 1), (2, 3)):  # a TP group: identical batches
        assert got[a]["epoch"] == got[b]["epoch"] and got[a]["mix"] == got[b]["mix"]
        assert got[a]["resumed"] != got[b]["resumed"]  # on DP 4, each process its own part
    assert all(g["len"] == 13 for g in got)
    # packing and buckets: the ranks agree on a batch count per window (all_reduce), though the first
    # DP group's windows hold short sequences and the second's long ones
    for shape in ("packed", "buckets"):
        assert len({len(g[shape]) for g in got}) == 1
        assert got[0][shape] == got[1][shape] and got[2][shape] == got[3][shape]
        read = [k for r in (0, 2) for b in got[r][shape] for k in b]
        assert sorted(read) == [key_of(i) for i in range(32)] and all(
            b for g in got for b in g[shape]
        )
    dp0 = [k for b in got[0]["epoch"] for k in b]
    dp1 = [k for b in got[2]["epoch"] for k in b]
    assert not set(dp0) & set(dp1)  # DP groups: disjoint, together every sample once
    assert sorted(dp0 + dp1) == [key_of(i) for i in range(sum(COUNTS))]
    assert len(got[0]["mix"]) == len(got[2]["mix"])  # equal batch counts
    for g in got:
        assert all(len({k[0] for k in batch}) == 1 for batch in g["mix"])
    # resumed on DP 4 from the DP-2 state after one batch: every sample exactly once
    assert all(g["state"] == got[0]["state"] for g in got)
    first = [k for r in (0, 2) for b in got[r]["first"] for k in b]
    rest = [k for g in got for b in g["resumed"] for k in b]
    assert Counter(first + rest) == Counter(key_of(i) for i in range(sum(COUNTS)))
    # Bucketed planned from recorded image sizes: no collective, yet the same batches in a TP group,
    # equal counts, every sample once; resumed on DP 4 after two batches on DP 2: each sample once
    assert all(g["planned_up_front"] for g in got)
    assert got[0]["planned"] == got[1]["planned"] and got[2]["planned"] == got[3]["planned"]
    assert len({len(g["planned"]) for g in got}) == 1
    planned = [k for r in (0, 2) for b in got[r]["planned"] for k in b]
    assert Counter(planned) == Counter(key_of(i) for i in range(PICS))
    first = [k for r in (0, 2) for b in got[r]["planned_first"] for k in b]
    rest = [k for g in got for b in g["planned_resumed"] for k in b]
    assert len({len(g["planned_resumed"]) for g in got}) == 1
    assert Counter(first + rest) == Counter(key_of(i) for i in range(PICS))
