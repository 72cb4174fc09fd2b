"""index: a manifest for existing WebDataset tars (brace pattern, list, folder), then cat and verify on them."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import webdataset as wds
import zstandard
from click.testing import CliRunner

from shardstream import ShardDataset
from shardstream.cli import cli
from shardstream.errors import CorruptShardError, DatasetExistsError, ShardstreamError
from shardstream.manifest.index_tars import IndexResult, index
from shardstream.manifest.verify import verify
from tests.folders import folder_files, indexed

NAMES = [f"shard-{i:06d}.tar" for i in range(3)]


def write_wds(
    folder: Path,
    n: int = 10,
    per_shard: int = 4,
    pattern: str = "shard-%06d.tar",
    big: bool = False,
) -> list[dict]:
    """``n`` samples written by webdataset.ShardWriter into ``folder``; returns what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    samples = [
        {"__key__": f"s{i:03d}", "txt": f"hello {i}", "cls": i % 3, "json": {"i": i, "tag": "é"}}
        for i in range(n)
    ]
    if big:
        for i, sample in enumerate(samples):
            sample["bin"] = bytes([i]) * 1500
    with wds.ShardWriter(str(folder / pattern), maxcount=per_shard, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    return samples


def tar_bytes(members: list[tuple[str, bytes | None]]) -> bytes:
    """A tar with these (name, data) members; data None makes a folder entry."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def invoke(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def assert_one_line_error(stderr: str, *names) -> str:
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for name in names:
        assert str(name) in lines[0], (name, stderr)
    return lines[0]


def sources_for(form: str, folder: Path) -> list[str]:
    if form == "brace":
        return [str(folder / "shard-{000000..000002}.tar")]
    if form == "list":
        return [str(folder / name) for name in NAMES]
    if form == "folder":
        return [str(folder)]
    raise AssertionError(form)


@pytest.mark.parametrize("form", ["brace", "list", "folder"])
def test_index_webdataset_tars(tmp_path, form):
    folder = tmp_path / "tars"
    write_wds(folder)
    assert sorted(p.name for p in folder.iterdir()) == NAMES
    result = index(sources_for(form, folder))
    m = result.manifest
    assert result.url == str(folder)
    assert m.shard_format == "tar"
    assert m.paths == NAMES
    assert m.stored_counts.tolist() == [4, 4, 2]
    assert m.nbytes.tolist() == [(folder / n).stat().st_size for n in NAMES]
    assert m.sha256 == [hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in NAMES]
    assert {f["name"]: f["samples"] for f in m.fields} == {"cls": 10, "json": 10, "txt": 10}
    assert result.unkeyed == []
    doc = json.loads((folder / "_manifest.json").read_text())
    assert doc["num_samples"] == 10
    assert doc["shards"]["path"] == NAMES
    # beside the tars: the manifest, and each tar's sample index in .shardstream/ (nothing else)
    assert folder_files(folder) == sorted([*indexed(*NAMES), "_manifest.json"])


@pytest.mark.parametrize("form", ["brace", "list", "folder"])
def test_the_public_index_reads_tars_as_the_command_does(tmp_path, form):
    import shardstream as ss

    folder = tmp_path / "tars"
    write_wds(folder)
    sources = sources_for(form, folder)
    seen: list[int] = []
    result = ss.index(sources[0] if len(sources) == 1 else sources, on_shard=seen.append)
    assert isinstance(result, IndexResult) and result.url == str(folder)
    assert result.manifest.shard_format == "tar" and result.manifest.paths == NAMES
    assert result.indexes_written and sorted(seen) == sorted(result.manifest.nbytes.tolist())
    assert len(list(ShardDataset(str(folder), decode=None))) == 10
    with pytest.raises(DatasetExistsError):
        ss.index(folder)  # a path, as well as a string
    assert ss.index([folder], overwrite=True).manifest.fingerprint == result.manifest.fingerprint
    with pytest.raises(ss.UsageError, match="index was given no files"):
        ss.index([])


@pytest.mark.parametrize("form", ["brace", "list", "folder"])
def test_cli_index_then_cat_and_verify(tmp_path, form):
    folder = tmp_path / "tars"
    samples = write_wds(folder)
    result = invoke("index", *sources_for(form, folder), "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("indexed 3 shards, 10 samples, ")
    assert result.stdout.strip().endswith(f"-> {folder}/_manifest.json")

    shown = invoke("cat", folder, "5")
    assert shown.exit_code == 0, shown.output
    assert "s005" in shown.stdout and "hello 5" in shown.stdout
    raw = invoke("cat", folder, "--key", "s009", "--field", "json")
    assert json.loads(raw.stdout_bytes) == samples[9]["json"]
    assert invoke("cat", folder, "7", "--field", "txt").stdout_bytes == b"hello 7"
    assert invoke("cat", folder, "7", "--field", "cls").stdout_bytes == b"1"

    checked = invoke("verify", folder, "-q")
    assert checked.exit_code == 0, checked.output
    assert checked.stdout.startswith("ok: 3 shards, 10 samples")


def test_index_in_real_processes(tmp_path):
    folder = tmp_path / "tars"
    write_wds(folder)
    exe = [sys.executable, "-m", "shardstream"]
    proc = subprocess.run(
        [*exe, "index", str(folder / "shard-{000000..000002}.tar")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "indexed 3 shards, 10 samples" in proc.stdout
    proc = subprocess.run([*exe, "verify", str(folder)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [*exe, "cat", str(folder), "--key", "s002", "--field", "txt"],
        capture_output=True,
        timeout=60,
    )
    assert proc.stdout == b"hello 2"


def test_output_folder_above_the_shards(tmp_path):
    folder = tmp_path / "data" / "tars"
    write_wds(folder)
    result = invoke(
        "index", folder / "shard-{000000..000001}.tar", "--output", tmp_path / "data", "-q"
    )
    assert result.exit_code == 0, result.output
    assert not (folder / "_manifest.json").exists()
    doc = json.loads((tmp_path / "data" / "_manifest.json").read_text())
    assert doc["shards"]["path"] == ["tars/shard-000000.tar", "tars/shard-000001.tar"]
    assert doc["num_samples"] == 8
    assert invoke("verify", tmp_path / "data", "-q").exit_code == 0
    assert invoke("cat", tmp_path / "data", "--field", "txt", "--", "-1").stdout_bytes == b"hello 7"


def test_shards_in_several_folders_default_to_their_common_folder(tmp_path):
    write_wds(tmp_path / "root" / "a", n=4)
    write_wds(tmp_path / "root" / "b", n=3)
    result = index([str(tmp_path / "root" / "a"), str(tmp_path / "root" / "b")])
    assert result.url == str(tmp_path / "root")
    assert result.manifest.paths == ["a/shard-000000.tar", "b/shard-000000.tar"]
    assert result.manifest.stored_counts.tolist() == [4, 3]
    assert verify(str(tmp_path / "root")).ok


def test_output_folder_that_does_not_hold_the_shards_is_refused(tmp_path):
    folder = tmp_path / "tars"
    write_wds(folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with pytest.raises(ShardstreamError) as info:
        index([str(folder)], output=str(elsewhere))
    assert str(elsewhere) in str(info.value)
    assert "shard-000000.tar" in str(info.value)
    result = invoke("index", folder, "--output", elsewhere, "-q")
    assert result.exit_code == 1
    assert_one_line_error(result.stderr, elsewhere)
    assert not (elsewhere / "_manifest.json").exists()
    assert not (folder / "_manifest.json").exists()


def test_existing_manifest_is_refused_without_overwrite(tmp_path):
    folder = tmp_path / "tars"
    write_wds(folder)
    index([str(folder)])
    before = (folder / "_manifest.json").read_bytes()
    write_wds(folder, n=14)  # now four shards
    with pytest.raises(DatasetExistsError) as info:
        index([str(folder)])
    assert str(folder) in str(info.value)
    assert (folder / "_manifest.json").read_bytes() == before
    result = invoke("index", folder, "-q")
    assert result.exit_code == 1
    assert "--overwrite" in assert_one_line_error(result.stderr, folder)
    assert (folder / "_manifest.json").read_bytes() == before

    result = invoke("index", folder, "-q", "--overwrite")
    assert result.exit_code == 0, result.output
    doc = json.loads((folder / "_manifest.json").read_text())
    assert doc["shards"]["samples"] == [4, 4, 4, 2]


def test_members_without_key_and_extension_are_reported_not_counted(tmp_path):
    folder = tmp_path / "tars"
    folder.mkdir()
    (folder / "a.tar").write_bytes(
        tar_bytes(
            [
                ("README", b"about this data"),
                ("images", None),
                ("images/k1.txt", b"one"),
                ("images/k1.cls", b"1"),
                (".hidden", b"h"),
                ("k2.txt", b"two"),
                ("trailing.", b"dot"),
            ]
        )
    )
    result = index([str(folder)])
    assert result.manifest.stored_counts.tolist() == [2]
    assert result.unkeyed == ["README", ".hidden", "trailing."]
    assert {f["name"]: f["samples"] for f in result.manifest.fields} == {"cls": 1, "txt": 2}

    cli_result = invoke("index", folder, "-q", "--overwrite")
    assert cli_result.exit_code == 0, cli_result.output
    assert cli_result.stdout.startswith("indexed 1 shard, 2 samples")
    assert "warning: 3 members have no KEY.EXT name" in cli_result.stderr
    assert "README" in cli_result.stderr
    assert invoke("verify", folder, "-q").exit_code == 0
    assert invoke("cat", folder, "1", "--field", "txt").stdout_bytes == b"two"


@pytest.mark.parametrize("as_list", [False, True])
def test_a_folder_mixing_tar_and_tar_gz_is_read_shard_by_shard(tmp_path, as_list):
    folder = tmp_path / "tars"
    folder.mkdir()
    (folder / "a.tar").write_bytes(tar_bytes([("k.txt", b"1")]))
    (folder / "b.tar.gz").write_bytes(gzip.compress(tar_bytes([("j.txt", b"2")])))
    sources = [str(folder / "a.tar"), str(folder / "b.tar.gz")] if as_list else [str(folder)]
    result = index(sources)
    assert result.manifest.shard_format == "tar"  # the mix: each shard read by its first bytes
    assert result.manifest.created["compressions"] == "gzip 1, none 1"
    assert [(s["__key__"], s["txt"]) for s in ShardDataset(str(folder), decode=None)] == [
        ("k", b"1"),
        ("j", b"2"),
    ]


def _damage(victim: Path, damage: str) -> None:
    data = bytearray(victim.read_bytes())
    if damage == "truncated inside a member":
        with tarfile.open(victim) as tf:
            member = next(m for m in tf.getmembers() if m.name.endswith(".bin"))
        data = data[: member.offset_data + 100]
    elif damage == "truncated in padding":
        with tarfile.open(victim) as tf:
            member = [m for m in tf.getmembers() if m.name.endswith(".bin")][1]
        data = data[
            : member.offset_data + member.size + 10
        ]  # the data is whole, its padding is cut
    elif damage == "truncated after a header":
        data = data[:700]  # the first member's PAX header, without the member itself
    elif damage == "bad header":
        data[0] ^= 0xFF
    else:
        data = bytearray(b"this is not a tar file at all" * 30)
    victim.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        "truncated inside a member",
        "truncated after a header",
        "truncated in padding",
        "bad header",
        "garbage",
    ],
)
def test_corrupt_tar_is_named_and_no_manifest_written(tmp_path, damage):
    folder = tmp_path / "tars"
    write_wds(folder, big=True)
    victim = folder / "shard-000001.tar"
    _damage(victim, damage)
    with pytest.raises(CorruptShardError) as info:
        index([str(folder)])
    assert str(victim) in str(info.value)
    assert not (folder / "_manifest.json").exists()
    result = invoke("index", folder, "-q")
    assert result.exit_code == 1
    assert_one_line_error(result.stderr, victim)
    assert not (folder / "_manifest.json").exists()


def test_corrupt_gzip_shard_is_named(tmp_path):
    folder = tmp_path / "tars"
    folder.mkdir()
    (folder / "a.tar.gz").write_bytes(gzip.compress(tar_bytes([("k.txt", b"1")])))
    (folder / "b.tar.gz").write_bytes(gzip.compress(tar_bytes([("j.txt", b"2")]))[:-10])
    with pytest.raises(CorruptShardError) as info:
        index([str(folder)])
    assert str(folder / "b.tar.gz") in str(info.value)
    assert not (folder / "_manifest.json").exists()


def test_compressed_tars(tmp_path):
    plain = tmp_path / "plain"
    write_wds(plain)
    gz, zst = tmp_path / "gz", tmp_path / "zst"
    gz.mkdir()
    zst.mkdir()
    for name in NAMES:
        data = (plain / name).read_bytes()
        (gz / f"{name}.gz").write_bytes(gzip.compress(data))
        (zst / f"{name}.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    for folder, fmt in ((gz, "tar.gz"), (zst, "tar.zst")):
        result = index([str(folder)])
        assert result.manifest.shard_format == fmt
        assert result.manifest.stored_counts.tolist() == [4, 4, 2]
        assert verify(str(folder)).ok
        assert invoke("cat", folder, "9", "--field", "txt").stdout_bytes == b"hello 9"


def test_folder_without_tars_is_refused(tmp_path):
    folder = tmp_path / "nothing"
    folder.mkdir()
    (folder / "notes.txt").write_text("hi")
    with pytest.raises(ShardstreamError) as info:
        index([str(folder)])
    assert str(folder) in str(info.value)
    result = invoke("index", folder, "-q")
    assert result.exit_code == 1
    assert_one_line_error(result.stderr, folder)


def test_missing_shard_in_a_pattern_is_named(tmp_path):
    folder = tmp_path / "tars"
    write_wds(folder)
    result = invoke("index", folder / "shard-{000000..000003}.tar", "-q")
    assert result.exit_code == 1
    assert_one_line_error(result.stderr, folder / "shard-000003.tar")
    assert not (folder / "_manifest.json").exists()


def test_the_same_shard_twice_is_refused(tmp_path):
    folder = tmp_path / "tars"
    write_wds(folder)
    with pytest.raises(ShardstreamError, match="twice"):
        index([str(folder / NAMES[0]), str(folder / NAMES[0])])
    assert not (folder / "_manifest.json").exists()


def test_indexing_a_packed_dataset_copy(tmp_path):
    """Tars from our own pack, without their manifest, index to the same counts and checksums."""
    from shardstream import pack

    src = tmp_path / "src"
    src.mkdir()
    for i in range(7):
        (src / f"{i}.txt").write_bytes(b"x" * i)
    packed = pack(src, tmp_path / "packed", samples_per_shard=3, workers=1, progress=False).manifest
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "packed", copy)
    (copy / "_manifest.json").unlink()
    m = index([str(copy)]).manifest
    assert m.paths == packed.paths
    assert m.stored_counts.tolist() == packed.stored_counts.tolist() == [3, 3, 1]
    assert m.sha256 == packed.sha256


# -- an interrupted pack is not a dataset (issue 10, finding 9) ------------------------------------------------


def interrupted_pack(tmp_path: Path) -> Path:
    """The folder a killed pack leaves: some shards, the in-progress marker, no manifest."""
    from shardstream.manifest.files import IN_PROGRESS

    folder = tmp_path / "ds"
    write_wds(folder, n=12, per_shard=4)
    (folder / "shard-000001.tar").unlink()  # a gap: the shard that was being written
    (folder / IN_PROGRESS).write_bytes(b"0123456789abcdef")
    return folder


@pytest.mark.parametrize("form", ["folder", "list", "output above"])
def test_index_refuses_the_shards_of_an_unfinished_pack(tmp_path, form):
    folder = interrupted_pack(tmp_path)
    shards = [str(folder / "shard-000000.tar"), str(folder / "shard-000002.tar")]
    sources, output = {
        "folder": ([str(folder)], None),
        "list": (shards, None),
        "output above": (shards, str(tmp_path)),
    }[form]
    with pytest.raises(ShardstreamError) as info:
        index(sources, output)
    text = str(info.value)
    assert "\n" not in text and str(folder) in text and "unfinished shardstream pack" in text
    assert "re-run the pack" in text and "--force" in text and ".shardstream-writing" in text
    assert not (folder / "_manifest.json").exists() and not (tmp_path / "_manifest.json").exists()


def test_cli_index_refuses_an_unfinished_pack_on_one_line_and_force_publishes_it(tmp_path):
    folder = interrupted_pack(tmp_path)
    result = invoke("index", folder, "-q")
    assert result.exit_code == 1
    assert "re-run the pack" in assert_one_line_error(result.stderr, folder)
    assert not (folder / "_manifest.json").exists()
    forced = index([str(folder)], force=True)  # the user knows the shards are complete
    assert forced.manifest.num_samples == 8
    assert not (folder / ".shardstream-writing").exists()
    assert verify(str(folder)).ok


def test_no_manifest_error_of_an_unfinished_pack_does_not_suggest_index(tmp_path):
    folder = interrupted_pack(tmp_path)
    result = invoke("info", folder)
    assert result.exit_code == 1
    line = assert_one_line_error(result.stderr, folder)
    assert "unfinished" in line and "re-run the pack" in line and "index" not in line
    (folder / ".shardstream-writing").unlink()
    # tars, no pack's marker
    assert "shardstream index" in assert_one_line_error(invoke("info", folder).stderr, folder)


def test_an_empty_file_is_not_a_tar(tmp_path):
    """Issue 10, finding 15: an empty file among the shards is named on one line, no manifest written."""
    folder = tmp_path / "tars"
    write_wds(folder, n=8, per_shard=4)
    empty = folder / "shard-000002.tar"
    empty.write_bytes(b"")
    with pytest.raises(CorruptShardError, match="empty file, not a tar"):
        index([str(folder)])
    result = invoke("index", folder, "-q")
    assert result.exit_code == 1
    assert "empty file" in assert_one_line_error(result.stderr, empty)
    assert not (folder / "_manifest.json").exists()


def test_index_overwrite_over_a_dataset_with_versions_publishes_the_next_version(tmp_path):
    """A folder that was appended to holds version files; an index written over it as version 1 was never
    read (every reader followed the old version files past it). It is the next version, and the earlier
    ones stay readable until gc removes them."""
    from shardstream import ShardWriter
    from shardstream.manifest import dataset_store, load_manifest
    from shardstream.manifest.versions import history

    folder = tmp_path / "ds"
    for tag, append in (("a", False), ("b", True)):
        with ShardWriter(str(folder), samples_per_shard=4, append=append) as w:
            for i in range(6):
                w.write({"__key__": f"{tag}/{i:03d}", "txt": f"{tag} {i}"})
    write_wds(folder, n=5, pattern="extra-%06d.tar")  # another tool's tar in the same folder
    result = invoke("index", folder, "--overwrite", "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("indexed 6 shards, 17 samples, ")
    assert " as version 3 -> " in result.stdout
    latest = load_manifest(str(folder))
    assert (latest.version, latest.num_samples) == (3, 17)
    keys = {s["__key__"] for s in ShardDataset(str(folder), decode=None, shuffle=False)}
    assert len(keys) == 17 and {f"s{i:03d}" for i in range(5)} <= keys
    assert "samples  17" in invoke("info", folder).stdout
    assert load_manifest(str(folder), version=2).num_samples == 12  # still readable
    assert [(e.version, e.operation) for e in history(dataset_store(str(folder)))] == [
        (1, "pack"),
        (2, "append"),
        (3, "index"),
    ]
    assert verify(str(folder)).ok
