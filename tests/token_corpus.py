"""Shared helpers for the token tests: a tiny BPE trained here (nothing is downloaded), and corpora
whose token ids are their positions, so that every token read back says where it came from."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "cats",
    "run",
    "fast",
    "and",
    "slow",
    "under",
    "red",
    "blue",
    "skies",
]


def texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) for _ in range(n)]


def train_tokenizer(path: Path, corpus: list[str] | None = None, eos: bool = True) -> Path:
    """A tiny BPE (at most 120 ids) trained on ``corpus``, saved as ``path`` (tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["[UNK]"] + (["<|endoftext|>"] if eos else [])
    tok.train_from_iterator(
        corpus or texts(300), trainers.BpeTrainer(vocab_size=120, special_tokens=special)
    )
    tok.save(str(path))
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({field: d}) + "\n" for d in docs))
    return path


def position_corpus(folder: Path, lengths: list[int]) -> tuple[Path, np.ndarray]:
    """JSONL documents of ``lengths`` tokens whose ids count up from 0 (read by :func:`int_tokens`);
    returns the folder and the document offsets."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    docs = [" ".join(map(str, range(offsets[i], offsets[i + 1]))) for i in range(len(lengths))]
    write_jsonl(folder / "docs.jsonl", docs)
    return folder, offsets


def int_tokens(text: str) -> list[int]:
    """A tokenizer callable: whitespace-separated integers."""
    return [int(x) for x in text.split()]


def pack_positions(
    tmp: Path, lengths: list[int], shard_size: str = "256B", name: str = "ds"
) -> tuple[str, np.ndarray]:
    """A token dataset of :func:`position_corpus` (no EOS, so ids are unique); (url, offsets)."""
    from shardstream import pack

    src, offsets = position_corpus(tmp / f"{name}-src", lengths)
    pack(
        src,
        tmp / name,
        format="tokens",
        tokenizer=int_tokens,
        eos=False,
        vocab_size=int(offsets[-1]) + 1,
        shard_size=shard_size,
        progress=False,
        workers=2,
    )
    return str(tmp / name), offsets
