"""Token shards on S3: one CLI command tokenizes a local JSONL corpus into a bucket, and TokenDataset
streams it through the disk cache with the same windows as a local copy."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from shardstream import TokenDataset
from shardstream.cli import cli
from tests.token_corpus import texts, train_tokenizer, write_jsonl


def epoch(ds: TokenDataset) -> np.ndarray:
    return np.concatenate([b["input_ids"].numpy() for b in ds.loader(4, 1)])


def test_pack_text_to_s3_and_read_it_back(s3_bucket, tmp_path):
    docs = texts(300, seed=5)
    write_jsonl(tmp_path / "corpus" / "a.jsonl", docs)
    tokenizer = train_tokenizer(tmp_path / "tokenizer.json", docs)
    url = s3_bucket.url("tokens")
    runner = CliRunner()
    args = [
        str(tmp_path / "corpus"),
        url,
        "--format",
        "tokens",
        "--tokenizer",
        str(tokenizer),
        "--shard-size",
        "2KB",
        "-q",
        *s3_bucket.cli_options,
    ]
    for dest in (url, str(tmp_path / "local")):
        args[1] = dest
        done = runner.invoke(cli, ["pack", *args])
        assert done.exit_code == 0, done.output
    verified = runner.invoke(cli, ["verify", url, *s3_bucket.cli_options])
    assert verified.exit_code == 0, verified.output
    remote = TokenDataset(
        url, 16, seed=4, storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "cache"
    )
    local = TokenDataset(str(tmp_path / "local"), 16, seed=4)
    assert len(remote) == len(local) > 0
    assert (epoch(remote) == epoch(local)).all()


def test_pack_a_corpus_that_lies_in_the_bucket(s3_bucket, tmp_path):
    import shardstream as ss

    docs = texts(50, seed=6)
    s3_bucket.write("corpus/b.jsonl", "".join(f'{{"text": "{d}"}}\n' for d in docs[25:]).encode())
    s3_bucket.write("corpus/a.jsonl", "".join(f'{{"text": "{d}"}}\n' for d in docs[:25]).encode())
    write_jsonl(tmp_path / "local" / "a.jsonl", docs)
    tokenizer = str(train_tokenizer(tmp_path / "tokenizer.json", docs))
    remote = ss.pack(
        s3_bucket.url("corpus"),
        s3_bucket.url("tokens"),
        format="tokens",
        tokenizer=tokenizer,
        storage_options=s3_bucket.storage_options,
        progress=False,
    )
    local = ss.pack(
        tmp_path / "local",
        tmp_path / "tokens",
        format="tokens",
        tokenizer=tokenizer,
        progress=False,
    )
    assert remote.fingerprint == local.fingerprint  # the same documents in the same order
