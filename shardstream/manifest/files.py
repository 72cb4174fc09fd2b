"""A store's manifest file: find the dataset folder of a URL, read its manifest, publish one."""

from __future__ import annotations

from typing import Any

from ..errors import ManifestError, StorageError
from ..storage import RetryPolicy, Store
from .schema import MANIFEST_NAME, Manifest


def dataset_store(url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
                  ) -> Store:
    """The store of the dataset at ``url`` (its folder, or the folder of a ``_manifest.json`` URL)."""
    url = str(url)
    if url.rstrip("/").endswith("/" + MANIFEST_NAME) or url == MANIFEST_NAME:
        url = url.rstrip("/")[: -len(MANIFEST_NAME)] or "."
    return Store(url, storage_options, retry)


def load_manifest(store: Store) -> Manifest:
    """Read the manifest of the dataset in ``store``; a clear error if there is none."""
    try:
        data = store.read_bytes(MANIFEST_NAME)
    except StorageError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            raise ManifestError(
                f"{store.url} holds no dataset: {MANIFEST_NAME} is missing. Pack data there with "
                "'shardstream pack', or write a manifest for existing WebDataset tars with "
                "'shardstream index'"
            ) from None
        raise exc
    return Manifest.from_json(bytes(data), store.url_of(MANIFEST_NAME))


def write_manifest(store: Store, manifest: Manifest) -> None:
    """Publish the dataset: the manifest is written last, atomically."""
    store.write_bytes(MANIFEST_NAME, manifest.to_json())
