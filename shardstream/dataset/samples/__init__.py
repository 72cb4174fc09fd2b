"""Samples from open shards: decoders by field extension, transform, skipping what fails."""
