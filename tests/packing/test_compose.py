"""``merge`` and ``split`` without copying: every sample read exactly once, parts disjoint and stable under
append, selections read exactly by ShardDataset (ranks, resume) and MixedDataset."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.errors import ShardstreamError
from shardstream.manifest import load_manifest
from shardstream.manifest.verify import verify
from tests.folders import folder_files
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
    # no shard copied: the manifest, and the sources' recorded image sizes in one side file
    names = folder_files(data / "AB")
    assert names[-1] == "_manifest.json"
    assert all(n.startswith(".shardstream/image_sizes-") for n in names[:-1])
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
    names = folder_files(data / "split/train")  # a manifest and a selection, no shard
    assert "_manifest.json" in names
    assert [n for n in names if n.startswith(".shardstream/selection-")]
    assert not [n for n in names if n.endswith((".tar", ".idx"))]
    with pytest.raises(ShardstreamError, match="selects some samples of its shards"):
        ss.pack(str(data / "split/train"), str(root / "resharded"), progress=False)
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


def test_a_split_again_over_itself_keeps_the_selection_its_manifest_names(two):
    """The same split written again with overwrite selects the same samples; its selection file is its own
    all the same, so the clean-up of what it replaced leaves the one its manifest names."""
    _, data, keys = two
    first = ss.split(data / "A", data / "split", {"train": 0.7, "val": 0.3}, seed=5)
    again = ss.split(data / "A", data / "split", {"train": 0.7, "val": 0.3}, seed=5, overwrite=True)
    for part in ("train", "val"):
        old, new = first[part].selection.reference, again[part].selection.reference
        assert old["sha256"] == new["sha256"] and old["file"] != new["file"]
        selections = [
            n
            for n in folder_files(data / "split" / part)
            if n.startswith(".shardstream/selection-")
        ]
        assert selections == [new["file"]]
        assert verify(str(data / "split" / part)).ok
    assert set(read_all(data / "split/train")) | set(read_all(data / "split/val")) == keys["A"]


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
    # run again: refused, suggesting only what these commands take (they have no --append)
    for args in (
        ["split", str(data / "M"), str(data / "S"), "--into", "train=0.9", "val=0.1"],
        ["merge", str(data / "A"), str(data / "B"), str(data / "M")],
    ):
        again = runner.invoke(cli, args)
        assert again.exit_code == 1
        assert "already holds a dataset" in again.output and "--overwrite" in again.output
        assert "--append" not in again.output


def image_folder(root, classes: tuple[str, ...], n: int, tag: str) -> None:
    """``n`` tiny PNGs per class folder (keys ``<class>/<tag><i>``): an ImageFolder tree."""
    from PIL import Image

    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("L", (2, 2), i).save(root / c / f"{tag}{i}.png")


def _name(classes: list[str], label) -> str:
    return classes[int(bytes(label)) if isinstance(label, (bytes, memoryview)) else int(label)]


@pytest.mark.parametrize("fmt", ["tar", "arrow"])
def test_merge_unifies_class_lists_and_every_label_names_its_class(tmp_path, fmt):
    import torch

    image_folder(tmp_path / "s1", ("cat", "dog"), 3, "a")
    image_folder(tmp_path / "s2", ("dog", "bird"), 4, "b")
    data = tmp_path / "data"
    for src, name in (("s1", "one"), ("s2", "two")):
        ss.pack(
            str(tmp_path / src),
            str(data / name),
            samples_per_shard=2,
            progress=False,
            workers=1,
            format=fmt,
        )
    m = ss.merge([data / "one", data / "two"], data / "both")
    assert m.classes == ["cat", "dog", "bird"]
    # no shard rewritten (a side file of the sources' recorded image sizes at most)
    assert not [
        n
        for n in folder_files(data / "both")
        if n != "_manifest.json" and not n.startswith(".shardstream/image_sizes-")
    ]
    head = json.loads((data / "both/_manifest.json").read_text())
    assert head["shardstream_manifest"] == 4  # older readers refuse it, rather than misread labels
    assert load_manifest(str(data / "two")).classes == ["bird", "dog"]  # ImageFolder: sorted
    assert head["relabel"]["maps"] == [[0, 1], [2, 1]]
    # the truth, from the sources: each key's class name as its source labels it
    truth = {}
    for name in ("one", "two"):
        classes = load_manifest(str(data / name)).classes
        for s in ss.ShardDataset(str(data / name), decode=None):
            truth[s["__key__"]] = _name(classes, s["cls"])
    assert len(truth) == 2 * 3 + 2 * 4
    assert all(key.split("/")[0] == c for key, c in truth.items())
    url, classes = str(data / "both"), m.classes

    def named(pairs) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, label in pairs:
            assert key not in out
            out[key] = _name(classes, label)
        return out

    for decode in (None, "torch"):
        ds = ss.ShardDataset(url, decode=decode, seed=1)
        assert named((s["__key__"], s["cls"]) for s in ds) == truth
        for workers in (0, 2):
            loader = ss.ShardDataset(url, decode=decode, seed=2).loader(
                batch_size=3, num_workers=workers
            )
            pairs = [
                (k, c)
                for b in loader
                for k, c in zip(
                    b["__key__"],
                    b["cls"] if decode else [b["cls"][i] for i in range(len(b["cls"]))],
                )
            ]
            assert named(pairs) == truth
        shard_map = ss.ShardMap(url, decode=decode)
        assert named((s["__key__"], s["cls"]) for s in shard_map) == truth
        dl = torch.utils.data.DataLoader(
            shard_map, batch_size=4, num_workers=2, collate_fn=lambda batch: batch
        )
        assert named((s["__key__"], s["cls"]) for b in dl for s in b) == truth
    # resharding its shards alone would give the stored labels: refused
    with pytest.raises(ShardstreamError, match="maps its sources' labels"):
        ss.pack(url, str(tmp_path / "resharded"), progress=False)
    # a split of the merge keeps each shard's map; so does an append to it (packed with its classes)
    parts = ss.split(url, data / "parts", {"x": 0.5, "y": 0.5}, seed=0)
    split_pairs = [
        (s["__key__"], s["cls"])
        for p in parts
        for s in ss.ShardDataset(str(data / "parts" / p), decode="torch")
    ]
    assert named(split_pairs) == truth
    if fmt == "tar":
        png = (tmp_path / "s2/bird/b0.png").read_bytes()
        with ss.ShardWriter(url, classes=classes, append=True) as writer:
            writer.write({"__key__": "bird/new", "cls": b"2", "png": png})
        assert load_manifest(url).version == 2
        got = named((s["__key__"], s["cls"]) for s in ss.ShardDataset(url, decode="torch"))
        assert got == {**truth, "bird/new": "bird"}


def test_a_relabeled_manifest_is_refused_where_it_could_be_misread(tmp_path, monkeypatch):
    from shardstream.manifest import schema

    image_folder(tmp_path / "s1", ("cat", "dog"), 1, "a")
    image_folder(tmp_path / "s2", ("bird",), 1, "b")
    for src, name in (("s1", "one"), ("s2", "two")):
        ss.pack(str(tmp_path / src), str(tmp_path / name), progress=False, workers=1)
    ss.merge([tmp_path / "one", tmp_path / "two"], tmp_path / "both")
    path = tmp_path / "both/_manifest.json"
    good = path.read_bytes()
    # a reader of manifest format 3 (the release before) refuses it, naming the fix
    monkeypatch.setattr(schema, "FORMAT_VERSION", 3)
    with pytest.raises(ShardstreamError, match="manifest version 4.*upgrade shardstream"):
        load_manifest(str(tmp_path / "both"))
    # and a reader of format 2 (before relabel) refuses one written as format 3
    doc = json.loads(good)
    path.write_text(json.dumps({**doc, "shardstream_manifest": 3}))
    monkeypatch.setattr(schema, "FORMAT_VERSION", 2)
    with pytest.raises(ShardstreamError, match="manifest version 3.*upgrade shardstream"):
        load_manifest(str(tmp_path / "both"))
    monkeypatch.undo()
    assert load_manifest(str(tmp_path / "both")).relabel is not None  # this release reads it
    # relabel in a format older readers read as plain labels: refused
    path.write_text(json.dumps({**doc, "shardstream_manifest": 1}))
    with pytest.raises(ShardstreamError, match="relabel needs version 3"):
        load_manifest(str(tmp_path / "both"))
    # a map naming a class the list lacks
    doc["relabel"]["maps"][1] = [7]
    path.write_text(json.dumps(doc))
    with pytest.raises(ShardstreamError, match="names a class outside its 3 classes"):
        load_manifest(str(tmp_path / "both"))
    # a label outside its source's map (the source replaced after the merge): a one-line error
    doc["relabel"]["maps"][1] = [2]
    doc["relabel"]["maps"][0] = [0]  # source one has 2 classes; its label 1 is outside this map
    path.write_text(json.dumps(doc))
    with pytest.raises(ShardstreamError, match="is not one of its source's 1 classes"):
        list(ss.ShardDataset(str(tmp_path / "both"), decode=None))
