"""Human byte sizes and counts: parse "256MB" / "1GiB", format byte counts, and "1 shard" / "3 shards"."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from .errors import ShardstreamError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")
_MAX_SIZE = 1 << 62  # far beyond any shard; keeps the value a plain machine integer


def parse_size(value: int | str, what: str = "shard size") -> int:
    """Bytes in ``value``: an int, or a string like ``"256MB"`` (decimal) or ``"1GiB"`` (binary)."""
    if isinstance(value, bool):
        raise ShardstreamError(
            f"{what} {value!r} is not a size; give bytes or a string like '256MB'"
        )
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE_RE.match(str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ShardstreamError(
                f"{what} {value!r} is not a size; write it like '256MB', '64MiB' or '1000000'"
            )
        if len(match.group(1)) > 30:
            raise ShardstreamError(f"{what} {value!r} is far too large; write it like '256MB'")
        try:
            size = int(Decimal(match.group(1)) * _UNITS[unit])
        except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
            raise ShardstreamError(
                f"{what} {value!r} is not a size; write it like '256MB'"
            ) from None
    if size <= 0:
        raise ShardstreamError(f"{what} {value!r} must be more than 0 bytes, for example '256MB'")
    if size > _MAX_SIZE:
        raise ShardstreamError(f"{what} {value!r} is far too large; write it like '256MB'")
    return size


def format_size(n: float) -> str:
    """``n`` bytes as a short decimal string: ``512.3 MB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        text = f"{n:.0f}" if unit == "B" else f"{n:.1f}"
        if abs(float(text)) < 1000 or unit == "TB":
            return f"{text} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` for people: ``count(1, "shard")`` is ``1 shard``, ``count(1200, "shard")`` is
    ``1,200 shards``; ``plural`` for nouns that take more than an ``s`` (``count(2, "class", "classes")``)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
