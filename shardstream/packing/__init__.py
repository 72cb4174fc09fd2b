"""Packing: sources into shards, written in parallel, published with the manifest last.

``api`` (``pack``: its keywords become a frozen ``PackOptions`` (``options``), and what is asked
picks the packer), ``driver`` (packing a source: plan the shards, run them, publish; ``result``
says what came of it), ``engine`` (the local process pool or Ray, which run a shard plan), ``folder`` and ``table`` (shards from folder and table sources),
``writer`` (``ShardWriter``, sample by sample), ``fields`` (encoding values by extension),
``rules`` (formats, shard limits) and ``destination`` (claim, clean up, publish).
"""

from .api import pack, pack_with
from .engine import default_workers
from .options import PackOptions
from .result import PackResult
from .writer import ShardWriter

__all__ = ["PackOptions", "PackResult", "ShardWriter", "default_workers", "pack", "pack_with"]
