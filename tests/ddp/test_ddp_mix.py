"""A 3-source mix on real torchrun gloo ranks: equal batches, the planned multiset, resume on fewer ranks."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.ddp.mix_reader import SAMPLES_PER_EPOCH, make_mix
from tests.sample_datasets import write_dataset
from tests.torchrun import torchrun as run_ranks

SCRIPT = Path(__file__).with_name("mix_reader.py")
SIZES = {"a": [5, 7, 3], "b": [4, 4], "c": [2, 9, 1]}


def torchrun(nproc: int, root: Path, out: Path, mode: str) -> list[dict]:
    run_ranks(nproc, SCRIPT, str(root), str(out), "--mode", mode)
    return json.loads((out / f"result-{mode}.json").read_text())


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ddp-mix")
    for name, counts in SIZES.items():
        write_dataset(
            root,
            counts,
            name=name,
            make=lambda i, n=name: {"__key__": f"{n}{i:03d}", "txt": f"{n} {i}"},
        )
    return root


def planned(root: Path) -> list[str]:
    return [k for batch in make_mix(str(root)).loader(3, 0) for k in batch["__key__"]]


def test_three_ranks_read_equal_batches_and_the_planned_multiset(root, tmp_path):
    gathered = torchrun(3, root, tmp_path, "epoch")
    order = planned(root)
    per_rank = -(-SAMPLES_PER_EPOCH // 3)  # 14: two positions of padding
    assert [g["rank"] for g in gathered] == [0, 1, 2]
    assert {g["len"] for g in gathered} == {per_rank} and {g["batches"] for g in gathered} == {5}
    read = [k for g in gathered for k in g["keys"]]
    assert read[:SAMPLES_PER_EPOCH] == order  # the world-size-free global order, cut in three spans
    assert Counter(read) == Counter(order) + Counter(order[: 3 * per_rank - SAMPLES_PER_EPOCH])
    assert Counter(k[0] for k in order) == {"a": 20, "b": 12, "c": 8}
    assert all(k[0] == "abc"[s] for g in gathered for k, s in zip(g["keys"], g["sources"]))


def test_stop_on_three_ranks_and_resume_on_two(root, tmp_path):
    first = torchrun(3, root, tmp_path, "stop")
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["world_size"] == 3 and state["consumed"] == 6
    second = torchrun(2, root, tmp_path, "resume")
    # equal on both ranks: nothing for DDP to hang on
    assert len({g["batches"] for g in second}) == 1
    read = Counter(k for g in first + second for k in g["keys"])
    order = planned(root)
    assert read == Counter(order)  # 40 - 18 = 22 left, 11 per rank: every position once, no padding
