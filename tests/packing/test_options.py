"""pack()'s keywords: a misspelt one is a TypeError naming the likely one; a setting the pack would
ignore is refused with one line naming it; the ones every packer takes are honoured."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardstream as ss
from shardstream.errors import SourceError, UsageError
from shardstream.manifest.side_names import index_name
from shardstream.packing.options import SAME, TAKES, TOKEN_OPTIONS, PackOptions, TokenOptions
from tests.folders import folder_files
from tests.sample_datasets import make_files


def jpeg(i: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4 + i, 3), (i, 2, 3)).save(out, format="JPEG")
    return out.getvalue()


def image(name: str) -> dict:
    return {"__key__": name, "jpg": jpeg(len(name)), "cls": len(name)}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_files(tmp_path / "src", {f"s{i}.txt": f"text {i}".encode() for i in range(6)})


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(5)))
    return path


def tokenize(text: str) -> list[int]:
    return [ord(c) % 200 for c in text]


@pytest.mark.parametrize(
    ("given", "likely"),
    [
        ({"shard_sise": "1MB"}, "shard_size"),
        ({"sampels_per_shard": 3}, "samples_per_shard"),
        ({"tokeniser": "t.json"}, "tokenizer"),
        ({"eos_idd": 3}, "eos_id"),
    ],
)
def test_a_misspelt_keyword_is_a_type_error_naming_the_likely_one(
    folder: Path, tmp_path: Path, given: dict, likely: str
) -> None:
    name = next(iter(given))
    with pytest.raises(TypeError) as caught:
        ss.pack(folder, tmp_path / "out", progress=False, **given)
    assert str(caught.value) == (
        f"pack() got an unexpected keyword argument {name!r}; did you mean {likely!r}?"
    )
    assert not (tmp_path / "out").exists()


def test_an_unknown_keyword_without_a_likely_one(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"^pack\(\) got an unexpected keyword argument 'zzz'$"):
        ss.pack(folder, tmp_path / "out", zzz=1)


def test_tokens_refuse_the_settings_they_would_ignore(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        ss.pack(
            corpus,
            tmp_path / "out",
            format="tokens",
            tokenizer=tokenize,
            compression="zstd",
            samples_per_shard=1,
            engine="ray",
            progress=False,
        )
    message = str(caught.value)
    assert message.startswith(
        "compression, engine, samples_per_shard do not apply to format='tokens'"
    )
    assert "\n" not in message and message.endswith("leave them out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "setting",
    [
        {"layout": "files"},
        {"seed": 3},
        {"fields": ["x"]},
        {"field_name": "v"},
        {"source_options": {"anon": True}},
        {"ray_address": "ray://x:1"},
        {"index": True, "shard_size": "1MB", "samples_per_shard": 2},  # given, taken, ignored
    ],
)
def test_tokens_refuse_each_setting_they_ignore(
    corpus: Path, tmp_path: Path, setting: dict
) -> None:
    ignored = list(setting)[-1]
    with pytest.raises(UsageError, match=f"^{ignored} does not apply to format="):
        ss.pack(
            corpus, tmp_path / "out", format="tokens", tokenizer=tokenize, progress=False, **setting
        )


def test_tokens_take_what_they_do_anyway(corpus: Path, tmp_path: Path) -> None:
    result = ss.pack(
        corpus,
        tmp_path / "out",
        format="tokens",
        tokenizer=tokenize,
        eos_id=199,
        compression="none",
        shuffle=False,
        index=False,
        image_sizes=False,
        workers=1,
        progress=False,
    )
    assert result.manifest.shard_format == "tokens" and result.samples == 5


@pytest.mark.parametrize(
    "setting",
    [
        {"layout": "files"},
        {"seed": 4},
        {"tokenizer": tokenize},
        {"split_by": "cls"},
        {"source_options": {"anon": True}},
        {"fields": ["x"]},
    ],
)
def test_a_function_pack_refuses_each_setting_it_ignores(tmp_path: Path, setting: dict) -> None:
    (name,) = setting
    with pytest.raises(UsageError, match=f"^{name} does not apply to a pack from fn="):
        ss.pack(["a", "bb"], tmp_path / "out", fn=image, progress=False, **setting)
    assert not (tmp_path / "out").exists()


def indexes(dest: Path) -> list[str]:
    """The sample indexes anywhere under ``dest``."""
    return [n for n in folder_files(dest) if n.endswith(".idx")]


def test_a_function_pack_honours_index_and_image_sizes(tmp_path: Path) -> None:
    inputs = ["a", "bb", "ccc"]
    kept = ss.pack(inputs, tmp_path / "kept", fn=image, shuffle=False, progress=False)
    assert indexes(tmp_path / "kept") == [index_name(p) for p in kept.manifest.paths]
    assert kept.manifest.image_sizes is not None
    bare = ss.pack(
        inputs, tmp_path / "bare", fn=image, index=False, image_sizes=False, progress=False
    )
    assert not indexes(tmp_path / "bare")
    assert bare.manifest.image_sizes is None and not bare.manifest.index_sha256
    assert folder_files(tmp_path / "bare") == sorted(["_manifest.json", *bare.manifest.paths])


def test_a_numpy_source_honours_index_and_image_sizes(tmp_path: Path) -> None:
    src = tmp_path / "arrays"
    src.mkdir()
    np.save(src / "x.npy", np.arange(12).reshape(6, 2))
    kept = ss.pack(src, tmp_path / "kept", progress=False)
    assert indexes(tmp_path / "kept") == [index_name(p) for p in kept.manifest.paths]
    bare = ss.pack(src, tmp_path / "bare", index=False, progress=False)
    assert not indexes(tmp_path / "bare") and not bare.manifest.index_sha256


def test_a_seed_without_shuffle_is_refused(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="^seed draws the order of a shuffled pack"):
        ss.pack(folder, tmp_path / "out", shuffle=False, seed=3, progress=False)


def test_a_ray_address_without_ray_is_refused(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="^ray_address is the cluster of engine='ray'"):
        ss.pack(folder, tmp_path / "out", ray_address="ray://head:10001", progress=False)


def test_source_options_for_a_local_source_are_refused(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="^source_options reach a source in object storage"):
        ss.pack(folder, tmp_path / "out", source_options={"anon": True}, progress=False)


def test_a_split_pack_refuses_sample_source_settings(tmp_path: Path) -> None:
    src = make_files(tmp_path / "src", {f"{c}/{i}.jpg": jpeg(i) for c in "ab" for i in range(2)})
    with pytest.raises(SourceError, match="field_name apply to HDF5, LMDB and NumPy sources"):
        ss.pack(src, tmp_path / "out", split_by="cls", field_name="v", progress=False)


def test_token_options_are_the_fields_of_token_options() -> None:
    keywords = [f.name for f in dataclasses.fields(TokenOptions)]
    forwarded = {"shard_size", "workers", "overwrite", "storage_options", "progress", "fsync"}
    assert tuple(k for k in keywords if k not in forwarded) == TOKEN_OPTIONS
    assert forwarded <= TAKES["text"]


def test_every_setting_is_taken_by_some_pack() -> None:
    settings = {f.name for f in dataclasses.fields(PackOptions)} - {"token_options"}
    taken = set().union(*TAKES.values())
    assert settings <= taken
    assert set(TAKES) == set(ss.packing.api.REQUESTS)
    for request, same in SAME.items():
        assert not set(same) & TAKES[request]  # a value taken anyway, for a setting not taken
