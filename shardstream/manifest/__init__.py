"""The manifest: what makes a folder of shards a dataset, and the tools that read or make one.

``schema`` (the ``Manifest`` and its JSON), ``files`` (a store's manifest file: read, publish),
``locate`` (a dataset's store and manifest from a URL, or a manifest made on the fly for bare
WebDataset tars), ``index_tars`` (publish a manifest for existing tars), ``index_parquet`` (one
for Parquet files read in place), ``verify`` (every
shard against its manifest entry) and ``sample_set`` (which samples of which shard a dataset names).
"""

from .files import dataset_store, write_manifest
from .locate import load_dataset, open_dataset
from .schema import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SHARD_FORMATS,
    Manifest,
    creation_info,
    shard_name,
)
from .versions import load_manifest

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SHARD_FORMATS",
    "Manifest",
    "creation_info",
    "dataset_store",
    "load_dataset",
    "load_manifest",
    "open_dataset",
    "shard_name",
    "write_manifest",
]
