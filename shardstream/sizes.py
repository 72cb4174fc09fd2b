"""Human byte sizes: parse "256MB" / "1GiB" and format byte counts for people."""

from __future__ import annotations

import re

from .errors import ShardstreamError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, what: str = "shard size") -> int:
    """Bytes in ``value``: an int, or a string like ``"256MB"`` (decimal) or ``"1GiB"`` (binary)."""
    if isinstance(value, bool):
        raise ShardstreamError(f"{what} {value!r} is not a size; give bytes or a string like '256MB'")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE_RE.match(str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ShardstreamError(
                f"{what} {value!r} is not a size; write it like '256MB', '64MiB' or '1000000'"
            )
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ShardstreamError(f"{what} {value!r} must be more than 0 bytes, for example '256MB'")
    return size


def format_size(n: float) -> str:
    """``n`` bytes as a short decimal string: ``512.3 MB``."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
