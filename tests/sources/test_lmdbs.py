"""LMDB sources: each key/value a sample, raw bytes or decoded by a function, keys made safe."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shardstream as ss
from shardstream.errors import ShardstreamError, SourceError
from shardstream.sources import lmdbs
from tests.sample_datasets import without_run

lmdb = pytest.importorskip("lmdb")

KEYS = [f"train/{i:04d}.jpg".encode() for i in range(40)] + [
    b"\xff\x00raw",
    b"a%2Eb",
    b"a.b",
    b"../up",
]


def shard_bytes(dest: Path) -> dict[str, bytes]:
    """The shards' bytes by their names without the run's token."""
    return {without_run(p.name): p.read_bytes() for p in sorted(dest.glob("shard-*"))}


@pytest.fixture
def env(tmp_path: Path) -> Path:
    path = tmp_path / "env.lmdb"
    e = lmdb.open(str(path), map_size=1 << 22)
    with e.begin(write=True) as txn:
        for i, key in enumerate(KEYS):
            txn.put(key, bytes([i % 256]) * (i + 1))
    e.close()
    return path


def decode(key: bytes, value: bytes) -> dict:
    return {"cls": value[0], "txt": key.hex()}


def test_round_trip_raw_values(env: Path, tmp_path: Path) -> None:
    result = ss.pack(env, tmp_path / "out", samples_per_shard=16, progress=False)
    assert result.samples == len(KEYS) and result.manifest.created["layout"] == "lmdb"
    got = {
        s["__key__"]: s for s in ss.ShardDataset(str(tmp_path / "out"), shuffle=False, decode=None)
    }
    assert len(got) == len(KEYS)  # distinct keys stay distinct
    for i, key in enumerate(KEYS):
        s = got[lmdbs.sample_key(key)]
        assert s["bin"] == bytes([i % 256]) * (i + 1)
    assert lmdbs.sample_key(b"train/0003.jpg") == "train%2F0003%2Ejpg"
    assert lmdbs.sample_key(b"a.b") != lmdbs.sample_key(b"a%2Eb")


def test_field_name_and_arrow(env: Path, tmp_path: Path) -> None:
    ss.pack(env, tmp_path / "out", format="arrow", field_name="jpg", progress=False)
    rows = list(ss.ShardDataset(str(tmp_path / "out"), shuffle=False, decode=None))
    assert {tuple(sorted(r)) for r in rows} == {("__key__", "jpg")}
    assert {r["jpg"] for r in rows} == {bytes([i % 256]) * (i + 1) for i in range(len(KEYS))}


def test_decode_value_and_workers_identical(
    env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdbs, "CHUNK", 5)  # nine jobs over two workers
    ss.pack(
        env, tmp_path / "one", decode_value=decode, workers=1, samples_per_shard=7, progress=False
    )
    ss.pack(
        env, tmp_path / "two", decode_value=decode, workers=2, samples_per_shard=7, progress=False
    )
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "two")
    got = {s["__key__"]: s for s in ss.ShardDataset(str(tmp_path / "two"), shuffle=False)}
    assert got[lmdbs.sample_key(KEYS[3])] == {
        "__key__": lmdbs.sample_key(KEYS[3]),
        "cls": 3,
        "txt": KEYS[3].hex(),
    }


def test_a_lambda_decoder_runs_in_workers(env: Path, tmp_path: Path) -> None:
    ss.pack(
        env, tmp_path / "out", decode_value=lambda k, v: {"n": len(v)}, workers=2, progress=False
    )
    assert sorted(s["n"] for s in ss.ShardDataset(str(tmp_path / "out"), shuffle=False)) == list(
        range(1, len(KEYS) + 1)
    )


def test_failing_decoder_names_the_key(env: Path, tmp_path: Path) -> None:
    def picky(key: bytes, value: bytes) -> dict:
        if key == b"a.b":
            raise ValueError("bad record")
        return {"bin": value}

    with pytest.raises(
        ShardstreamError,
        match=r"env.lmdb: decode_value failed on key b'a.b': ValueError: bad record",
    ):
        ss.pack(env, tmp_path / "out", decode_value=picky, workers=2, progress=False)
    assert not (tmp_path / "out" / "_manifest.json").exists()


def test_unreadable_environment(tmp_path: Path) -> None:
    path = tmp_path / "broken"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"\0" * 100)
    with pytest.raises(
        SourceError, match=r"cannot read LMDB environment .*broken: .*data.mdb"
    ) as info:
        ss.pack(path, tmp_path / "out", progress=False)
    assert "\n" not in str(info.value)


def test_empty_environment_and_both_options(tmp_path: Path, env: Path) -> None:
    empty = tmp_path / "empty"
    lmdb.open(str(empty), map_size=1 << 20).close()
    assert os.path.exists(empty / "data.mdb")
    with pytest.raises(SourceError, match="holds no keys"):
        ss.pack(empty, tmp_path / "out", progress=False)
    with pytest.raises(SourceError, match="not both"):
        ss.pack(env, tmp_path / "out", field_name="x", decode_value=decode, progress=False)


def test_command_line_field_name(env: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from shardstream.cli import cli

    result = CliRunner().invoke(
        cli, ["pack", str(env), str(tmp_path / "out"), "--field-name", "jpg", "-q"]
    )
    assert result.exit_code == 0, result.output
    assert {f["name"] for f in ss.ShardDataset(str(tmp_path / "out")).manifest.fields} == {"jpg"}
