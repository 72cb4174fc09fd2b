"""How batches are shaped and carried: collation, shared memory, buckets, lengths, windows, sequence packing."""
