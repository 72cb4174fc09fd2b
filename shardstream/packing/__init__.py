"""Packing: sources into shards, written in parallel, published with the manifest last.

``driver`` (``pack``: plan the shards, run them, publish), ``engine`` (the local process pool
that runs a shard plan), ``folder`` and ``table`` (shards from folder and table sources),
``writer`` (``ShardWriter``, sample by sample), ``fields`` (encoding values by extension),
``rules`` (formats, shard limits) and ``destination`` (claim, clean up, publish).
"""

from .driver import PackResult, pack
from .engine import default_workers
from .writer import ShardWriter

__all__ = ["PackResult", "ShardWriter", "default_workers", "pack"]
