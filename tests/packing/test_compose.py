"""``merge`` and ``split`` without copying: every sample read exactly once, parts disjoint and stable under
append, selections read exactly by ShardDataset (ranks, resume) and MixedDataset."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.errors import ShardstreamError
from shardstream.manifest import load_manifest
from shardstream.manifest.verify import verify
from tests.packing.test_living import pack_quiet, read_all, text_folder


def sample_bytes(key: str) -> bytes:
    cls, number = key.split("/")
    return f"{cls}-{int(number)}-".encode() * 7


@pytest.fixture
def two(tmp_path):
    data = tmp_path / "data"
    keys = {
        "A": text_folder(tmp_path / "src-a", 10),
        "B": text_folder(tmp_path / "src-b", 7, 100),
    }
    pack_quiet(tmp_path / "src-a", data / "A")
    pack_quiet(tmp_path / "src-b", data / "B")
    return tmp_path, data, keys


def test_merge_reads_every_sample_of_its_sources_once_and_copies_no_shard(two):
    _, data, keys = two
    m = ss.merge([data / "A", data / "B"], data / "AB")
    assert os.listdir(data / "AB") == ["_manifest.json"]  # no shard copied
    assert m.roots == ["../A", "../B"]
    a, b = load_manifest(str(data / "A")), load_manifest(str(data / "B"))
    assert list(m.sha256) == list(a.sha256) + list(b.sha256)
    assert m.paths == [f"../A/{p}" for p in a.paths] + [f"../B/{p}" for p in b.paths]
    got = read_all(data / "AB")
    assert set(got) == keys["A"] | keys["B"]
    assert all(value == sample_bytes(key) for key, value in got.items())
    assert verify(str(data / "AB")).ok


def test_merge_refuses_other_data_and_a_destination_that_is_a_source(two):
    root, data, _ = two
    text_folder(root / "src-c", 2, ext="json")
    pack_quiet(root / "src-c", data / "C")
    with pytest.raises(ShardstreamError, match=r"cannot merge .*C with .*A: the first fields are"):
        ss.merge([data / "A", data / "C"], data / "AC")
    with pytest.raises(ShardstreamError, match="is one of the sources"):
        ss.merge([data / "A", data / "B"], data / "A")
    with pytest.raises(ShardstreamError, match="a folder above"):
        ss.merge([data / "A"], data)


def test_split_parts_are_disjoint_hold_every_sample_and_stay_put_under_append(two):
    root, data, keys = two
    parts = ss.split(data / "A", data / "split", {"train": 0.7, "val": 0.3}, seed=5)
    train, val = read_all(data / "split/train"), read_all(data / "split/val")
    assert not set(train) & set(val)
    assert set(train) | set(val) == keys["A"]
    assert all(value == sample_bytes(key) for key, value in {**train, **val}.items())
    assert parts["train"].num_samples == len(train) and parts["val"].num_samples == len(val)
    assert os.listdir(data / "split/train") != []  # a manifest and a selection, no shard
    assert not [n for n in os.listdir(data / "split/train") if n.endswith(".tar")]
    # append to the source, split again: every sample stays in its part, the new ones are split too
    added = text_folder(root / "more", 6, 500)
    pack_quiet(root / "more", data / "A", append=True)
    ss.split(data / "A", data / "split2", {"train": 0.7, "val": 0.3}, seed=5)
    train2, val2 = read_all(data / "split2/train"), read_all(data / "split2/val")
    assert set(train) <= set(train2) and set(val) <= set(val2)
    assert set(train2) | set(val2) == keys["A"] | added and not set(train2) & set(val2)
    # another seed, other parts
    ss.split(data / "A", data / "split3", {"train": 0.7, "val": 0.3}, seed=6)
    assert set(read_all(data / "split3/train")) != set(train2)
    with pytest.raises(ShardstreamError, match="add up to 1"):
        ss.split(data / "A", data / "bad", {"train": 0.7, "val": 0.2})


def test_a_split_is_read_exactly_by_ranks_by_resume_and_by_a_mix(two):
    _, data, keys = two
    ss.merge([data / "A", data / "B"], data / "AB")
    ss.split(data / "AB", data / "parts", {"train": 0.6, "val": 0.4}, seed=1)
    url = str(data / "parts/train")
    everything = set(read_all(url))
    per_rank = []
    for rank in range(2):
        ds = ss.ShardDataset(url, rank=rank, world_size=2, seed=3, decode=None, drop_last=True)
        per_rank.append([s["__key__"] for s in ds])
        again = [
            s["__key__"]
            for s in ss.ShardDataset(
                url, rank=rank, world_size=2, seed=3, decode=None, drop_last=True
            )
        ]
        assert again == per_rank[-1]  # deterministic
    assert len(per_rank[0]) == len(per_rank[1]) == len(everything) // 2
    assert not set(per_rank[0]) & set(per_rank[1])
    # resume mid-epoch: the rest, nothing repeated or skipped
    loader = ss.ShardDataset(url, seed=3, decode=None).loader(batch_size=2)
    it = iter(loader)
    first = [k for _ in range(2) for k in next(it)["__key__"]]
    state = loader.state_dict()
    resumed = ss.ShardDataset(url, seed=3, decode=None).loader(batch_size=2)
    resumed.load_state_dict(state)
    rest = [k for batch in resumed for k in batch["__key__"]]
    assert sorted(first + rest) == sorted(everything)
    # a mix of both parts, by their sizes: every sample of each once per epoch
    sources = [ss.ShardDataset(str(data / f"parts/{p}"), decode=None) for p in ("train", "val")]
    mixed = [s["__key__"] for s in ss.MixedDataset(sources)]
    assert sorted(mixed) == sorted(keys["A"] | keys["B"])


def test_merge_and_split_on_the_command_line(two):
    _, data, keys = two
    runner = CliRunner()
    done = runner.invoke(cli, ["merge", str(data / "A"), str(data / "B"), str(data / "M")])
    assert done.exit_code == 0, done.output
    assert "no shard copied" in done.output
    done = runner.invoke(
        cli,
        [
            "split",
            str(data / "M"),
            str(data / "S"),
            "--into",
            "train=0.9",
            "val=0.1",
            "--seed",
            "2",
        ],
    )
    assert done.exit_code == 0, done.output
    assert set(read_all(data / "S/train")) | set(read_all(data / "S/val")) == keys["A"] | keys["B"]
    done = runner.invoke(cli, ["log", str(data / "S/train")])
    assert done.exit_code == 0 and " split" in done.output
