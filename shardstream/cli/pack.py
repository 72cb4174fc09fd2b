"""``shardstream pack``: a folder tree or table files into a dataset."""

from __future__ import annotations

import click

from .common import cli, safe, storage_option, storage_options_for


@cli.command()
@click.argument("source")
@click.argument("dest")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["tar", "arrow", "tokens"]),
    default=None,
    help="Shard format [default: tar for folders, arrow for tables]; tokens: tokenize text.",
)
@click.option(
    "--shard-size",
    default="256MB",
    show_default=True,
    help="Largest (uncompressed) shard, e.g. 64MB, 1GiB.",
)
@click.option("--samples-per-shard", type=int, default=None, help="Most samples in one shard.")
@click.option(
    "--compression",
    type=click.Choice(["none", "zstd", "gzip", "lz4"]),
    default=None,
    help="tar: whole-shard zstd/gzip [none]; arrow: buffer compression [zstd].",
)
@click.option("--workers", type=int, default=None, help="Parallel writers [default: CPU cores].")
@click.option(
    "--layout",
    type=click.Choice(
        ["auto", "imagefolder", "files", "table", "hdf5", "lmdb", "numpy", "hf", "shards"]
    ),
    default="auto",
    show_default=True,
    help="How to read SOURCE.",
)
@click.option(
    "--fields", default=None, help="HDF5 datasets or .npy files to pack, comma-separated [all]."
)
@click.option("--field-name", default=None, help="LMDB: the field that holds each value [bin].")
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="Run the shard jobs on this machine's cores, or as Ray tasks (the ray extra).",
)
@click.option(
    "--ray-address", default=None, help="ray: the cluster to join [RAY_ADDRESS, else a local one]."
)
@click.option("--overwrite", is_flag=True, help="Replace a dataset already at DEST.")
@click.option(
    "--append",
    is_flag=True,
    help="Add SOURCE's samples to the dataset at DEST as its next version (earlier ones stay readable).",
)
@click.option(
    "--fsync/--no-fsync",
    default=True,
    show_default=True,
    help="Flush shards and manifest to disk before publishing (survives a power loss).",
)
@click.option(
    "--index/--no-index",
    "sample_index",
    default=True,
    show_default=True,
    help="Write each tar shard's sample index (.shardstream/<shard>.idx): every member's checksum, which "
    "every read checks; readers open shards without parsing their headers and fetch single samples of "
    "uncompressed tars from object storage by ranged reads. --no-index: read without per-sample checksums.",
)
@click.option(
    "--image-sizes/--no-image-sizes",
    default=True,
    show_default=True,
    help="Record each image's width and height, read from its header (never decoded), so aspect-ratio "
    "buckets are planned without reading a sample; and each video's and recording's duration, rate, "
    "size and codec from its container headers (with PyAV).",
)
@click.option(
    "--shuffle/--no-shuffle",
    default=True,
    show_default=True,
    help="Write samples in a seeded random order (keys unchanged), so no shard holds one class.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the pack's sample order."
)
@click.option(
    "--split-by",
    type=click.Choice(["cls"]),
    default=None,
    help="One dataset per class under DEST, for MixedDataset.by_label (class-balanced sampling).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--tokenizer", default=None, help="tokens: a Hugging Face tokenizer.json.")
@click.option(
    "--text-field",
    default="text",
    show_default=True,
    help="tokens: the JSONL field or column of text.",
)
@click.option("--no-eos", is_flag=True, help="tokens: append no end-of-document token.")
@click.option(
    "--eos-id", type=int, default=None, help="tokens: the end-of-document id [the tokenizer's]."
)
@click.option(
    "--dtype",
    type=click.Choice(["uint16", "uint32", "int32"]),
    default=None,
    help="tokens: the dtype of flat .bin token files (nanoGPT).",
)
@storage_option
def pack(  # noqa: PLR0913 - one per option
    source: str,
    dest: str,
    fmt: str | None,
    shard_size: str,
    samples_per_shard: int | None,
    compression: str | None,
    workers: int | None,
    layout: str,
    fields: str | None,
    field_name: str | None,
    engine: str,
    ray_address: str | None,
    overwrite: bool,
    append: bool,
    fsync: bool,
    sample_index: bool,
    image_sizes: bool,
    shuffle: bool,
    seed: int,
    split_by: str | None,
    quiet: bool,
    tokenizer: str | None,
    text_field: str,
    no_eos: bool,
    eos_id: int | None,
    dtype: str | None,
    storage_options: tuple[str, ...],
) -> None:
    """Pack SOURCE (a folder tree, table files, an HDF5 file, an LMDB environment, .npy files, a Hugging Face
    save_to_disk folder, or shards to reshard) into a dataset at DEST."""
    from ..packing import PackOptions, pack_with

    tokens = {
        "tokenizer": tokenizer,
        "text_field": text_field,
        "eos": not no_eos,
        "eos_id": eos_id,
        "dtype": dtype,
    }
    if fmt != "tokens" and (
        tokenizer or no_eos or eos_id is not None or dtype or text_field != "text"
    ):
        raise click.UsageError(
            "--tokenizer, --text-field, --no-eos, --eos-id and --dtype go with --format tokens"
        )
    options = PackOptions(
        format=fmt,
        shard_size=shard_size,
        samples_per_shard=samples_per_shard,
        compression=compression,
        workers=workers,
        layout=layout,
        overwrite=overwrite,
        append=append,
        storage_options=storage_options_for(storage_options, dest),
        progress=not quiet,
        fsync=fsync,
        index=sample_index,
        image_sizes=image_sizes,
        shuffle=shuffle,
        seed=seed,
        split_by=split_by,
        field_name=field_name,
        engine=engine,
        ray_address=ray_address,
        fields=[f.strip() for f in fields.split(",") if f.strip()] if fields else None,
        token_options=tokens if fmt == "tokens" else {},
    )
    click.echo(safe(pack_with(source, dest, options).summary()))
