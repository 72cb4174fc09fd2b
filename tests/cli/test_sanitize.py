"""What a dataset's strings may do to the reader's terminal: nothing. Keys, field names, class names,
shard paths and the error lines that quote them are printed with control characters escaped."""

from __future__ import annotations

import json
import logging
import os
import pty
import select
import subprocess
import sys
import tty
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardstream.cli import cli
from shardstream.cli.common import _NoTraceback, safe, safe_json
from tests.cli.hostile import (
    CLEAR,
    HOSTILE_CLASSES,
    HOSTILE_FIELD,
    HOSTILE_KEY,
    RLO,
    TITLE,
    hostile_arrow_dataset,
    hostile_dataset,
    tar_dataset,
    terminal_problems,
)

_EXE = Path(sys.executable).with_name("shardstream")
SHARDSTREAM = [str(_EXE)] if _EXE.exists() else [sys.executable, "-m", "shardstream"]


def invoke(*args: str | Path, env: dict[str, str] | None = None):
    result = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert not terminal_problems(result.stdout_bytes + result.stderr_bytes), result.output
    assert "Traceback" not in result.output
    return result


def one_error_line(stderr: str) -> str:
    # warnings may come first (a dataset without per-sample checksums says so once)
    lines = [line for line in stderr.strip().splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert not lines[0].startswith("error: unexpected"), stderr
    return lines[0]


@pytest.fixture
def hostile(tmp_path) -> Path:
    return hostile_dataset(tmp_path / "ds")


# -- the mechanism ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # ordinary text and joiners are left alone
        (
            "plain é 中 👍 a\u200db",
            "plain é 中 👍 a\u200db",
        ),
        (HOSTILE_KEY, r"a\x1b]0;pwned\x07"),
        (HOSTILE_FIELD, r"x\u202ey"),
        ("x\x1b[1m", r"x\x1b[1m"),
        ("cat" + RLO + "gpj.exe", r"cat\u202egpj.exe"),
        ("\x9b31m \x7f \x00", r"\x9b31m \x7f \x00"),  # C1 CSI, DEL, NUL
        ("one\ntwo\r\tthree", r"one\ntwo\r\tthree"),
        ("sep\u2028\u2029 zw\u200b bom\ufeff", r"sep\u2028\u2029 zw\u200b bom\ufeff"),
        ("bad\udcff", r"bad\udcff"),  # an undecodable byte of a tar name (surrogateescape)
        ("tag\U000e0041", r"tag\U000e0041"),  # invisible tag characters
    ],
)
def test_safe_escapes_what_a_terminal_acts_on(text, shown):
    assert safe(text) == shown
    assert not terminal_problems(safe(text))


def test_safe_json_is_valid_safe_and_round_trips():
    value = {"k" + CLEAR: [HOSTILE_KEY, *HOSTILE_CLASSES, "bad\udcff", "tag\U000e0041", "\x7f\x85"]}
    for indent in (None, 2):
        text = safe_json(value, indent=indent)
        assert not terminal_problems(text)
        assert json.loads(text) == value
    assert "plain é 中" in safe_json(value)  # not \u00e9


def test_warning_lines_are_escaped():
    record = logging.LogRecord(
        "shardstream", logging.WARNING, __file__, 1, "skipped %s", (HOSTILE_KEY,), None
    )
    line = _NoTraceback("warning: %(message)s").format(record)
    assert line == r"warning: skipped a\x1b]0;pwned\x07"


# -- every verb, on a hostile dataset ----------------------------------------------------------------------------


def test_info_escapes_class_names_and_creation_info(hostile):
    result = invoke("info", hostile)
    assert result.exit_code == 0, result.output
    assert r"cat\u202egpj.exe" in result.stdout
    assert r"dog\x1b]0;pwned\x07" in result.stdout
    assert "plain é 中" in result.stdout
    assert r"src\x1b[2J" in result.stdout


def test_info_json_is_valid_and_keeps_the_strings(hostile):
    result = invoke("info", hostile, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["classes"] == HOSTILE_CLASSES
    assert doc["created"]["source"] == "src" + CLEAR
    assert "plain é 中" in result.stdout


def test_arrow_column_names_keys_and_values_are_escaped(tmp_path):
    ds = hostile_arrow_dataset(tmp_path / "ds")
    info = invoke("info", ds)
    assert info.exit_code == 0, info.output
    assert r"x\u202ey: string" in info.stdout
    assert HOSTILE_FIELD in {
        f["name"] for f in json.loads(invoke("info", ds, "--json").stdout)["fields"]
    }
    cat = invoke("cat", ds, "0")
    assert cat.exit_code == 0, cat.output
    fields = dict(line.split(None, 1) for line in cat.stdout.strip().splitlines())
    assert fields == {
        "__key__": r"'a\x1b]0;pwned\x07'",
        r"x\u202ey": r"'\x1b[2Jboom'",
        "txt": "plain é 中",
    }
    assert invoke("cat", ds, "--key", HOSTILE_KEY).exit_code == 0


def test_tar_field_name_with_an_escape_in_the_manifest(tmp_path):
    """Listed in the manifest: shown escaped, or the manifest refused with an escaped error line."""
    ds = tar_dataset(tmp_path / "ds", {"shard-000000.tar": [(f"k.{HOSTILE_FIELD}", b"v")]})
    result = invoke("info", ds)
    if result.exit_code == 0:
        assert r"x\u202ey (1)" in result.stdout
    else:
        assert r"x\u202ey" in one_error_line(result.stderr)


def test_cat_escapes_keys_field_names_and_values(hostile):
    result = invoke("cat", hostile, "0")
    assert result.exit_code == 0, result.output
    fields = dict(line.split(None, 1) for line in result.stdout.strip().splitlines())
    assert fields["__key__"] == r"'a\x1b]0;pwned\x07'"  # quoted, as every value shown with escapes
    assert fields["txt"] == "hello"
    assert fields[r"x\u202ey"] == "<8 bytes: 1b 5b 32 4a 62 6f 6f 6d>"
    plain = invoke("cat", hostile, "1")
    assert r"txt      'plain é 中\n'" in plain.stdout


def test_cat_finds_a_hostile_key(hostile):
    result = invoke("cat", hostile, "--key", HOSTILE_KEY)
    assert result.exit_code == 0, result.output
    assert r"a\x1b]0;pwned\x07" in result.stdout


def test_error_line_quoting_field_names_is_escaped(hostile):
    result = invoke("cat", hostile, "0", "--field", "png")
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert r"x\u202ey" in line


def test_error_line_quoting_a_missing_key_is_escaped(hostile):
    result = invoke("cat", hostile, "--key", "nope" + TITLE)
    assert result.exit_code == 1
    one_error_line(result.stderr)


@pytest.mark.parametrize(
    ("shard", "shown"),
    [
        ("shard" + CLEAR + "-000000.tar", r"shard\x1b[2J-000000.tar"),
        ("shard" + RLO + "-000000.tar", r"shard\u202e-000000.tar"),
    ],
)
def test_shard_path_with_an_escape(tmp_path, shard, shown):
    ds = hostile_dataset(tmp_path / ("ds" + TITLE), shard=shard)
    result = invoke("ls", ds)
    # or the manifest check refuses such a path, with an escaped error line
    if result.exit_code == 0:
        assert shown in result.stdout
        rows = [json.loads(line) for line in invoke("ls", ds, "--json").stdout.splitlines()]
        assert [r["path"] for r in rows] == [shard]
        assert invoke("verify", ds, "-q").exit_code == 0
        (ds / shard).write_bytes((ds / shard).read_bytes()[:-1024])
        result = invoke("verify", ds, "-q")
        assert result.exit_code == 1
        damaged = [line for line in result.stderr.splitlines() if line.startswith("damaged: ")]
        assert len(damaged) == 1 and shown in damaged[0], result.stderr
    else:
        assert shown in one_error_line(result.stderr)
    for verb in ("info", "cat"):
        invoke(verb, ds)


def test_dataset_folder_named_with_an_escape(tmp_path):
    ds = hostile_dataset(tmp_path / ("ds" + TITLE))
    result = invoke("verify", ds, "-q")
    assert result.exit_code == 0, result.output
    assert r"ds\x1b]0;pwned\x07" in result.stdout
    (ds / "_manifest.json").unlink()
    one_error_line(invoke("info", ds).stderr)


def test_os_error_line_is_escaped(hostile, monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "gone" + CLEAR)

    monkeypatch.setattr("shardstream.cli.show._sample_map", missing)
    result = invoke("cat", hostile, "0")
    assert result.exit_code == 1
    assert one_error_line(result.stderr) == r"error: gone\x1b[2J No such file or directory"


def test_unexpected_exception_is_one_escaped_line(hostile, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("bad value " + CLEAR + "\nsecond line")

    monkeypatch.setattr("shardstream.cli.show._sample_map", broken)
    result = invoke("cat", hostile, "0")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: unexpected ValueError at test_sanitize.py:")
    assert r"bad value \x1b[2J\nsecond line" in lines[0]
    assert "bug" in lines[0] and "--traceback" in lines[0]
    # for a developer: the traceback, on request
    debug = CliRunner().invoke(cli, ["--traceback", "cat", str(hostile), "0"])
    assert isinstance(debug.exception, ValueError)


def test_output_survives_a_terminal_without_unicode(hostile):
    """Under a Latin-1 locale, 中 cannot be encoded: it is escaped, not a crash."""
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    proc = subprocess.run(
        [*SHARDSTREAM, "info", str(hostile)], capture_output=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert "plain é \\u4e2d".encode("latin-1") in proc.stdout
    assert not terminal_problems(proc.stdout.decode("latin-1"))


# -- cat --field: raw bytes to files and pipes; to a terminal only safe text, unless --raw --------------------


def run_with_terminal_stdout(*args: str | Path) -> tuple[int, bytes, bytes]:
    """(exit code, what reached the terminal, stderr) of ``shardstream`` with stdout on a raw-mode terminal."""
    leader, follower = pty.openpty()
    tty.setraw(follower)  # no newline translation: the bytes arrive as written
    try:
        proc = subprocess.Popen(
            [*SHARDSTREAM, *map(str, args)], stdout=follower, stderr=subprocess.PIPE
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
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(leader)
    return proc.returncode, seen, err


def test_cat_field_refuses_escapes_on_a_terminal(hostile):
    code, seen, err = run_with_terminal_stdout("cat", hostile, "0", "--field", HOSTILE_FIELD)
    assert code == 1
    assert seen == b""
    line = one_error_line(err.decode())
    assert "--raw" in line and "redirect" in line
    assert not terminal_problems(err)


def test_cat_field_raw_writes_the_bytes_to_a_terminal(hostile):
    code, seen, _ = run_with_terminal_stdout("cat", hostile, "0", "--field", HOSTILE_FIELD, "--raw")
    assert code == 0
    assert seen == CLEAR.encode() + b"boom"


def test_cat_field_writes_plain_text_to_a_terminal(hostile):
    code, seen, err = run_with_terminal_stdout("cat", hostile, "1", "--field", "txt")
    assert code == 0, err
    assert seen == "plain é 中\n".encode()


def test_cat_field_writes_raw_bytes_to_a_pipe(hostile):
    proc = subprocess.run(
        [*SHARDSTREAM, "cat", str(hostile), "0", "--field", HOSTILE_FIELD],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == CLEAR.encode() + b"boom"


def test_raw_without_field_is_a_usage_error(hostile):
    result = CliRunner().invoke(cli, ["cat", str(hostile), "--raw"])
    assert result.exit_code == 2
    assert "--field" in result.stderr


# -- index --force ------------------------------------------------------------------------------------------------


def test_index_force_reaches_index(tmp_path, monkeypatch):
    seen = {}

    def fake_index(sources, output, options, overwrite, on_shard=None, force=False):
        seen.update(sources=sources, force=force)
        raise SystemExit(0)

    monkeypatch.setattr("shardstream.manifest.index_tars.index", fake_index)
    for flags, expected in (([], False), (["--force"], True)):
        CliRunner().invoke(cli, ["index", str(tmp_path), *flags])
        assert seen == {"sources": [str(tmp_path)], "force": expected}


def test_index_refuses_an_unfinished_pack_unless_forced(tmp_path):
    ds = tar_dataset(tmp_path / "ds", {"shard-000000.tar": [("a.txt", b"a"), ("b.txt", b"b")]})
    (ds / "_manifest.json").unlink()
    (ds / ".shardstream-writing").write_text("token-of-a-killed-pack")
    result = invoke("index", ds, "-q")
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "--force" in line
    assert not (ds / "_manifest.json").exists()
    result = invoke("index", ds, "-q", "--force")
    assert result.exit_code == 0, result.output
    assert json.loads((ds / "_manifest.json").read_text())["num_samples"] == 2
