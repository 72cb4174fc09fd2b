"""Manifest fuzzing: damaged and hostile manifests end in a ManifestError or a valid Manifest, never in
another exception and never in a hang; the whole-column checks agree with the value-by-value rules."""

from __future__ import annotations

import json
import random
import re
import threading
import uuid
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardstream.errors import ManifestError
from shardstream.manifest import MANIFEST_NAME, Manifest, checks
from shardstream.manifest.checks import checksums_fine, path_problem, paths_fine
from shardstream.packing.writer import ShardWriter
from shardstream.storage import Store

FUZZ = settings(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
SHA = re.compile(r"(?:[0-9a-f]{64})?")


def real_manifests() -> list[bytes]:
    """Manifests as shardstream writes them: tar with classes, and Arrow with a schema."""
    out = []
    for fmt in ("tar", "arrow"):
        url = f"memory://fuzz-{uuid.uuid4().hex}/ds"
        classes = ["cat", "dog", "été"] if fmt == "tar" else None
        with ShardWriter(url, format=fmt, samples_per_shard=3, classes=classes) as w:
            for i in range(10):
                w.write({"__key__": f"s{i:03d}", "txt": f"sample {i}", "cls": i % 3})
        out.append(bytes(Store(url).read_bytes(MANIFEST_NAME)))
    return out


REAL = real_manifests()


def outcome(data: bytes | str) -> Manifest | None:
    """Load ``data``: a valid Manifest (checked to hold only what the schema allows), or None for a
    ManifestError; any other exception fails the test."""
    try:
        m = Manifest.from_json(data, "fuzzed")
    except ManifestError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("fuzzed")
        return None
    assert all(path_problem(p) is None for p in m.paths)
    assert len(set(m.paths)) == len(m.paths)
    assert all(isinstance(s, str) and SHA.fullmatch(s) for s in m.sha256)
    assert m.stored_counts.dtype == "int64" and m.nbytes.dtype == "int64"
    assert ((m.stored_counts >= 0) & (m.stored_counts < 2**53)).all() and (
        (m.nbytes >= 0) & (m.nbytes < 2**53)
    ).all()
    again = Manifest.from_json(m.to_json(), "again")  # what it holds can be written and read back
    assert again.to_json() == m.to_json() and again.fingerprint == m.fingerprint
    return m


def finishes(work, timeout: float = 60.0):
    """Run ``work()`` in a thread; fail if it has not finished within ``timeout`` seconds."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "manifest loading did not finish"
    assert result, "manifest loading raised"
    return result[0]


@pytest.mark.parametrize("which", range(len(REAL)))
def test_byte_flips_truncation_and_zeroed_ranges(which):
    data = REAL[which]
    rng = random.Random(which)
    cases = [data[:n] for n in range(0, len(data), max(1, len(data) // 150))]
    for _ in range(300):
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        cases.append(bytes(flipped))
    for _ in range(150):
        start, size = rng.randrange(len(data)), rng.randint(1, 64)
        zeroed = bytearray(data)
        zeroed[start : start + size] = bytes(len(zeroed[start : start + size]))
        cases.append(bytes(zeroed))
    for _ in range(150):  # a character replaced by one JSON gives meaning to
        pos = rng.randrange(len(data))
        cases.append(
            data[:pos]
            + rng.choice([b"-", b"9", b".", b"/", b"\\", b'"', b"e", b"A", b"]"])
            + data[pos + 1 :]
        )
    results = finishes(lambda: [outcome(case) for case in cases])
    assert outcome(data) is not None
    assert sum(r is None for r in results) > len(cases) // 3  # most damage is caught


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "/",
            "a/../b",
            "/etc/passwd",
            "s3://b/x",
            "a\\b",
            "A" * 64,
            "a" * 64,
            "\x1b[2J",
            "%2e%2e",
            "\ud800",
            "x\x00",
        ]
    ),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=20,
)
KEYS = [
    "shardstream_manifest",
    "shard_format",
    "num_shards",
    "num_samples",
    "total_bytes",
    "fields",
    "classes",
    "arrow_schema",
    "created",
    "shards",
]
COLUMNS = ["path", "samples", "bytes", "sha256"]


@st.composite
def hostile_documents(draw) -> str:
    """A real manifest with some of its values (top level, shard columns, single entries, fields)
    replaced by arbitrary JSON, or deleted; serialized with NaN and Infinity allowed."""
    doc = json.loads(draw(st.sampled_from(REAL)))
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["top", "column", "entry", "field", "delete"]))
        if where == "top":
            doc[draw(st.sampled_from(KEYS))] = draw(VALUES)
        elif where == "column" and isinstance(doc.get("shards"), dict):
            doc["shards"][draw(st.sampled_from(COLUMNS))] = draw(st.lists(SCALARS, max_size=6))
        elif where == "entry" and isinstance(doc.get("shards"), dict):
            column = doc["shards"].get(draw(st.sampled_from(COLUMNS)))
            if isinstance(column, list) and column:
                column[draw(st.integers(0, len(column) - 1))] = draw(VALUES)
        elif where == "field" and isinstance(doc.get("fields"), list) and doc["fields"]:
            entry = doc["fields"][0]
            if isinstance(entry, dict):
                entry[draw(st.sampled_from(["name", "type", "samples", "nullable", "other"]))] = (
                    draw(VALUES)
                )
        elif where == "delete":
            doc.pop(draw(st.sampled_from(KEYS)), None)
    return json.dumps(doc, ensure_ascii=draw(st.booleans()))


@FUZZ
@given(hostile_documents())
def test_hostile_documents(text):
    outcome(text)
    outcome(text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(VALUES)
def test_any_json_value(value):
    assert outcome(json.dumps(value)) is None


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 200_000,
        b'{"a":' * 200_000,
        b"-" + b"9" * 100_000,
        b'{"shardstream_manifest": 1' + b', "x": 1' * 100_000,
        b'{"shardstream_manifest": 1, "shards": {"path": [' + b'"a",' * 100_000 + b'"a"]}}',
    ],
)
def test_pathological_json_ends_in_time(data):
    assert finishes(lambda: outcome(data)) is None


PATH_CHARS = st.sampled_from(
    list("ab./%2eEfFc5\\\n\x00\x1b\x7f") + ["\x85", "\xc2", "é", "\u202e", "\ud800"]
)


@FUZZ
@given(st.lists(st.text(PATH_CHARS, max_size=8), max_size=6))
def test_the_joined_path_check_is_the_value_by_value_rule(paths):
    expected = all(path_problem(p) is None for p in paths)
    assert paths_fine(paths) == expected
    with mock.patch.object(checks, "_CHUNK", 2):  # checked in pieces: the pieces' edges too
        assert paths_fine(paths) == expected


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.text(st.sampled_from("0aAfFg\n é"), min_size=62, max_size=66),
            st.sampled_from(["", "a" * 64, "F" * 64, "aB" * 32]),
        ),
        max_size=6,
    )
)
def test_the_joined_checksum_check_is_the_value_by_value_rule(sha):
    valid = all(re.fullmatch(r"[0-9a-fA-F]{64}", s) for s in sha)
    for chunk in (checks._CHUNK, 2):
        with mock.patch.object(checks, "_CHUNK", chunk):
            fine = checksums_fine(sha)
        assert (fine is not None) == valid
        if fine is not None:
            assert fine == [s.lower() for s in sha]
