"""LLM pre-training from a text corpus: train a tokenizer, pack tokens, train a tiny causal transformer.

    python examples/llm_pretrain.py --corpus ./corpus.jsonl --work ./run --steps 200
    python examples/llm_pretrain.py --work ./run --steps 20          # makes a small corpus first

The corpus is JSON Lines with a ``text`` field (Parquet, Arrow and ``.txt`` pack the same way). A BPE
tokenizer is trained on it with Hugging Face ``tokenizers`` and saved as ``tokenizer.json``; ``pack``
tokenizes the corpus into token shards with it; ``TokenDataset`` serves windows of ``seq_len + 1``
tokens (``input_ids``, ``labels``, ``position_ids``, ``cu_seqlens``). The loader's state goes into the
checkpoint beside the model's, so ``--resume`` continues mid-epoch with no window repeated or skipped.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

import shardstream as ss

WORDS = [
    "the",
    "a",
    "data",
    "shard",
    "stream",
    "model",
    "token",
    "train",
    "read",
    "pack",
    "store",
    "batch",
    "epoch",
    "loss",
    "cat",
    "dog",
]


def make_corpus(path: Path, docs: int = 400) -> None:
    """A small JSON Lines corpus of made-up sentences (stands in for yours)."""
    rng = random.Random(0)
    with path.open("w") as f:
        for _ in range(docs):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
            f.write(json.dumps({"text": text}) + "\n")


def train_tokenizer(corpus: Path, out: Path, vocab_size: int = 256) -> None:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<|endoftext|>"])
    lines = (json.loads(line)["text"] for line in corpus.open())
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.save(str(out))


class TinyGPT(torch.nn.Module):
    """A causal transformer of two layers: small enough to train on a CPU in seconds."""

    def __init__(self, vocab: int, seq_len: int, dim: int = 64):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, dim)
        self.positions = torch.nn.Embedding(seq_len, dim)
        layer = torch.nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=4 * dim, batch_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        mask = torch.nn.Transformer.generate_square_subsequent_mask(input_ids.shape[1])
        x = self.tokens(input_ids) + self.positions(position_ids)
        return self.head(self.blocks(x, mask=mask, is_causal=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", help="JSON Lines with a text field (default: make a small one)")
    parser.add_argument(
        "--work", default="run-llm", help="tokenizer, shards and checkpoint go here"
    )
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    corpus = Path(args.corpus) if args.corpus else work / "corpus.jsonl"
    if not args.corpus and not corpus.exists():
        make_corpus(corpus)
    tokenizer = work / "tokenizer.json"
    if not tokenizer.exists():
        train_tokenizer(corpus, tokenizer)
    tokens = work / "tokens"
    if not (tokens / "_manifest.json").exists():
        print(
            ss.pack(
                corpus, tokens, format="tokens", tokenizer=str(tokenizer), shard_size="16KB"
            ).summary()
        )

    ds = ss.TokenDataset(tokens, seq_len=args.seq_len, mask_across_documents=True)
    vocab = ds.manifest.tokens["vocab_size"]
    loader = ds.loader(batch_size=args.batch_size, num_workers=1)
    model = TinyGPT(vocab, args.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    step, checkpoint = 0, work / "ckpt.pt"
    if args.resume:
        saved = torch.load(checkpoint)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        loader.load_state_dict(saved["data"])  # the data position: mid-epoch, exactly
        step = saved["step"]
    end = step + args.steps
    while step < end:
        for batch in loader:  # a finished pass moves on to the next epoch by itself
            logits = model(batch["input_ids"], batch["position_ids"])
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0 or step == end:
                print(f"step {step} epoch {ds.epoch} loss {loss.item():.3f}")
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                torch.save({**state, "data": loader.state_dict()}, checkpoint)
            if step == end:
                break
    print(f"{len(ds)} windows of {args.seq_len} tokens per epoch; vocabulary {vocab}")


if __name__ == "__main__":
    main()
