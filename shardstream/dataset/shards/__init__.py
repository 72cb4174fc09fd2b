"""How shards are read: the indexed readers, their indexes, ranged and sparse reads, checksums."""
