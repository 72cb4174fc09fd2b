"""Real multi-process DDP: torchrun starts gloo ranks that read a dataset through ShardDataset.loader.

Select these with ``pytest tests/ddp``; each torchrun takes a few seconds.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.sample_datasets import key_of
from tests.sample_datasets import write_dataset as _write_dataset
from tests.torchrun import torchrun as run_ranks

SCRIPT = Path(__file__).with_name("ddp_reader.py")
BATCH = 4
SEED = 7


def write_dataset(root: Path, counts) -> str:
    return _write_dataset(root, counts, make=lambda i: {"__key__": key_of(i), "txt": f"sample {i}"})


def torchrun(nproc: int, dataset: str, out: Path, *args: str) -> dict:
    run_ranks(nproc, SCRIPT, dataset, str(out), *args)
    mode = args[args.index("--mode") + 1]
    return json.loads((out / f"result-{mode}.json").read_text())


def check_epochs(result: dict, n: int, world: int) -> None:
    """Two epochs of ``n`` samples on ``world`` ranks: equal batches per rank, every sample, exactly
    the padding repeated (the start of the epoch), and a new order in the second epoch."""
    per_rank = -(-n // world)
    assert result["world_size"] == world and result["len"] == per_rank
    padding = world * per_rank - n
    orders = []
    for gathered in result["epochs"]:
        assert [g["rank"] for g in gathered] == list(range(world))
        assert {g["batches"] for g in gathered} == {-(-per_rank // BATCH)}  # the same on every rank
        assert all(len(g["keys"]) == per_rank for g in gathered)
        read = [k for g in gathered for k in g["keys"]]
        counted = Counter(read)
        assert set(counted) == {key_of(i) for i in range(n)}
        assert sum(c - 1 for c in counted.values()) == padding
        assert read[n:] == read[:padding]  # the padding repeats the start of the epoch
        orders.append(read)
    assert orders[0] != orders[1]


def test_ddp_ranks_read_equal_batches_covering_every_sample(tmp_path):
    counts = [1, 13, 4, 9, 2, 11, 6]  # 46 samples in 7 uneven shards: 46 = 3 * 16 - 2
    dataset = write_dataset(tmp_path, counts)
    out = tmp_path / "out"
    out.mkdir()
    result = torchrun(
        3, dataset, out, "--mode", "epochs", "--batch-size", str(BATCH), "--seed", str(SEED)
    )
    check_epochs(result, sum(counts), 3)


def test_ddp_resume_on_another_world_size(tmp_path):
    counts = [
        7,
        5,
        9,
        4,
        5,
    ]  # 30 samples: 10 per rank on 3, then 6 left: 3 per rank on 2, no padding
    n = sum(counts)
    dataset = write_dataset(tmp_path, counts)
    out = tmp_path / "out"
    out.mkdir()
    stopped = torchrun(
        3, dataset, out, "--mode", "stop", "--stop-after", "2", "--batch-size", str(BATCH)
    )
    first = stopped["epochs"][0]
    assert [g["batches"] for g in first] == [2, 2, 2]
    # every rank would save the same state
    assert all(g["state"] == first[0]["state"] for g in first)
    assert first[0]["state"]["consumed"] == 2 * BATCH
    assert (out / "state.json").exists()

    resumed = torchrun(2, dataset, out, "--mode", "resume", "--batch-size", str(BATCH))
    second = resumed["epochs"][0]
    assert resumed["world_size"] == 2
    assert resumed["batches_per_epoch"] == -(-(n // 2) // BATCH)
    assert resumed["samples_left"] == 3
    assert [len(g["keys"]) for g in second] == [3, 3]
    read = [k for g in first + second for k in g["keys"]]
    assert len(read) == n
    assert sorted(read) == [key_of(i) for i in range(n)]


def test_ddp_ranks_agree_on_the_version_each_epoch_starts_on(tmp_path):
    """``on_new_version="next_epoch"`` under DDP: a version published between two ranks' looks at the
    latest is not read by one rank alone; every epoch, both ranks read one version, each sample once."""
    import shardstream as ss
    from tests.packing.test_living import text_folder

    one = text_folder(tmp_path / "one", 6)
    two = text_folder(tmp_path / "two", 2, 100)
    dataset = str(tmp_path / "ds")
    ss.pack(str(tmp_path / "one"), dataset, samples_per_shard=3, progress=False, workers=1)
    out = tmp_path / "out"
    out.mkdir()
    run_ranks(
        2,
        Path(__file__).with_name("version_reader.py"),
        dataset,
        str(tmp_path / "two"),
        str(out),
    )
    epochs = json.loads((out / "result-versions.json").read_text())
    for gathered, version, keys in zip(epochs, (1, 1, 2), (one, one, one | two)):
        assert [g["version"] for g in gathered] == [version, version]
        read = [k for g in gathered for k in g["keys"]]
        assert sorted(read) == sorted(keys)  # every sample of that version, once
