"""Never a traceback, a hang or a terminal escape from the command line, whatever the dataset.

Small real datasets (tar, tar.zst, Arrow) are damaged (byte flips, truncation, zeroed ranges, in a
shard or in the manifest), given hostile manifests that still parse and hostile tars that look
legitimate, and every reading verb runs on them in a forked child with a time limit. The rule:
each command exits 0, or 1 with one ``error: ...`` line (``verify``: ``damaged: ...`` lines, then
one ``error:`` line); no traceback, no ``error: unexpected ...`` (a bug), no raw control character
in what it prints, valid JSON from ``--json``, and ``verify`` fails whenever a shard's bytes changed.
The cases are drawn from a fixed seed, so a failure names a case that reproduces.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli.fuzz_runner import Outcome, Runner
from tests.cli.hostile import CLEAR, RLO, TITLE, tar_bytes, terminal_problems
from tests.sample_datasets import key_of, write_dataset

TIMEOUT = 60.0  # for all the commands of one case; each takes milliseconds


def arrow_sample(i: int) -> dict[str, Any]:
    return {"__key__": key_of(i), "label": i, "name": f"n{i}", "data": bytes([i]) * 3}


BASES: dict[str, dict[str, Any]] = {
    "tar": {"fmt": "tar"},
    "tar.zst": {"fmt": "tar", "compression": "zstd"},
    "arrow": {"fmt": "arrow", "make": arrow_sample},
}


@dataclass(frozen=True)
class Case:
    base: str
    damage: Callable[[Path], None]
    name: str
    target: str  # what is damaged: "shard" or "manifest"

    def __str__(self) -> str:
        return self.name


# -- damage -----------------------------------------------------------------------------------------------------


def _shard(ds: Path) -> Path:
    return next(p for p in sorted(ds.iterdir()) if p.name.startswith("shard-"))


def _target(ds: Path, what: str) -> Path:
    return ds / "_manifest.json" if what == "manifest" else _shard(ds)


def flip(what: str, where: float, mask: int) -> Callable[[Path], None]:
    def damage(ds: Path) -> None:
        path = _target(ds, what)
        data = bytearray(path.read_bytes())
        data[min(int(where * len(data)), len(data) - 1)] ^= mask
        path.write_bytes(bytes(data))

    return damage


def truncate(what: str, keep: float) -> Callable[[Path], None]:
    def damage(ds: Path) -> None:
        path = _target(ds, what)
        data = path.read_bytes()
        path.write_bytes(data[: int(keep * len(data))])

    return damage


def zero(what: str, where: float, length: int) -> Callable[[Path], None]:
    def damage(ds: Path) -> None:
        path = _target(ds, what)
        data = bytearray(path.read_bytes())
        start = int(where * len(data))
        data[start : start + length] = bytes(len(data[start : start + length]))
        path.write_bytes(bytes(data))

    return damage


def random_cases(base: str, n_per_kind: int = 2) -> list[Case]:
    rng = random.Random(f"shardstream-cli-fuzz-{base}")
    cases = []
    for what in ("shard", "manifest"):
        for i in range(2 * n_per_kind):
            where, mask = rng.random(), rng.choice([1, 0x80, 0xFF, rng.randrange(1, 256)])
            name = f"{base}: flip {what} byte at {where:.3f} ^ {mask:#x} #{i}"
            cases.append(Case(base, flip(what, where, mask), name, what))
        for i in range(n_per_kind):
            keep = rng.random()
            cases.append(
                Case(
                    base, truncate(what, keep), f"{base}: truncate {what} to {keep:.3f} #{i}", what
                )
            )
        for i in range(n_per_kind):
            where, length = rng.random(), rng.choice([1, 8, 64, 512, 4096])
            name = f"{base}: zero {length} {what} bytes at {where:.3f} #{i}"
            cases.append(Case(base, zero(what, where, length), name, what))
    return cases


# hostile manifests that still parse: each edits the manifest's JSON document of the tar base
def edit(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    def damage(ds: Path) -> None:
        path = ds / "_manifest.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc, ensure_ascii=False))

    return damage


def text(replace: Callable[[str], str]) -> Callable[[Path], None]:
    def damage(ds: Path) -> None:
        path = ds / "_manifest.json"
        path.write_bytes(replace(path.read_text()).encode("utf-8", "surrogateescape"))

    return damage


def _set(*keys_value: Any) -> Callable[[dict], None]:
    *keys, value = keys_value

    def change(doc: dict) -> None:
        for key in keys[:-1]:
            doc = doc[key]
        doc[keys[-1]] = value

    return change


HOSTILE_MANIFESTS: dict[str, Callable[[Path], None]] = {
    "samples as strings": edit(_set("shards", "samples", ["3", "2"])),
    "samples as floats": edit(_set("shards", "samples", [3.5, 1.5])),
    "paths as numbers": edit(_set("shards", "path", [1, 2])),
    "sha256 as lists": edit(_set("shards", "sha256", [[1], [2]])),
    "shards a list": edit(_set("shards", [])),
    "fields a string": edit(_set("fields", "abc")),
    "field without a name": edit(_set("fields", [{"type": 5}])),
    "field counts as text": edit(
        _set("fields", [{"name": "txt", "type": "bytes", "samples": "five"}])
    ),
    "classes an object": edit(_set("classes", {"a": 1})),
    "classes of numbers": edit(_set("classes", [1, None, [2]])),
    "created a list": edit(_set("created", [1, 2])),
    "huge sample count": edit(_set("shards", "samples", [10**30, 2])),
    "negative byte count": edit(_set("shards", "bytes", [-1, 5])),
    "sample count 2**63": edit(_set("shards", "samples", [2**63, 2])),
    "total as 1e308": edit(_set("num_samples", 1e308)),
    "counts disagree": edit(_set("num_samples", 99)),
    "columns of different lengths": edit(_set("shards", "samples", [3])),
    "no shards": edit(
        lambda d: d.update(
            num_shards=0,
            num_samples=0,
            total_bytes=0,
            shards={"path": [], "samples": [], "bytes": [], "sha256": []},
        )
    ),
    "absolute path": edit(_set("shards", "path", ["/etc/passwd", "shard-000001.tar"])),
    "parent path": edit(_set("shards", "path", ["../outside.tar", "shard-000001.tar"])),
    "url path": edit(_set("shards", "path", ["s3://another-bucket/x.tar", "shard-000001.tar"])),
    "path with escapes": edit(
        _set("shards", "path", ["shard" + CLEAR + ".tar", "x" + TITLE + ".tar"])
    ),
    "path with bidi override": edit(
        _set("shards", "path", ["shard" + RLO + "rat.tar", "shard-000001.tar"])
    ),
    "duplicate paths": edit(_set("shards", "path", ["shard-000001.tar", "shard-000001.tar"])),
    "upper-case sha256": edit(
        lambda d: d["shards"].update(sha256=[s.upper() for s in d["shards"]["sha256"]])
    ),
    "sha256 escaping the cache": edit(
        _set("shards", "sha256", ["../../../../tmp/" + "p" * 49, "0" * 64])
    ),
    "sha256 with escapes": edit(_set("shards", "sha256", [CLEAR * 16, TITLE * 5 + "abcd"])),
    "class names with escapes": edit(
        _set("classes", [TITLE, CLEAR, "a" + RLO + "b", "\x9b2J", "\x7f"])
    ),
    "created with escapes": edit(
        _set("created", {"at": CLEAR, "by": TITLE, "source": "\x9b31m" + RLO})
    ),
    "field names with escapes": edit(
        _set("fields", [{"name": "x" + CLEAR, "type": "bytes", "samples": 5}])
    ),
    "unknown shard format": edit(_set("shard_format", "zip" + CLEAR)),
    "version 2": edit(_set("shardstream_manifest", 2)),
    "version as text": edit(_set("shardstream_manifest", "1" + TITLE)),
    "arrow schema garbage": edit(
        lambda d: d.update(shard_format="arrow", arrow_schema="not base64 " + CLEAR)
    ),
    "deep nesting": text(
        lambda t: t.replace('"classes":null', '"classes":' + "[" * 100_000 + "]" * 100_000)
    ),
    "NaN total": text(lambda t: t.replace('"total_bytes":', '"total_bytes":NaN,"x":')),
    "duplicate keys": text(
        lambda t: t.replace('"shard_format":"tar"', '"shard_format":"tar","shard_format":"arrow"')
    ),
    "not an object": text(lambda t: "[1, 2, 3]"),
    "null": text(lambda t: "null"),
    "a string with escapes": text(lambda t: json.dumps(TITLE + CLEAR)),
    "empty file": text(lambda t: ""),
    "not UTF-8": text(lambda t: t.replace('"tar"', '"t\udcffr"')),
    "BOM": text(lambda t: "\ufeff" + t),
}


def _header_checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def _with_header(data: bytes, member: int, field: slice, value: bytes) -> bytes:
    """``data`` (a tar) with a number field of its ``member``-th header replaced, checksum fixed."""
    out, pos = bytearray(data), 0
    for _ in range(member):
        size = int(out[pos + 124 : pos + 136].split(b"\0")[0] or b"0", 8)
        pos += 512 + (size + 511) // 512 * 512
    header = bytearray(out[pos : pos + 512])
    header[field] = value.ljust(field.stop - field.start, b"\0")
    _header_checksum(header)
    out[pos : pos + 512] = header
    return bytes(out)


def _pax_tar(size_record: str) -> bytes:
    """a.txt, then b.txt with a PAX ``size`` record of ``size_record``."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, pax in (("a.txt", {}), ("b.txt", {"size": size_record})):
            info = tarfile.TarInfo(name)
            info.size = 4
            info.pax_headers = pax
            tf.addfile(info, io.BytesIO(b"data"))
    return buf.getvalue()


PLAIN = tar_bytes([("a.txt", b"aaaa"), ("b.txt", b"bbbb"), ("c.txt", b"cccc")])
SIZE = slice(124, 136)

HOSTILE_TARS: dict[str, bytes] = {
    "negative octal size": _with_header(PLAIN, 1, SIZE, b"-0000002000"),
    # a, b, a, b, ...
    "negative size back to the first header": _with_header(PLAIN, 1, SIZE, b"-0000003000"),
    "negative size, one block back": _with_header(PLAIN, 2, SIZE, b"-0000001000"),
    "negative PAX size": _pax_tar("-1024"),
    "negative PAX size back to the first header": _pax_tar("-2560"),
    "PAX size with spaces and sign": _pax_tar(" -0"),
    "huge base-256 size": _with_header(PLAIN, 1, SIZE, b"\x80" + b"\xff" * 11),
    "negative base-256 size": _with_header(PLAIN, 1, SIZE, b"\xff" * 12),
    "size 8 GB": _with_header(PLAIN, 0, SIZE, b"77777777777"),
    "names with escapes": tar_bytes(
        [(TITLE + ".txt", b"x"), ("k." + CLEAR, b"y"), ("k" + RLO + ".txt", b"z")]
    ),
    "undecodable name": tar_bytes([("caf\udce9.txt", b"x")]),
    "empty file": b"",
    "end of archive only": bytes(1024),
    "one zero block": bytes(512),
    "garbage": bytes(range(256)) * 8,
}


def replace_shard(data: bytes) -> Callable[[Path], None]:
    """The first shard replaced by ``data``, with its manifest entry (size, sha256) made to match:
    a hostile tar that passes the checks a reader makes before parsing."""

    def damage(ds: Path) -> None:
        shard = _shard(ds)
        shard.write_bytes(data)
        path = ds / "_manifest.json"
        doc = json.loads(path.read_text())
        i = doc["shards"]["path"].index(shard.name)
        old = doc["shards"]["bytes"][i]
        doc["shards"]["bytes"][i] = len(data)
        doc["shards"]["sha256"][i] = hashlib.sha256(data).hexdigest()
        doc["total_bytes"] += len(data) - old
        path.write_text(json.dumps(doc))

    return damage


CASES = (
    [case for base in BASES for case in random_cases(base)]
    + [
        Case("tar", damage, f"tar: hostile manifest: {name}", "manifest")
        for name, damage in HOSTILE_MANIFESTS.items()
    ]
    + [
        Case("tar", replace_shard(data), f"tar: hostile tar: {name}", "shard")
        for name, data in HOSTILE_TARS.items()
    ]
)


# -- the rule ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runner():
    runner = Runner()
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {
        name: Path(write_dataset(root, [3, 2], name=name.replace(".", "-"), **kw))
        for name, kw in BASES.items()
    }


def commands(ds: Path, target: str) -> list[list[str]]:
    """The verbs that read what ``target`` damaged: info and ls read only the manifest, index only the shards."""
    d = str(ds)
    reading = [
        ["cat", d, "0"],
        ["cat", d, "--", "-1"],
        ["cat", d, "--key", key_of(3)],
        ["verify", d, "-q", "--workers", "1"],
    ]
    if target == "manifest":
        return [["info", d], ["info", d, "--json"], ["ls", d], ["ls", d, "--json"], *reading]
    return [*reading, ["index", d, "--overwrite", "-q"]]


def outcome_problems(o: Outcome) -> list[str]:
    """How one command's outcome breaks the rule (empty when it keeps it)."""
    out, err = o.stdout.decode("utf-8", "replace"), o.stderr.decode("utf-8", "replace")
    problems = []
    if o.escaped:
        problems.append(f"an exception escaped:\n{o.escaped}")
    if "Traceback" in out + err:
        problems.append("a traceback")
    bad = terminal_problems(o.stdout + o.stderr)
    if bad:
        problems.append(f"raw control characters {', '.join(bad)}")
    lines = err.strip().splitlines()
    if o.exit_code == 0:
        if any(not line.startswith(("warning: ", "note: ")) for line in lines):
            problems.append("exit 0 with stderr other than warning or note lines")
        if "--json" in o.args:
            try:
                [json.loads(line) for line in out.splitlines()] if o.args[
                    0
                ] == "ls" else json.loads(out)
            except ValueError as exc:
                problems.append(f"--json printed invalid JSON ({exc})")
    elif o.exit_code == 1:
        verify = o.args[0] == "verify"
        # warnings may come first (a dataset without per-sample checksums says so once)
        lines = [line for line in lines if not line.startswith("warning: ")]
        if not lines or not lines[-1].startswith("error: "):
            problems.append("exit 1 without an error: line last")
        elif lines[-1].startswith("error: unexpected "):
            problems.append("an unexpected exception (a bug)")
        elif (
            any(not line.startswith("damaged: ") for line in lines[:-1])
            if verify
            else len(lines) != 1
        ):
            problems.append(
                "more than the one error line" + (" and damaged: lines" if verify else "")
            )
    else:
        problems.append(f"exit code {o.exit_code}")
    return problems


@pytest.mark.parametrize("case", CASES, ids=str)
def test_cli_survives(case: Case, bases, runner, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(bases[case.base], ds)
    before = {p.name: p.read_bytes() for p in ds.iterdir() if p.name.startswith("shard-")}
    case.damage(ds)
    shards_changed = any(p.read_bytes() != before[p.name] for p in ds.iterdir() if p.name in before)
    manifest_intact = (ds / "_manifest.json").read_bytes() == (
        bases[case.base] / "_manifest.json"
    ).read_bytes()

    outcomes, trouble = runner.run(commands(ds, case.target), TIMEOUT)
    report = [trouble] if trouble else []
    for o in outcomes:
        report += [
            f"shardstream {' '.join(o.args[:1] + o.args[2:])}: {p}\n  stdout: {o.stdout[:300]!r}\n"
            f"  stderr: {o.stderr[:600]!r}"
            for p in outcome_problems(o)
        ]
        if o.args[0] == "verify" and o.exit_code == 0 and shards_changed and manifest_intact:
            report.append("verify passed a dataset whose shard bytes changed")
    assert not report, f"{case}:\n" + "\n".join(report)
