"""Packing text into token shards: the tokenizer's ids plus EOS, the same shards for any worker count,
uint16/uint32 by vocabulary, Megatron and nanoGPT inputs, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardstream as ss
from shardstream.cli import cli
from shardstream.errors import DatasetExistsError, EncodeError, UsageError
from shardstream.formats.tokens import TokenShard
from shardstream.manifest import dataset_store
from shardstream.manifest.verify import verify
from shardstream.sources.text import write_megatron
from tests.token_corpus import int_tokens, texts, train_tokenizer, write_jsonl


def load(url: str) -> ss.Manifest:
    return ss.load_manifest(dataset_store(url))


def shards(url: str) -> list[TokenShard]:
    m = load(url)
    return [
        TokenShard(Path(url, p).read_bytes(), p, m.tokens["dtype"], int(n))
        for p, n in zip(m.paths, m.stored_counts)
    ]


def documents(url: str) -> list[list[int]]:
    return [
        s.tokens[a:b].tolist() for s in shards(url) for a, b in zip(s.offsets[:-1], s.offsets[1:])
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    docs = texts(600, seed=3)
    write_jsonl(root / "src" / "a.jsonl", docs[:350])
    write_jsonl(root / "src" / "b.jsonl", docs[350:])
    return root, docs, train_tokenizer(root / "tokenizer.json", docs)


def test_shards_hold_the_tokenizers_ids_and_eos_the_same_for_any_worker_count(corpus, tmp_path):
    from tokenizers import Tokenizer

    root, docs, tokenizer = corpus
    one = ss.pack(
        root / "src",
        tmp_path / "one",
        format="tokens",
        tokenizer=str(tokenizer),
        shard_size="1KB",
        workers=1,
        progress=False,
    )
    three = ss.pack(
        root / "src",
        tmp_path / "three",
        format="tokens",
        tokenizer=str(tokenizer),
        shard_size="1KB",
        workers=3,
        progress=False,
    )
    assert one.fingerprint == three.fingerprint and one.manifest.num_shards > 5
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    expected = [e.ids + [eos] for e in tok.encode_batch(docs, add_special_tokens=False)]
    assert documents(str(tmp_path / "one")) == expected
    t = one.manifest.tokens
    assert t == {
        "dtype": "uint16",
        "vocab_size": tok.get_vocab_size(),
        "eos_id": eos,
        "tokenizer": "tokenizer.json",
        "total": sum(map(len, expected)),
    }
    assert one.manifest.num_samples == 600 and verify(one.url).ok
    assert one.summary().startswith(f"packed 600 documents, {t['total']:,} uint16 tokens into ")
    reread = load(one.url)
    assert reread.tokens == t and reread.fingerprint == one.fingerprint


def test_cli_pack_info_and_no_eos(corpus, tmp_path):
    root, docs, tokenizer = corpus
    runner = CliRunner()
    done = runner.invoke(
        cli,
        [
            "pack",
            str(root / "src"),
            str(tmp_path / "d"),
            "--format",
            "tokens",
            "--tokenizer",
            str(tokenizer),
            "--no-eos",
            "-q",
        ],
    )
    assert done.exit_code == 0, done.output
    assert "packed 600 documents" in done.output
    info = json.loads(
        runner.invoke(cli, ["info", str(tmp_path / "d"), "--json", "--seq-len", "8"]).output
    )
    assert info["tokens"]["eos_id"] is None and info["tokens"]["windows"]["seq_len"] == 8
    assert sum(map(len, documents(str(tmp_path / "d")))) == info["tokens"]["total"]
    refused = runner.invoke(
        cli, ["pack", str(root / "src"), str(tmp_path / "e"), "--tokenizer", str(tokenizer)]
    )
    assert refused.exit_code != 0 and "go with --format tokens" in refused.output


def test_vocabulary_sets_the_dtype_and_ids_past_it_are_refused(tmp_path):
    write_jsonl(tmp_path / "src" / "a.jsonl", ["1 2 70000", "3"])
    r = ss.pack(
        tmp_path / "src",
        tmp_path / "big",
        format="tokens",
        tokenizer=int_tokens,
        eos_id=0,
        vocab_size=70001,
        progress=False,
    )
    assert r.manifest.tokens["dtype"] == "uint32" and documents(r.url) == [[1, 2, 70000, 0], [3, 0]]
    with pytest.raises(
        EncodeError, match=r"src: document 0 has token id 70000, outside the vocabulary of 65536"
    ):
        ss.pack(
            tmp_path / "src",
            tmp_path / "small",
            format="tokens",
            tokenizer=int_tokens,
            eos_id=0,
            vocab_size=100,
            progress=False,
        )


def test_tokenizer_errors_are_one_line(corpus, tmp_path):
    root, docs, _ = corpus
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(
        UsageError,
        match=rf"^{bad}: not a tokenizers tokenizer.json \(.*\); give the tokenizer.json",
    ):
        ss.pack(root / "src", tmp_path / "x", format="tokens", tokenizer=str(bad), progress=False)
    plain = train_tokenizer(tmp_path / "plain.json", docs, eos=False)
    with pytest.raises(UsageError, match="declares no end-of-document token: pass --eos-id"):
        ss.pack(root / "src", tmp_path / "y", format="tokens", tokenizer=str(plain), progress=False)


def test_megatron_and_nanogpt_inputs_round_trip(tmp_path):
    docs = [np.arange(n, dtype=np.uint16) * 7 % 5000 for n in (40, 3, 120, 9, 1)]
    (tmp_path / "meg").mkdir()
    write_megatron(str(tmp_path / "meg" / "corpus_text_document"), docs)
    r = ss.pack(
        tmp_path / "meg", tmp_path / "m", format="tokens", shard_size="200B", progress=False
    )
    assert (
        documents(r.url) == [d.tolist() for d in docs]
        and r.manifest.tokens["tokenizer"] == "megatron"
    )
    (tmp_path / "nano").mkdir()
    flat = np.concatenate([np.append(d, 50256) for d in docs]).astype(np.uint16)
    flat.tofile(tmp_path / "nano" / "train.bin")
    done = CliRunner().invoke(
        cli,
        [
            "pack",
            str(tmp_path / "nano"),
            str(tmp_path / "n"),
            "--format",
            "tokens",
            "--dtype",
            "uint16",
            "--eos-id",
            "50256",
            "-q",
        ],
    )
    assert done.exit_code == 0, done.output
    assert documents(str(tmp_path / "n")) == [np.append(d, 50256).tolist() for d in docs]
    assert load(str(tmp_path / "n")).tokens["eos_id"] == 50256


def test_overwrite_with_fewer_token_shards_leaves_none_of_the_old_ones(corpus, tmp_path):
    root, _, tokenizer = corpus
    many = ss.pack(
        root / "src",
        tmp_path / "ds",
        format="tokens",
        tokenizer=str(tokenizer),
        shard_size="1KB",
        progress=False,
    )
    few = ss.pack(
        root / "src",
        tmp_path / "ds",
        format="tokens",
        tokenizer=str(tokenizer),
        shard_size="1MB",
        progress=False,
        overwrite=True,
    )
    assert few.manifest.num_shards < many.manifest.num_shards
    assert sorted(p.name for p in (tmp_path / "ds").glob("shard-*")) == sorted(few.manifest.paths)
    # without overwrite: refused, suggesting no append (token datasets are packed again instead)
    with pytest.raises(DatasetExistsError, match="already holds a dataset") as info:
        ss.pack(
            root / "src", tmp_path / "ds", format="tokens", tokenizer=str(tokenizer), progress=False
        )
    assert "--overwrite" in str(info.value) and "append" not in str(info.value)
