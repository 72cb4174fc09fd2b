"""Token benchmark: pack and read rates of token shards against their bare upper bounds, same data, same run.

    .venv/bin/python benchmarks/tokens.py                        # 200,000 documents, seq_len 1024
    .venv/bin/python benchmarks/tokens.py --docs 5000 --seq-len 256 --repeat 1     # a quick check
    .venv-bench/bin/python benchmarks/tokens.py --tools shardstream,litdata        # with LitData (see read.py)

Data: ``--docs`` synthetic English-like documents (JSONL, seeded) and a BPE of ``--vocab`` ids trained
on them in the run (nothing is downloaded), in ``--data-dir`` (made once, reused).

- ``pack``: ``ss.pack(..., format="tokens", tokenizer=tokenizer.json)`` tokens/s against the bare path:
  the same tokenizer's ``encode_batch`` over the same texts (1,024 at a time) plus one numpy write of all
  ids, the upper bound. Target: at least 0.8x.
- ``read``: one epoch of ``TokenDataset(seq_len).loader(8, num_workers=W)`` for each ``--workers`` W
  (``d``: the defaults, ``loader(8)`` with nothing else; ``2t``: 2 reader threads, ``workers="threads"``;
  ``2p``: 2 worker processes; a bare count: ``workers="auto"``) (input_ids, labels, position_ids,
  cu_seqlens per batch) tokens/s against nanoGPT's ``get_batch``: random windows of a flat ``np.memmap``
  of the same tokens, stacked into int64 tensors, as many tokens. ``epoch``: the whole epoch from
  ``TokenDataset(...)`` on (the start of its workers included); ``read``: after the first batch.
  Targets: the whole epoch with the defaults at least 1.0x, after the first batch at least 0.8x.
- ``first``: seconds from ``TokenDataset(...)`` to the first batch of its loader.
- ``litdata`` (``--tools`` with litdata, in ``.venv-bench``): ``litdata.optimize`` of the same tokens
  and ``StreamingDataset(item_loader=TokensLoader(block_size=seq_len + 1))`` through its
  ``StreamingDataLoader(batch_size=8, num_workers=2)``, tokens/s. Target: shardstream at least 2x.

Each round runs nanoGPT's loop and each reader in turn, each in a fresh process with torch and shardstream
imported before the clock starts (which goes first alternates by round); a rate is the
median of ``--repeat`` rounds and a ratio the median of the rounds' ratios (each against nanoGPT's loop of
that round). ``--no-pack`` leaves out the pack measure (the shards are packed once if missing).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORDS = (  # noqa: SIM905 - one long line of words, read as words
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "government company number group problem fact be have do say get make go know take see come think look "
    "want give use find tell ask seem feel try leave call good new first last long great little own other old "
    "right big high different small large next early young important few public bad same able"
).split()


def make_data(root: Path, docs: int, vocab: int) -> tuple[Path, Path]:
    corpus, tokenizer = root / "corpus", root / "tokenizer.json"
    marker = root / "data.json"
    if marker.exists() and json.loads(marker.read_text()) == {"docs": docs, "vocab": vocab}:
        return corpus, tokenizer
    shutil.rmtree(root, ignore_errors=True)
    corpus.mkdir(parents=True)
    rng = random.Random(0)
    texts = [
        " ".join(
            rng.choice(WORDS) + rng.choice(("", "", "s", "ed", ",", "."))
            for _ in range(int(rng.lognormvariate(5, 0.8)) + 1)
        )
        for _ in range(docs)
    ]
    for part in range(4):
        with open(corpus / f"part-{part}.jsonl", "w") as f:
            for text in texts[part::4]:
                f.write(json.dumps({"text": text}) + "\n")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        texts[:20000],
        trainers.BpeTrainer(vocab_size=vocab, special_tokens=["[UNK]", "<|endoftext|>"]),
    )
    tok.save(str(tokenizer))
    marker.write_text(json.dumps({"docs": docs, "vocab": vocab}))
    return corpus, tokenizer


def read_texts(corpus: Path) -> list[str]:
    out = []
    for path in sorted(corpus.glob("*.jsonl")):
        with open(path) as f:
            out += [json.loads(line)["text"] for line in f]
    return out


def bare_pack(texts: list[str], tokenizer: Path, out: Path) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    pieces = []
    for start in range(0, len(texts), 1024):
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # the fastest the library has
        ids = [e.ids for e in encode(texts[start : start + 1024], add_special_tokens=False)]
        pieces.append(np.fromiter((t for d in ids for t in (*d, eos)), np.uint16))
    tokens = np.concatenate(pieces)
    tokens.tofile(out)
    return len(tokens)


def ss_pack(corpus: Path, tokenizer: Path, out: Path) -> int:
    import shardstream as ss

    return ss.pack(
        corpus,
        out,
        format="tokens",
        tokenizer=str(tokenizer),
        overwrite=True,
        progress=False,
        shard_size="64MB",
    ).manifest.tokens["total"]


def nanogpt_read(flat: Path, seq_len: int, tokens: int) -> int:
    import torch

    data = np.memmap(flat, dtype=np.uint16, mode="r")
    done, batch = 0, 8
    while done < tokens:  # nanoGPT's get_batch
        ix = torch.randint(len(data) - seq_len - 1, (batch,))
        x = torch.stack([torch.from_numpy(data[i : i + seq_len].astype(np.int64)) for i in ix])
        y = torch.stack(
            [torch.from_numpy(data[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in ix]
        )
        done += int(x.numel())
        del y
    return done


KINDS = {"": "auto", "t": "threads", "p": "processes"}


def ss_read(url: Path, seq_len: int, workers: str) -> tuple[int, float, float]:
    """Tokens of one epoch, seconds to the first batch, and tokens/s after it. ``workers``: ``d`` (the
    loader's defaults), or a count with ``t`` (reader threads) or ``p`` (worker processes) after it, or
    neither (the default kind)."""
    import shardstream as ss

    started = time.perf_counter()
    ds = ss.TokenDataset(str(url), seq_len, seed=1)
    if workers == "d":
        loader = ds.loader(8)
    else:
        count, kind = int(workers.rstrip("tp")), KINDS[workers.lstrip("0123456789")]
        loader = ds.loader(8, num_workers=count, workers=kind)
    done, first, after = 0, None, 0.0
    for batch in loader:
        if first is None:
            after = time.perf_counter()
            first = after - started
        done += int(batch["input_ids"].numel())
    steady = (done - 8 * seq_len) / (time.perf_counter() - after)
    return done, first or 0.0, steady


def litdata_convert(flat: Path, root: Path, seq_len: int) -> Path:
    """The same tokens as LitData chunks (``optimize`` with its TokensLoader), made once, untimed."""
    import litdata as ld
    import torch
    from litdata.streaming.item_loader import TokensLoader

    out = root / f"litdata-{seq_len}"
    if not (out / "index.json").exists():
        data = np.fromfile(flat, dtype=np.uint16)
        pieces = np.array_split(data, 16)
        ld.optimize(
            fn=_litdata_piece,
            inputs=[torch.from_numpy(p.astype(np.int32)) for p in pieces],
            output_dir=str(out),
            chunk_size=(seq_len + 1) * 2048,
            item_loader=TokensLoader(),
            num_workers=1,
        )
    return out


def litdata_read(out: Path, seq_len: int) -> int:
    import litdata as ld
    from litdata.streaming.item_loader import TokensLoader

    ds = ld.StreamingDataset(
        str(out), item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True
    )
    done = 0
    for batch in ld.StreamingDataLoader(ds, batch_size=8, num_workers=2):
        done += int(batch[:, :-1].numel())
    return done


def _litdata_piece(piece):
    yield piece


def timed(fn, *args):
    started = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - started


def in_process(args: argparse.Namespace, reader: str, path: Path, tokens: int = 0) -> list[float]:
    """One read in a process of its own, as a training script makes one loader (so no loader left
    from another reader is collected inside this one's timing): ``[seconds]`` of nanoGPT's loop
    (``reader="nanogpt"``), else ``[tokens, first batch s, tokens/s after it, seconds]``."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", reader, str(path), str(tokens), str(args.seq_len)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def one(reader: str, path: Path, tokens: int, seq_len: int) -> None:
    import torch  # noqa: F401 - imported before any timing, as a training script has it

    import shardstream as ss

    ss.TokenDataset, ss.ShardLoader  # noqa: B018 - the lazily imported stages too, before the clock
    if reader == "nanogpt":
        print(json.dumps([timed(nanogpt_read, path, seq_len, tokens)[1]]))
    else:
        (n, first, steady), seconds = timed(ss_read, path, seq_len, reader)
        print(json.dumps([n, first, steady, seconds]))


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        reader, path, tokens, seq_len = sys.argv[2:6]
        one(reader, Path(path), int(tokens), int(seq_len))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tools", default="shardstream", help="shardstream[,litdata]")
    parser.add_argument(
        "--workers",
        default="d,0,2t,2p",
        help="workers of the read, one pass each: 'd' for the loader's defaults, or a count, 't' after "
        "it for reader threads, 'p' for worker processes [d,0,2t,2p]",
    )
    parser.add_argument("--no-pack", action="store_true", help="leave out the pack measure")
    parser.add_argument("--data-dir", type=Path, default=Path("bench-data") / "tokens")
    args = parser.parse_args()
    import torch  # noqa: F401 - imported before any timing, as a training script has it

    import shardstream  # noqa: F401

    root = args.data_dir.resolve()
    corpus, tokenizer = make_data(root, args.docs, args.vocab)
    texts = read_texts(corpus)
    flat, shards = root / "flat.bin", root / "shards"
    rates: dict[str, list[float]] = {}

    def keep(name: str, rate: float) -> None:
        rates.setdefault(name, []).append(rate)

    def mid(name: str) -> float:
        return statistics.median(rates[name])

    for _ in range(1 if args.no_pack else args.repeat):
        if args.no_pack and flat.exists() and (shards / "_manifest.json").exists():
            break
        n, seconds = timed(bare_pack, texts, tokenizer, flat)
        keep("bare pack", n / seconds)
        n, seconds = timed(ss_pack, corpus, tokenizer, shards)
        keep("shardstream pack", n / seconds)
    total = int(os.path.getsize(flat) // 2)
    lit = None
    if "litdata" in args.tools:
        try:
            lit = litdata_convert(flat, root, args.seq_len)
        except Exception as exc:  # reported, the others still run
            print(f"litdata: cannot convert: {type(exc).__name__}: {exc}", file=sys.stderr)
    counts = args.workers.split(",")
    first_batch: dict[str, list[float]] = {w: [] for w in counts}
    epoch_tokens: dict[str, int] = {}  # tokens of one epoch of each reader (the same every round)
    for round_ in range(args.repeat):
        for w in counts:
            if round_ % 2 and w in epoch_tokens:  # nanoGPT's loop first in odd rounds
                nano = in_process(args, "nanogpt", flat, epoch_tokens[w])[0]
                n, first, steady, seconds = in_process(args, w, shards)
            else:
                n, first, steady, seconds = in_process(args, w, shards)
                nano = in_process(args, "nanogpt", flat, n)[0]
            epoch_tokens[w] = n
            keep("nanoGPT read", n / nano)
            keep(f"read {w}", n / seconds)
            keep(f"steady {w}", steady)
            first_batch[w].append(first)
            keep(f"epoch ratio {w}", nano / seconds)
            keep(f"steady ratio {w}", steady / (n / nano))
            print(
                f"round {round_ + 1}: {w} workers {n / seconds:,.0f} tokens/s, nanoGPT {n / nano:,.0f}, "
                f"ratio {nano / seconds:.2f}",
                file=sys.stderr,
                flush=True,
            )
        if lit is not None:
            try:
                n, seconds = timed(litdata_read, lit, args.seq_len)
                keep("litdata read", n / seconds)
            except Exception as exc:  # reported, the others still run
                print(f"litdata: {type(exc).__name__}: {exc}", file=sys.stderr)
    print(
        f"{args.docs:,} documents, {total:,} tokens, vocabulary {args.vocab}, seq_len {args.seq_len}, "
        f"median of {args.repeat} alternating rounds, {os.cpu_count()} cores"
    )
    if "shardstream pack" in rates:
        print(
            f"pack   shardstream {mid('shardstream pack'):>14,.0f} tokens/s   bare encode_batch+write "
            f"{mid('bare pack'):>14,.0f}   ratio {mid('shardstream pack') / mid('bare pack'):.2f} (target >= 0.80)"
        )
    nano = mid("nanoGPT read")
    for w in counts:
        print(
            f"read   shardstream {mid(f'steady {w}'):>14,.0f} tokens/s, {w} workers   nanoGPT memmap get_batch "
            f"{nano:>12,.0f}   ratio {mid(f'steady ratio {w}'):.2f} (target >= 0.80; after the first batch)"
        )
        print(
            f"epoch  shardstream {mid(f'read {w}'):>14,.0f} tokens/s, {w} workers (the whole epoch, with the "
            f"start of its workers)   ratio {mid(f'epoch ratio {w}'):.2f} "
            f"(rounds {', '.join(f'{r:.2f}' for r in rates[f'epoch ratio {w}'])}); "
            f"first batch after {statistics.median(first_batch[w]):.2f} s"
        )
        if "litdata read" in rates:
            print(
                f"epoch  shardstream {mid(f'read {w}'):>14,.0f} tokens/s, {w} workers   litdata TokensLoader "
                f"(2 workers) {mid('litdata read'):>12,.0f}   ratio {mid(f'read {w}') / mid('litdata read'):.2f} "
                "(target >= 2)"
            )


if __name__ == "__main__":
    main()
