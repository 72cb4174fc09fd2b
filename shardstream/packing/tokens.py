"""``pack(..., format="tokens")``: tokenize a text corpus (or copy token files) into token shards.

Documents are read in the source's order and tokenized ``batch`` at a time by a pool of
threads (a ``tokenizers`` tokenizer encodes a batch in Rust, outside the GIL); results are
taken in order, so the shards are the same whatever ``workers`` is. A shard is cut after
the first document that brings it to ``shard_size`` bytes: cuts depend only on the documents.
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import EncodeError, ShardstreamError, UsageError
from ..formats import tokens as token_format
from ..manifest import Manifest, creation_info, shard_name
from ..sizes import parse_size
from ..sources import REGISTRY
from ..sources.text import TextSource
from ..storage import Store
from .destination import prepare_destination
from .engine import progress_bar
from .options import PackOptions
from .result import PackResult

EOS_NAMES = (
    "<|endoftext|>",
    "</s>",
    "<eos>",
    "[EOS]",
    "<|end_of_text|>",
    "<|eot_id|>",
    "<|im_end|>",
)
BATCH = 1024  # documents per tokenizer call


class Tokenizer:
    """A text -> token ids function: a ``tokenizers`` tokenizer (object or ``tokenizer.json`` path,
    batched in Rust) or any callable ``str -> list[int]``; with its name, vocabulary size and EOS id."""

    def __init__(self, spec: Any, vocab_size: int | None = None):
        self.fast: Any = None
        self.call: Callable[[str], Any] | None = None
        self.eos_id: int | None = None
        if isinstance(spec, (str, os.PathLike)):
            path = os.fspath(spec)
            try:
                import tokenizers

                spec = tokenizers.Tokenizer.from_file(path)
            except ImportError:
                raise UsageError(
                    "tokenizer files need the 'tokenizers' package; pip install tokenizers"
                ) from None
            except Exception as exc:  # tokenizers raises its own Exception for any bad file
                raise UsageError(
                    f"{path}: not a tokenizers tokenizer.json ({str(exc).splitlines()[0][:120]}); "
                    "give the tokenizer.json a Hugging Face tokenizer saves"
                ) from None
            self.name = os.path.basename(path)
        else:
            self.name = getattr(spec, "__name__", type(spec).__name__)
        if hasattr(spec, "encode_batch") and hasattr(spec, "get_vocab_size"):
            self.fast = spec
            self.vocab_size = int(vocab_size or spec.get_vocab_size(with_added_tokens=True))
            for name in EOS_NAMES:
                found = spec.token_to_id(name)
                if found is not None:
                    self.eos_id = int(found)
                    break
        elif callable(spec):
            self.call, self.vocab_size = spec, int(vocab_size or 1 << 32)
        else:
            raise UsageError(
                f"tokenizer must be a tokenizer.json path, a tokenizers.Tokenizer or a callable, "
                f"not {type(spec).__name__}"
            )

    def encode(self, texts: list[str]) -> list[Any]:
        if self.fast is not None:
            encode = getattr(self.fast, "encode_batch_fast", self.fast.encode_batch)
            return [e.ids for e in encode(texts, add_special_tokens=False)]
        return [self.call(text) for text in texts]  # type: ignore[misc]


def _flatten(
    ids: list[Any], eos_id: int | None, limit: int, where: str
) -> tuple[np.ndarray, np.ndarray]:
    """A batch's token ids as one int64 array (each document followed by ``eos_id``) and its lengths."""
    extra = eos_id is not None
    lengths = np.fromiter((len(d) + extra for d in ids), np.int64, len(ids))
    pieces = itertools.chain.from_iterable((d, (eos_id,)) for d in ids) if extra else ids
    flat = np.fromiter(itertools.chain.from_iterable(pieces), np.int64, int(lengths.sum()))
    if len(flat) and (flat.min() < 0 or flat.max() >= limit):
        at = int(((flat < 0) | (flat >= limit)).argmax())
        doc = int(np.searchsorted(np.cumsum(lengths), at, side="right"))
        raise EncodeError(
            f"{where}: document {doc} has token id {int(flat[at])}, outside the vocabulary of "
            f"{limit}; pass the tokenizer's vocab_size (uint32 shards hold ids up to 2**32 - 1)"
        )
    return flat, lengths


class _ShardCutter:
    """Collects documents and writes a shard each time they reach ``limit`` bytes."""

    def __init__(self, store: Store, dtype: str, limit: int, run: str | None = None):
        self.store, self.dtype, self.limit, self.run = store, dtype, limit, run
        self.itemsize = token_format.DTYPES[dtype].itemsize
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.held = 0  # tokens in parts
        self.results: list[
            tuple[str, int, int, str, int]
        ] = []  # name, documents, bytes, sha256, tokens

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        while len(lengths):
            ends = self.held + np.cumsum(lengths)
            full = np.flatnonzero(ends * self.itemsize >= self.limit)
            if not len(full):
                self.parts.append((flat, lengths))
                self.held = int(ends[-1])
                return
            k = int(full[0]) + 1  # documents up to and including the one that fills the shard
            used = int(lengths[:k].sum())
            self.parts.append((flat[:used], lengths[:k]))
            self.flush()
            flat, lengths = flat[used:], lengths[k:]

    def flush(self) -> None:
        if not self.parts:
            return
        tokens = np.concatenate([p[0] for p in self.parts])
        lengths = np.concatenate([p[1] for p in self.parts])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.parts, self.held = [], 0
        name = shard_name(len(self.results), "tokens", self.run)
        digest = hashlib.sha256()
        size = 0
        with self.store.open_write(name) as f:
            for piece in token_format.shard_bytes(tokens, offsets, self.dtype):
                f.write(piece)
                digest.update(piece)
                size += len(piece)
        self.results.append((name, len(lengths), size, digest.hexdigest(), len(tokens)))


def _encoded(
    src: TextSource, tok: Tokenizer, eos_id: int | None, limit: int, workers: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The corpus's batches tokenized, in order, ``workers`` batches in flight."""
    where = src.root

    def job(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _flatten(tok.encode(texts), eos_id, limit, where)

    with ThreadPoolExecutor(workers) as pool:
        pending: collections.deque[Any] = collections.deque()
        for texts in src.texts(BATCH):
            pending.append(pool.submit(job, texts))
            if len(pending) > 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def pack_tokens(
    source: str | os.PathLike[str], dest: str | os.PathLike[str], options: PackOptions
) -> PackResult:
    """``pack(..., format="tokens")``: tokenize ``source`` (JSONL, Parquet, Arrow, plain text) with
    ``options``' ``tokenizer`` into token shards at ``dest``, or copy Megatron ``.bin/.idx`` pairs or flat
    ``.bin`` files (``dtype``) into them; the token options are :class:`~.options.TokenOptions`.

    ``eos``: end each document with the EOS id (the tokenizer's, else ``eos_id``). ``vocab_size``
    fixes the shards' dtype for a callable tokenizer (uint16 when it fits, else uint32).
    """
    started = time.perf_counter()
    source = os.fspath(source)
    limit, workers, t = (
        parse_size(options.shard_size),
        options.execution().workers,
        options.tokens(),
    )
    eos_id, vocab_size = t.eos_id, t.vocab_size
    src: TextSource = REGISTRY["text"].load("text")(
        source,
        text_field=t.text_field,
        per_file=t.per_file,
        dtype=t.dtype,
        eos_id=eos_id,
        storage_options=options.storage_options,
    )
    store = Store(dest, options.storage_options)
    if src.tokenized:
        chunks = list(src.token_chunks())
        vocab = int(vocab_size or max([bound for _, _, bound in chunks] + [1]))
        name, end = src.layout, eos_id
    else:
        if t.tokenizer is None:
            raise UsageError(f"{source} holds text: pass a tokenizer (--tokenizer tokenizer.json)")
        tok = Tokenizer(t.tokenizer, vocab_size)
        vocab, name = tok.vocab_size, tok.name
        end = (tok.eos_id if eos_id is None else int(eos_id)) if t.eos else None
        if t.eos and end is None:
            raise UsageError(
                f"the tokenizer {name} declares no end-of-document token: pass --eos-id (eos_id=) "
                "or --no-eos (eos=False)"
            )
    out_dtype = token_format.dtype_for(vocab)
    claim = prepare_destination(store, options.overwrite, options.fsync, appendable=False)
    cutter = _ShardCutter(store, out_dtype, limit, claim.token)
    with progress_bar(options.progress, None, unit=" docs") as bar:
        if src.tokenized:
            for tokens, offsets, _ in chunks:
                # a file's documents, a piece at a time
                for start in range(0, len(offsets) - 1, 1 << 16):
                    o = offsets[start : start + (1 << 16) + 1]
                    cutter.add(np.asarray(tokens[o[0] : o[-1]]), np.diff(o))
                    bar.update(len(o) - 1)
        else:
            for flat, lengths in _encoded(
                src, tok, end, 1 << (8 * token_format.DTYPES[out_dtype].itemsize), workers
            ):
                cutter.add(flat, lengths)
                bar.update(len(lengths))
        cutter.flush()
    r = cutter.results
    if not r:
        raise ShardstreamError(f"{source} holds no documents; nothing was packed")
    stats = {
        "dtype": out_dtype,
        "vocab_size": vocab,
        "eos_id": end,
        "tokenizer": name,
        "total": sum(x[4] for x in r),
    }
    manifest = Manifest(
        "tokens",
        [x[0] for x in r],
        [x[1] for x in r],
        [x[2] for x in r],
        [x[3] for x in r],
        created=creation_info(
            source=source if "://" in source else os.path.abspath(source), layout=src.layout
        ),
        tokens=stats,
    )
    claim.publish(manifest)
    return PackResult(store.url, manifest, time.perf_counter() - started)
