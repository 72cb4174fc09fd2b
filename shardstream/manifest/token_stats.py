"""Token statistics of a manifest of token shards (``shard_format: "tokens"``).

The manifest's ``tokens`` object holds what the whole dataset shares: ``dtype`` (``uint16`` or
``uint32``), ``vocab_size``, ``eos_id`` (null: none was appended), ``tokenizer`` (a name, or null)
and ``total`` (tokens in all shards). A shard's ``samples`` are its documents; its token count
follows from its size (see :mod:`shardstream.formats.tokens`), so nothing in the manifest grows
with the number of tokens or documents.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..formats import tokens as token_format

_KEYS = {"dtype", "vocab_size", "eos_id", "tokenizer", "total"}


def check_tokens(m: Any) -> str | None:
    """What is wrong with manifest ``m``'s token statistics, or None."""
    t = m.tokens
    if m.shard_format != "tokens":
        return f"'tokens' describes token shards, and the shards are {m.shard_format}"
    if not isinstance(t, dict) or set(t) != _KEYS:
        return f"'tokens' must be an object with exactly {', '.join(sorted(_KEYS))}"
    if t["dtype"] not in token_format.DTYPES:
        return f"tokens.dtype must be uint16 or uint32, not {str(t['dtype'])[:40]!r}"
    limit = 1 << (8 * token_format.DTYPES[t["dtype"]].itemsize)
    if type(t["vocab_size"]) is not int or not 0 < t["vocab_size"] <= limit:
        return f"tokens.vocab_size must be a whole number from 1 to {limit} for {t['dtype']}"
    if t["eos_id"] is not None and (
        type(t["eos_id"]) is not int or not 0 <= t["eos_id"] < t["vocab_size"]
    ):
        return "tokens.eos_id must be null or a token id below vocab_size"
    if t["tokenizer"] is not None and (
        not isinstance(t["tokenizer"], str) or "\x00" in t["tokenizer"]
    ):
        return "tokens.tokenizer must be null or text"
    counts = token_format.tokens_in(m.nbytes, m.stored_counts, t["dtype"])
    bad = (counts < 0) | (counts != np.floor(counts))
    if bad.any():
        i = int(bad.argmax())
        return (
            f"shard {i}: {int(m.nbytes[i])} bytes cannot hold {int(m.stored_counts[i])} documents of "
            f"{t['dtype']} tokens"
        )
    if type(t["total"]) is not int or int(counts.sum()) != t["total"]:
        return f"tokens.total {str(t['total'])[:30]} does not agree with the shards' sizes ({int(counts.sum())})"
    return None


def shard_tokens(m: Any) -> np.ndarray:
    """Tokens per shard (int64) of a manifest of token shards."""
    return token_format.tokens_in(m.nbytes, m.stored_counts, m.tokens["dtype"]).astype(np.int64)


def token_windows(m: Any, seq_len: int) -> np.ndarray:
    """Windows of ``seq_len + 1`` tokens (overlapping by one) per shard."""
    return np.maximum(shard_tokens(m) - 1, 0) // seq_len


def describe(m: Any, seq_len: int | None = None) -> list[tuple[str, Any]]:
    """``info`` lines for a token dataset: (label, value); with ``seq_len``, its token windows and the tokens
    that are no label in an epoch (each shard's first, and its tail of fewer than ``seq_len``)."""
    t = m.tokens
    lines: list[tuple[str, Any]] = [
        ("tokens", f"{t['total']:,}"),
        ("documents", f"{m.num_stored:,}"),
        ("vocabulary", f"{t['vocab_size']:,} ({t['dtype']})"),
        ("eos id", "none" if t["eos_id"] is None else str(t["eos_id"])),
        ("tokenizer", t["tokenizer"] or "unknown"),
    ]
    if seq_len is not None:
        w = token_window_stats(m, seq_len)
        lines.append(
            (
                "token windows",
                f"{w['windows']:,} of {seq_len + 1} tokens (seq_len {seq_len}); "
                f"{w['no_label']:,} tokens are no label per epoch (shard heads and tails)",
            )
        )
    return lines


def token_window_stats(m: Any, seq_len: int) -> dict[str, int]:
    """The windows of ``seq_len`` and the tokens that are no label in an epoch."""
    count = int(token_windows(m, seq_len).sum())
    return {"seq_len": seq_len, "windows": count, "no_label": m.tokens["total"] - count * seq_len}
