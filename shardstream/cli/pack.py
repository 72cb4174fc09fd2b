"""``shardstream pack``: a folder tree or table files into a dataset."""

from __future__ import annotations

import click

from .common import cli, safe, storage_option, storage_options_for


@cli.command()
@click.argument("source")
@click.argument("dest")
@click.option("--format", "fmt", type=click.Choice(["tar", "arrow"]), default=None,
              help="Shard format [default: tar for folders, arrow for tables].")
@click.option("--shard-size", default="256MB", show_default=True,
              help="Largest (uncompressed) shard, e.g. 64MB, 1GiB.")
@click.option("--samples-per-shard", type=int, default=None, help="Most samples in one shard.")
@click.option("--compression", type=click.Choice(["none", "zstd", "gzip", "lz4"]), default=None,
              help="tar: whole-shard zstd/gzip [none]; arrow: buffer compression [zstd].")
@click.option("--workers", type=int, default=None, help="Parallel writers [default: CPU cores].")
@click.option("--layout", type=click.Choice(["auto", "imagefolder", "files", "table"]), default="auto",
              show_default=True, help="How to read SOURCE.")
@click.option("--overwrite", is_flag=True, help="Replace a dataset already at DEST.")
@click.option("--fsync/--no-fsync", default=True, show_default=True,
              help="Flush shards and manifest to disk before publishing (survives a power loss).")
@click.option("--shuffle/--no-shuffle", default=True, show_default=True,
              help="Write samples in a seeded random order (keys unchanged), so no shard holds one class.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the pack's sample order.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def pack(source: str, dest: str, fmt: str | None, shard_size: str, samples_per_shard: int | None,
         compression: str | None, workers: int | None, layout: str, overwrite: bool, fsync: bool, shuffle: bool,
         seed: int, quiet: bool,
         storage_options: tuple[str, ...]) -> None:
    """Pack SOURCE (a folder tree or table files) into a dataset at DEST."""
    from ..packing import pack as run_pack

    result = run_pack(
        source, dest, format=fmt, shard_size=shard_size, samples_per_shard=samples_per_shard,
        compression=compression, workers=workers, layout=layout, overwrite=overwrite,
        storage_options=storage_options_for(storage_options, dest), progress=not quiet, fsync=fsync,
        shuffle=shuffle, seed=seed,
    )
    click.echo(safe(result.summary()))
