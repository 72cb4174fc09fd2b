"""Packing video and audio: class folders give cls and classes, paired files of one key are one sample,
each clip's facts are read from its headers and recorded beside the manifest, and info sums them up."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.manifest import load_manifest
from shardstream.manifest.media_facts import (
    BLOCK,
    block_digests,
    read_media_facts,
    recorded_media,
)
from shardstream.storage import Store
from tests.media import audio, video


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Class folders of videos (2 s and 1 s), each with a JSON and a caption of the same key."""
    root = tmp_path_factory.mktemp("clips")
    for cls, seconds in (("jump", 2.0), ("run", 1.0)):
        (root / cls).mkdir()
        for i in range(2):
            (root / cls / f"c{i}.mp4").write_bytes(video(seconds=seconds))
            (root / cls / f"c{i}.json").write_text(json.dumps({"i": i}))
            (root / cls / f"c{i}.txt").write_text(f"{cls} {i}")
    return root


def test_class_folders_of_videos_and_their_paired_files(clips, tmp_path):
    ss.pack(clips, tmp_path / "ds", layout="imagefolder", workers=1, progress=False)
    m = load_manifest(str(tmp_path / "ds"))
    assert m.classes == ["jump", "run"]
    assert {f["name"] for f in m.fields} == {"cls", "json", "mp4", "txt"}
    assert m.num_samples == 4
    facts = read_media_facts(
        m.media.reference, Store(str(tmp_path / "ds")).read_bytes, m.stored_counts
    )
    assert facts.kinds == {"mp4": "video"}
    assert sorted(facts.columns["mp4"]["duration"].round(1).tolist()) == [1.0, 1.0, 2.0, 2.0]
    assert set(facts.columns["mp4"]["frames"].tolist()) == {10, 20}


def test_class_folders_of_recordings_are_detected(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        (tmp_path / "src" / cls / "x.wav").write_bytes(audio(seconds=0.5))
        (tmp_path / "src" / cls / "y.flac").write_bytes(
            audio(seconds=0.5, fmt="flac", codec="flac")
        )
    ss.pack(tmp_path / "src", tmp_path / "ds", workers=1, progress=False)
    m = load_manifest(str(tmp_path / "ds"))
    assert m.created["layout"] == "imagefolder" and m.classes == ["a", "b"]
    assert m.media.fields == ["flac", "wav"] and m.media.kinds == {"flac": "audio", "wav": "audio"}


def test_info_shows_hours_and_the_spread_of_durations(clips, tmp_path):
    ss.pack(clips, tmp_path / "ds", layout="imagefolder", workers=1, progress=False)
    result = CliRunner().invoke(cli, ["info", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    lines = dict(
        re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.strip().splitlines()
    )
    assert lines["mp4"].startswith(
        "0.00 hours in 4 video samples; seconds min 1.0, p10 1.0, median 1.5"
    )
    assert lines["mp4"].endswith("max 2.0")
    doc = json.loads(CliRunner().invoke(cli, ["info", str(tmp_path / "ds"), "--json"]).stdout)
    assert doc["media"]["mp4"]["hours"] == pytest.approx(6.0 / 3600, abs=1e-4)
    assert doc["media"]["mp4"]["seconds"]["median"] == pytest.approx(1.5, abs=0.1)


def test_shard_writer_records_media_facts(tmp_path):
    with ss.ShardWriter(str(tmp_path / "ds"), shard_size="1MB") as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "mp4": video(seconds=1.0 + i / 2), "cls": i})
    m = load_manifest(str(tmp_path / "ds"))
    facts = read_media_facts(
        m.media.reference, Store(str(tmp_path / "ds")).read_bytes, m.stored_counts
    )
    assert facts.columns["mp4"]["duration"].round(1).tolist() == [1.0, 1.5, 2.0]


def test_gc_keeps_the_media_facts(clips, tmp_path):
    ss.pack(clips, tmp_path / "ds", layout="imagefolder", workers=1, progress=False)
    name = load_manifest(str(tmp_path / "ds")).media.reference["file"]
    result = CliRunner().invoke(cli, ["gc", str(tmp_path / "ds"), "--keep", "1", "--delete"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "ds" / name).exists()


def durations(url) -> list[float]:
    m = load_manifest(str(url))
    facts = recorded_media(Store(str(url)), m)
    return facts.columns["mp4"]["duration"].round(1).tolist()


def test_append_merge_and_split_carry_the_facts(clips, tmp_path):
    ss.pack(clips, tmp_path / "a", layout="imagefolder", workers=1, progress=False, shuffle=False)
    for cls in ("jump", "run"):  # the same classes: an append must keep them
        other = tmp_path / "more" / cls
        other.mkdir(parents=True)
    (other / "z.mp4").write_bytes(video(seconds=3.0))
    (other / "z.json").write_text("{}")
    (other / "z.txt").write_text("run z")
    ss.pack(tmp_path / "more", tmp_path / "b", layout="imagefolder", workers=1, progress=False)
    assert durations(tmp_path / "a") == [2.0, 2.0, 1.0, 1.0]
    ss.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    assert durations(tmp_path / "merged") == [2.0, 2.0, 1.0, 1.0, 3.0]
    ss.pack(
        tmp_path / "more",
        tmp_path / "a",
        layout="imagefolder",
        workers=1,
        progress=False,
        append=True,
    )
    assert durations(tmp_path / "a") == [2.0, 2.0, 1.0, 1.0, 3.0]
    parts = ss.split(tmp_path / "a", tmp_path / "parts", {"x": 0.5, "y": 0.5})
    for name, m in parts.items():  # the stored samples of the shards each part lists
        assert len(durations(tmp_path / "parts" / name)) == int(m.stored_counts.sum())


def test_block_digests_of_large_media_are_written_kept_and_carried(tmp_path):
    big = video(seconds=10, size=(192, 256), noise=60, bit_rate=40_000_000)
    assert len(big) > BLOCK
    with ss.ShardWriter(str(tmp_path / "a"), samples_per_shard=1) as writer:
        writer.write({"__key__": "big", "mp4": big})
        writer.write({"__key__": "small", "mp4": video()})

    def blocks(url) -> list[bytes]:
        facts = recorded_media(Store(str(url)), load_manifest(str(url)))
        return [facts.block_digests("mp4", j) for j in range(int(facts.counts.sum()))]

    assert blocks(tmp_path / "a") == [block_digests(big), b""]
    ref = load_manifest(str(tmp_path / "a")).media.reference["blocks"]
    result = CliRunner().invoke(cli, ["gc", str(tmp_path / "a"), "--keep", "1", "--delete"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a" / ref["file"]).exists()
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ss.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "merged")
    assert blocks(tmp_path / "merged") == [block_digests(big), b""] * 2
    parts = ss.split(tmp_path / "merged", tmp_path / "parts", {"x": 0.5, "y": 0.5})
    carried = [d for name in parts for d in blocks(tmp_path / "parts" / name)]
    assert sorted(carried) == sorted([block_digests(big), b""] * 2)


def test_verify_checks_the_media_facts_file(clips, tmp_path):
    ss.pack(clips, tmp_path / "ds", layout="imagefolder", workers=1, progress=False)
    runner = CliRunner()
    assert runner.invoke(cli, ["verify", str(tmp_path / "ds")]).exit_code == 0
    side = next((tmp_path / "ds" / ".shardstream").glob("media-*.npy"))
    data = bytearray(side.read_bytes())
    data[-1] ^= 0xFF  # one changed byte in the recorded facts
    side.write_bytes(bytes(data))
    result = runner.invoke(cli, ["verify", str(tmp_path / "ds")])
    assert result.exit_code != 0
    assert f"{side.name} does not match its sha256 in the manifest" in result.output


def test_index_of_webdataset_tars_records_their_media_facts(tmp_path):
    import webdataset as wds

    folder = tmp_path / "wds"
    folder.mkdir()
    for shard in range(2):
        with wds.TarWriter(str(folder / f"train-{shard}.tar")) as sink:
            for i in range(2):
                sink.write(
                    {
                        "__key__": f"s{shard}-{i}",
                        "mp4": video(seconds=1.0 + i),
                        "wav": audio(seconds=0.5),
                    }
                )
    result = CliRunner().invoke(cli, ["index", str(folder / "train-{0..1}.tar"), "-q"])
    assert result.exit_code == 0, result.output
    m = load_manifest(str(folder))
    facts = recorded_media(Store(str(folder)), m)
    assert facts.kinds == {"mp4": "video", "wav": "audio"}
    assert facts.columns["mp4"]["duration"].tolist() == pytest.approx([1.0, 2.0, 1.0, 2.0], abs=0.1)
    assert facts.columns["wav"]["sample_rate"].tolist() == [8000] * 4


def test_verify_checks_the_block_digests_file(tmp_path):
    big = video(seconds=10, size=(192, 256), noise=60, bit_rate=40_000_000)
    with ss.ShardWriter(str(tmp_path / "ds"), samples_per_shard=1) as writer:
        writer.write({"__key__": "big", "mp4": big})
    runner = CliRunner()
    assert runner.invoke(cli, ["verify", str(tmp_path / "ds")]).exit_code == 0
    side = next((tmp_path / "ds" / ".shardstream").glob("media_blocks-*.npy"))
    data = bytearray(side.read_bytes())
    data[-1] ^= 0xFF  # one changed byte of a block's digest
    side.write_bytes(bytes(data))
    result = runner.invoke(cli, ["verify", str(tmp_path / "ds")])
    assert result.exit_code != 0
    assert f"{side.name} does not match its sha256 in the manifest" in result.output
