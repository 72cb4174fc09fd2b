"""The ``shardstream`` command: pack, info, ls, cat, verify end to end, and one-line errors on bad input."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import pty
import random
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from shardstream.cli import cli
from shardstream.manifest.side_names import version_name
from tests.folders import folder_files, indexed
from tests.oslimits import permission_preexec, tiny_tmpfs
from tests.sample_datasets import make_files, without_run

pack_module = importlib.import_module("shardstream.packing.driver")

_EXE = Path(sys.executable).with_name("shardstream")
SHARDSTREAM = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "shardstream"]


# -- helpers ------------------------------------------------------------------------------------------------


def run(
    *args: str | Path, preexec_fn=None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The real ``shardstream`` executable in a subprocess; stdout and stderr as bytes."""
    return subprocess.run(
        [*SHARDSTREAM, *map(str, args)],
        capture_output=True,
        preexec_fn=preexec_fn,
        cwd=cwd,
        timeout=120,
    )


def invoke(*args: str | Path):
    """``shardstream`` in this process through click's test runner."""
    result = CliRunner().invoke(cli, [str(a) for a in args])
    # errors end with sys.exit, never with an exception escaping the command
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result


def assert_one_line_error(stderr: str | bytes, *names: str | Path) -> str:
    """``stderr`` is exactly one ``error:`` line naming every one of ``names``; returns it."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert lines[0].startswith("error: "), text
    for name in names:
        assert str(name) in lines[0], (name, text)
    return lines[0]


def image_tree(root: Path) -> Path:
    rng = random.Random(5)
    return make_files(
        root,
        {f"{cls}/{i}.jpg": rng.randbytes(300 + 50 * i) for cls in ("dog", "cat") for i in range(3)},
    )


@pytest.fixture
def images_ds(tmp_path) -> tuple[Path, Path]:
    """(source, dataset): six images of two classes in three tar shards."""
    src = image_tree(tmp_path / "images")
    dest = tmp_path / "images-ds"
    result = invoke(
        "pack", src, dest, "--samples-per-shard", "2", "--workers", "1", "-q", "--no-shuffle"
    )
    assert result.exit_code == 0, result.output
    return src, dest


@pytest.fixture
def table_ds(tmp_path) -> Path:
    table = pa.table(
        {
            "id": list(range(10)),
            "name": [f"n{i}" for i in range(10)],
            "blob": [bytes([i]) * 3 for i in range(10)],
        }
    )
    pq.write_table(table, tmp_path / "t.parquet")
    dest = tmp_path / "table-ds"
    result = invoke(
        "pack", tmp_path / "t.parquet", dest, "--samples-per-shard", "4", "-q", "--no-shuffle"
    )
    assert result.exit_code == 0, result.output
    return dest


def _file_size_limit(limit: int):
    def preexec() -> None:
        # a write past the limit fails with EFBIG instead
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


def big_source(root: Path, files: int = 4, size: int = 400_000) -> Path:
    rng = random.Random(1)
    return make_files(root, {f"f{i}.bin": rng.randbytes(size) for i in range(files)})


# -- the verbs, end to end -----------------------------------------------------------------------------------


def test_pack_info_verify_in_real_processes(tmp_path):
    src = image_tree(tmp_path / "images")
    dest = tmp_path / "ds"
    proc = run("pack", src, dest, "--samples-per-shard", "2", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    summary = proc.stdout.decode().strip()
    assert re.fullmatch(
        rf"packed 6 samples into 3 tar shards, [\d.]+ [KM]?B \(from [\d.]+ [KM]?B of files\) in [\d.]+ s "
        rf"\([\d.]+ MB/s\) -> {re.escape(str(dest))}"
        r"; layout imagefolder, 2 classes",
        summary,
    ), summary
    assert b"Traceback" not in proc.stderr

    info = run("info", dest, "--json")
    assert info.returncode == 0, info.stderr
    doc = json.loads(info.stdout)
    assert (doc["num_samples"], doc["num_shards"], doc["shard_format"]) == (6, 3, "tar")
    assert doc["classes"] == ["cat", "dog"]

    verify = run("verify", dest)
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.decode().startswith("ok: 3 shards, 6 samples")


def test_module_entry_point_and_version():
    proc = subprocess.run(
        [sys.executable, "-m", "shardstream", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert "shardstream" in proc.stdout and "0." in proc.stdout


def test_pack_summary_counts_hidden_files(tmp_path):
    src = make_files(
        tmp_path / "src", {"a.txt": b"a", ".DS_Store": b"x", "sub/.git/x": b"x", "sub/b.txt": b"b"}
    )
    result = invoke("pack", src, tmp_path / "out", "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("packed 2 samples into 1 tar shard, ")
    assert "MB/s" in result.stdout
    assert "skipped 2 hidden" in result.stdout


def test_pack_options_reach_the_dataset(tmp_path):
    src = make_files(tmp_path / "src", {f"{i:02d}.txt": b"x" * 200 for i in range(7)})
    dest = tmp_path / "out"
    result = invoke(
        "pack",
        src,
        dest,
        "--compression",
        "zstd",
        "--samples-per-shard",
        "3",
        "--workers",
        "1",
        "-q",
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((dest / "_manifest.json").read_text())
    assert doc["shard_format"] == "tar.zst"
    assert doc["shards"]["samples"] == [3, 3, 1]
    assert [without_run(p) for p in doc["shards"]["path"]] == [
        f"shard-00000{i}.tar.zst" for i in range(3)
    ]

    result = invoke("pack", src, dest, "--format", "arrow", "--overwrite", "-q", "--no-shuffle")
    assert result.exit_code == 0, result.output
    doc = json.loads((dest / "_manifest.json").read_text())
    assert doc["shard_format"] == "arrow"
    assert [without_run(n) for n in folder_files(dest)] == sorted(
        [
            "_manifest.json",
            version_name(2),  # the overwrite is version 2, published by its version file
            "shard-000000.arrow",
        ]
    )


@pytest.mark.parametrize("flag, syncs", [("--fsync", True), ("--no-fsync", False)])
def test_pack_fsync_flag_reaches_the_writer(tmp_path, monkeypatch, flag, syncs):
    src = make_files(tmp_path / "src", {f"{i:02d}.txt": b"x" * 200 for i in range(3)})
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    result = invoke("pack", src, tmp_path / "out", flag, "--workers", "1", "-q")
    assert result.exit_code == 0, result.output
    assert bool(synced) is syncs


def test_pack_table_defaults_to_arrow_and_takes_tar(tmp_path):
    table = pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]})
    pcsv.write_csv(table, tmp_path / "t.csv")
    assert invoke("pack", tmp_path / "t.csv", tmp_path / "a", "-q", "--no-shuffle").exit_code == 0
    assert json.loads((tmp_path / "a" / "_manifest.json").read_text())["shard_format"] == "arrow"
    assert (
        invoke(
            "pack", tmp_path / "t.csv", tmp_path / "b", "--format", "tar", "-q", "--no-shuffle"
        ).exit_code
        == 0
    )
    assert json.loads((tmp_path / "b" / "_manifest.json").read_text())["shard_format"] == "tar"
    result = invoke("cat", tmp_path / "b", "2", "--field", "y")
    assert result.stdout_bytes == b"c"


def run_on_terminal(*args: str | Path) -> tuple[int, bytes, bytes]:
    """(exit code, stdout, what reached the terminal) of ``shardstream`` with stderr on an 80x24 terminal."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    try:
        proc = subprocess.Popen(
            [*SHARDSTREAM, *map(str, args)], stdout=subprocess.PIPE, stderr=follower
        )
        os.close(follower)
        seen = b""
        while select.select([leader], [], [], 60)[0]:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed
                break
            if not chunk:
                break
            seen += chunk
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    return proc.returncode, out, seen


def test_pack_shows_a_progress_bar_on_a_terminal(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 100 for i in range(5)})
    code, out, seen = run_on_terminal("pack", src, tmp_path / "out", "--workers", "1")
    assert code == 0
    assert b"packing" in seen
    assert out.startswith(b"packed 5 samples")


def test_quiet_pack_prints_no_progress_on_a_terminal(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 100 for i in range(5)})
    code, out, seen = run_on_terminal("pack", src, tmp_path / "out", "--workers", "1", "-q")
    assert code == 0
    assert b"packing" not in seen
    assert out.startswith(b"packed 5 samples")


def test_info_human(images_ds):
    _, dest = images_ds
    result = invoke("info", dest)
    assert result.exit_code == 0, result.output
    lines = dict(
        re.split(r"\s{2,}", line, maxsplit=1) for line in result.stdout.strip().splitlines()
    )
    assert lines["dataset"] == str(dest)
    assert lines["format"] == "tar"
    assert lines["samples"] == "6"
    assert lines["shards"].startswith("3 (mean ") and lines["shards"].endswith(", 2 samples each)")
    assert lines["fields"] == "cls (6), jpg (6)"
    assert lines["classes"] == "2: cat, dog"
    assert "shardstream" in lines["created"]


def test_info_json(images_ds):
    src, dest = images_ds
    result = invoke("info", dest, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["num_samples"] == 6
    assert doc["num_shards"] == 3
    assert doc["classes"] == ["cat", "dog"]
    assert {f["name"]: f["samples"] for f in doc["fields"]} == {"cls": 6, "jpg": 6}
    assert doc["total_bytes"] == sum(p.stat().st_size for p in dest.glob("shard-*.tar"))
    assert doc["created"]["source"] == str(src)


def test_info_arrow_and_manifest_path(table_ds):
    result = invoke("info", table_ds / "_manifest.json")
    assert result.exit_code == 0, result.output
    assert "format   arrow" in result.stdout
    assert "id: int64" in result.stdout and "name: string" in result.stdout
    assert "samples  10" in result.stdout


def test_ls_lists_every_shard(images_ds):
    _, dest = images_ds
    result = invoke("ls", dest)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].split() == ["shard", "samples", "size", "sha256"]
    doc = json.loads((dest / "_manifest.json").read_text())
    rows = lines[1:-1]
    assert len(rows) == 3
    for row, path, digest in zip(rows, doc["shards"]["path"], doc["shards"]["sha256"]):
        cols = row.split()
        assert cols[0] == path
        assert cols[1] == "2"
        assert cols[-1] == digest[:16]
    assert lines[-1].startswith("3 shards, 6 samples, ")


def test_ls_json(table_ds):
    result = invoke("ls", table_ds, "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["samples"] for r in rows] == [4, 4, 2]
    assert [without_run(r["path"]) for r in rows] == [f"shard-00000{i}.arrow" for i in range(3)]
    assert all(r["bytes"] == (table_ds / r["path"]).stat().st_size for r in rows)


def _cat_fields(stdout: str) -> dict[str, str]:
    return dict(
        line.split(None, 1) if " " in line.strip() else (line.strip(), "")
        for line in stdout.strip().splitlines()
    )


def test_cat_by_index_and_key(images_ds):
    _, dest = images_ds
    first = invoke("cat", dest)
    assert first.exit_code == 0, first.output
    fields = _cat_fields(first.stdout)
    assert fields["__key__"] == "cat/0"
    assert fields["cls"] == "0"
    assert fields["jpg"].startswith("<300 bytes: ")

    last = invoke("cat", dest, "5")
    assert _cat_fields(last.stdout)["__key__"] == "dog/2"
    assert _cat_fields(last.stdout)["cls"] == "1"

    negative = invoke("cat", dest, "--", "-1")
    assert negative.exit_code == 0, negative.output
    assert _cat_fields(negative.stdout)["__key__"] == "dog/2"

    by_key = invoke("cat", dest, "--key", "dog/1")
    assert by_key.exit_code == 0, by_key.output
    assert _cat_fields(by_key.stdout)["__key__"] == "dog/1"
    assert _cat_fields(by_key.stdout)["jpg"].startswith("<350 bytes: ")


def test_cat_negative_index_without_double_dash(images_ds):
    _, dest = images_ds
    result = invoke("cat", dest, "-1")
    assert result.exit_code == 0, result.output
    assert _cat_fields(result.stdout)["__key__"] == "dog/2"


def test_cat_field_writes_exact_bytes(images_ds):
    src, dest = images_ds
    expected = (src / "dog" / "1.jpg").read_bytes()
    result = invoke("cat", dest, "--key", "dog/1", "--field", "jpg")
    assert result.exit_code == 0
    assert result.stdout_bytes == expected
    result = invoke("cat", dest, "4", "--field", "cls")
    assert result.stdout_bytes == b"1"


def test_cat_field_writes_exact_bytes_to_a_pipe(tmp_path):
    payload = bytes(range(256)) + b"\r\n\x00\n" + "é".encode()
    src = make_files(tmp_path / "src", {"x.bin": payload, "x.txt": b"caption\n"})
    dest = tmp_path / "ds"
    assert run("pack", src, dest, "-q").returncode == 0
    proc = run("cat", dest, "--key", "x", "--field", "bin")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == payload
    proc = run("cat", dest, "0", "--field", "txt")
    assert proc.stdout == b"caption\n"


def test_cat_arrow(table_ds):
    result = invoke("cat", table_ds, "6")
    assert result.exit_code == 0, result.output
    fields = _cat_fields(result.stdout)
    assert fields["id"] == "6"
    assert fields["name"] == "n6"
    assert invoke("cat", table_ds, "6", "--field", "blob").stdout_bytes == b"\x06\x06\x06"
    assert invoke("cat", table_ds, "6", "--field", "name").stdout_bytes == b"n6"
    assert invoke("cat", table_ds, "6", "--field", "id").stdout_bytes == b"6"


def test_cat_arrow_by_key_without_key_column(table_ds):
    result = invoke("cat", table_ds, "--key", "000000001")
    assert result.exit_code != 0
    assert_one_line_error(result.stderr, "__key__")


def test_cat_unknown_field(images_ds):
    _, dest = images_ds
    result = invoke("cat", dest, "0", "--field", "png")
    assert result.exit_code != 0
    line = assert_one_line_error(result.stderr, "'png'")
    assert "jpg" in line and "cls" in line  # says which fields there are
    assert result.stdout_bytes == b""


@pytest.mark.parametrize("args", [["6"], ["--", "-7"], ["--key", "bird/0"]])
def test_cat_missing_sample(images_ds, args):
    _, dest = images_ds
    result = invoke("cat", dest, *args)
    assert result.exit_code != 0
    assert_one_line_error(result.stderr)


def test_cat_index_and_key_together_is_a_usage_error(images_ds):
    _, dest = images_ds
    result = invoke("cat", dest, "1", "--key", "cat/0")
    assert result.exit_code == 2
    assert "not both" in result.stderr


def test_verify_ok(images_ds):
    _, dest = images_ds
    result = invoke("verify", dest, "-q")
    assert result.exit_code == 0, result.output
    first, second = result.stdout.strip().splitlines()
    assert first.startswith("ok: 3 shards, 6 samples, ") and first.endswith(str(dest))
    assert second == "per-sample checksums (xxh3_64): every shard has them; every value matched"


@pytest.mark.parametrize("verb", ["info", "ls", "cat", "verify"])
def test_reading_verbs_on_a_folder_without_dataset(tmp_path, verb):
    (tmp_path / "nothing").mkdir()
    result = invoke(verb, tmp_path / "nothing")
    assert result.exit_code != 0
    assert_one_line_error(result.stderr, tmp_path / "nothing", "_manifest.json")


# -- bad input to pack: one line, non-zero exit, no traceback, no manifest -----------------------------------


def _bad_pack(tmp_path: Path, case: str) -> tuple[list, Path, list]:
    """(pack arguments, destination, names the error must mention) for one kind of bad input."""
    dest = tmp_path / "out"
    good = make_files(tmp_path / "good", {"a.txt": b"a", "b.txt": b"b"})
    if case == "missing source":
        return [tmp_path / "missing", dest], dest, [tmp_path / "missing"]
    if case == "empty source":
        (tmp_path / "empty").mkdir()
        return [tmp_path / "empty", dest], dest, [tmp_path / "empty"]
    if case == "only hidden files":
        src = make_files(tmp_path / "hidden", {".a": b"1"})
        return [src, dest], dest, [src]
    if case == "unsupported file":
        (tmp_path / "sheet.xlsx").write_bytes(b"PK\x03\x04")
        return [tmp_path / "sheet.xlsx", dest], dest, [tmp_path / "sheet.xlsx"]
    if case == "mixed tables":
        src = tmp_path / "tables"
        src.mkdir()
        pq.write_table(pa.table({"a": [1]}), src / "a.parquet")
        pcsv.write_csv(pa.table({"a": [1]}), src / "b.csv")
        return [src, dest], dest, [src]
    if case == "corrupt parquet":
        (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet PAR1")
        return [tmp_path / "bad.parquet", dest], dest, [tmp_path / "bad.parquet"]
    if case == "broken symlink":
        src = make_files(tmp_path / "src", {"a.txt": b"a"})
        (src / "gone.txt").symlink_to(tmp_path / "nowhere.txt")
        return [src, dest], dest, [src / "gone.txt"]
    if case == "symlink loop":
        src = make_files(tmp_path / "src", {"sub/a.txt": b"a"})
        (src / "sub" / "loop").symlink_to(src, target_is_directory=True)
        return [src, dest], dest, [src / "sub" / "loop"]
    if case == "field clash":
        src = make_files(tmp_path / "src", {"x": b"1", "x.bin": b"2"})
        return [src, dest], dest, [src / "x", src / "x.bin"]
    if case == "dest inside source":
        return [good, good / "shards"], good / "shards", [good / "shards"]
    if case == "dest is a file":
        (tmp_path / "file").write_bytes(b"x")
        return [good, tmp_path / "file"], tmp_path / "file", [tmp_path / "file"]
    if case.startswith("shard size "):
        return [good, dest, f"--shard-size={case.split()[-1]}"], dest, ["shard size"]
    if case == "shard size -5MB separate":
        return [good, dest, "--shard-size", "-5MB"], dest, ["-5MB"]
    if case == "samples per shard 0":
        return [good, dest, "--samples-per-shard", "0"], dest, ["samples per shard"]
    if case == "samples per shard -2":
        return [good, dest, "--samples-per-shard", "-2"], dest, ["samples per shard"]
    if case == "workers 0":
        return [good, dest, "--workers", "0"], dest, ["workers"]
    raise AssertionError(case)


BAD_PACK_CASES = [
    "missing source",
    "empty source",
    "only hidden files",
    "unsupported file",
    "mixed tables",
    "corrupt parquet",
    "broken symlink",
    "symlink loop",
    "field clash",
    "dest inside source",
    "dest is a file",
    "shard size 0",
    "shard size -5MB",
    "shard size abc",
    "shard size 1.2.3MB",
    "shard size -5MB separate",
    "samples per shard 0",
    "samples per shard -2",
    "workers 0",
]


@pytest.mark.parametrize("case", BAD_PACK_CASES)
def test_bad_pack_input_in_process(tmp_path, case):
    args, dest, names = _bad_pack(tmp_path, case)
    result = invoke("pack", *args, "-q")
    assert result.exit_code == 1, result.output
    assert_one_line_error(result.stderr, *names)
    assert result.stdout == ""
    assert not (Path(dest) / "_manifest.json").exists()


@pytest.mark.parametrize(
    "case", ["missing source", "unsupported file", "field clash", "shard size abc"]
)
def test_bad_pack_input_in_a_real_process(tmp_path, case):
    args, dest, names = _bad_pack(tmp_path, case)
    proc = run("pack", *args)
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, *names)
    assert not (Path(dest) / "_manifest.json").exists()


def test_existing_dataset_is_refused_unless_overwrite(tmp_path):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" for i in range(4)})
    dest = tmp_path / "out"
    assert invoke("pack", src, dest, "-q").exit_code == 0
    before = (dest / "_manifest.json").read_bytes()
    name = json.loads(before)["shards"]["path"][0]
    shard = (dest / name).read_bytes()
    (src / "9.txt").write_bytes(b"new")
    result = invoke("pack", src, dest, "-q")
    assert result.exit_code == 1
    line = assert_one_line_error(result.stderr, dest)
    assert "--overwrite" in line
    assert (dest / "_manifest.json").read_bytes() == before  # the old dataset is untouched
    assert (dest / name).read_bytes() == shard
    result = invoke("pack", src, dest, "-q", "--overwrite")
    assert result.exit_code == 0, result.output
    assert json.loads((dest / "_manifest.json").read_text())["num_samples"] == 5


def test_file_vanishing_while_packing(tmp_path, monkeypatch):
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 20 for i in range(5)})
    victim = src / "3.txt"
    real = pack_module.open_source

    def listed_then_deleted(path, layout="auto"):
        source = real(path, layout)
        victim.unlink()
        return source

    monkeypatch.setattr(pack_module, "open_source", listed_then_deleted)
    dest = tmp_path / "out"
    result = invoke("pack", src, dest, "--workers", "1", "--samples-per-shard", "2", "-q")
    assert result.exit_code == 1
    assert_one_line_error(result.stderr, victim)
    assert not (dest / "_manifest.json").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_unreadable_source_file(tmp_path, workers):
    preexec = permission_preexec(tmp_path)
    src = make_files(tmp_path / "src", {f"{i}.txt": b"x" * 20 for i in range(6)})
    (src / "4.txt").chmod(0)
    dest = tmp_path / "out"
    try:
        proc = run(
            "pack", src, dest, "--workers", workers, "--samples-per-shard", "1", preexec_fn=preexec
        )
    finally:
        (src / "4.txt").chmod(0o644)
    assert proc.returncode == 1
    line = assert_one_line_error(proc.stderr, src / "4.txt")
    assert "permission denied" in line
    assert not (dest / "_manifest.json").exists()
    # once readable again, the same command succeeds
    proc = run("pack", src, dest, "--workers", workers, "--samples-per-shard", "1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((dest / "_manifest.json").read_text())["num_samples"] == 6


def test_unreadable_source_folder(tmp_path):
    preexec = permission_preexec(tmp_path)
    src = make_files(tmp_path / "src", {"a.txt": b"a", "locked/b.txt": b"b"})
    (src / "locked").chmod(0)
    try:
        proc = run("pack", src, tmp_path / "out", preexec_fn=preexec)
    finally:
        (src / "locked").chmod(0o755)
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, src / "locked")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["folder", "inside"])
def test_destination_without_write_permission(tmp_path, where):
    preexec = permission_preexec(tmp_path)
    src = make_files(tmp_path / "src", {"a.txt": b"a", "b.txt": b"b"})
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    dest = locked if where == "folder" else locked / "ds"
    try:
        proc = run("pack", src, dest, preexec_fn=preexec)
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 1
    line = assert_one_line_error(proc.stderr, dest)
    assert "permission denied" in line
    assert not (dest / "_manifest.json").exists()


def test_no_space_fails_cleanly(tmp_path):
    src = big_source(tmp_path / "src", files=4, size=40_000)
    dest = tmp_path / "out"
    proc = run("pack", src, dest, "--workers", "1", preexec_fn=_file_size_limit(100_000))
    assert proc.returncode == 1
    stderr = proc.stderr.decode()
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "large" in lines[0]
    assert not (dest / "_manifest.json").exists()
    # with room to write, the same pack succeeds
    proc = run("pack", src, dest, "--workers", "1")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_no_space_error_names_the_destination(tmp_path, workers):
    src = big_source(tmp_path / "src", files=4, size=40_000)
    dest = tmp_path / "out"
    proc = run(
        "pack",
        src,
        dest,
        "--workers",
        workers,
        "--shard-size",
        "100KB",
        preexec_fn=_file_size_limit(60_000),
    )
    assert proc.returncode == 1
    assert_one_line_error(proc.stderr, dest)
    assert not (dest / "_manifest.json").exists()
    assert not [n for n in folder_files(dest) if n.endswith(".tmp")]


def test_full_file_system_fails_cleanly(tmp_path):
    with tiny_tmpfs(tmp_path / "tiny") as tiny:
        src = big_source(tmp_path / "src", files=4, size=400_000)
        dest = tiny / "ds"
        proc = run("pack", src, dest, "--workers", "1", "--shard-size", "500KB")
        assert proc.returncode == 1
        stderr = proc.stderr.decode()
        assert "Traceback" not in stderr
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert "space" in lines[0]
        assert not (dest / "_manifest.json").exists()


def test_full_file_system_error_names_the_destination(tmp_path):
    with tiny_tmpfs(tmp_path / "tiny") as tiny:
        src = big_source(tmp_path / "src", files=4, size=400_000)
        dest = tiny / "ds"
        proc = run("pack", src, dest, "--workers", "1", "--shard-size", "500KB")
        assert proc.returncode == 1
        assert_one_line_error(proc.stderr, dest)
        assert not [n for n in folder_files(dest) if n.endswith(".tmp")]


def test_failed_pack_then_rerun_gives_a_complete_dataset(tmp_path):
    src = big_source(tmp_path / "src", files=4, size=40_000)
    dest = tmp_path / "out"
    proc = run(
        "pack",
        src,
        dest,
        "--workers",
        "1",
        "--shard-size",
        "100KB",
        preexec_fn=_file_size_limit(60_000),
    )
    assert proc.returncode == 1
    assert not (dest / "_manifest.json").exists()
    assert run("pack", src, dest, "--workers", "1", "--shard-size", "100KB").returncode == 0
    assert [without_run(n) for n in folder_files(dest)] == sorted(
        ["_manifest.json", *indexed("shard-000000.tar", "shard-000001.tar")]
    )
    verify = run("verify", dest)
    assert verify.returncode == 0, verify.stderr


def test_malformed_storage_option_is_a_usage_error(tmp_path):
    src = make_files(tmp_path / "src", {"a.txt": b"a"})
    result = invoke("pack", src, tmp_path / "out", "-o", "novalue")
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.stderr
    assert not (tmp_path / "out").exists()


def test_ls_into_a_closed_pipe_is_not_an_error(tmp_path):
    n = 20_000  # far more output than a pipe holds; ls reads only the manifest
    doc = {
        "shardstream_manifest": 1,
        "shard_format": "tar",
        "num_shards": n,
        "num_samples": n,
        "total_bytes": n * 1024,
        "fields": [],
        "classes": None,
        "arrow_schema": None,
        "created": {},
        "shards": {
            "path": [f"shard-{i:06d}.tar" for i in range(n)],
            "samples": [1] * n,
            "bytes": [1024] * n,
            "sha256": ["0" * 64] * n,
        },
    }
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "_manifest.json").write_text(json.dumps(doc))
    proc = subprocess.Popen(
        [*SHARDSTREAM, "ls", str(tmp_path / "ds")], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    first = proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    stderr = proc.stderr.read()
    proc.wait(timeout=60)
    assert first.split() == [b"shard", b"samples", b"size", b"sha256"]
    assert proc.returncode == 0
    assert b"Traceback" not in stderr
    assert b"BrokenPipe" not in stderr
