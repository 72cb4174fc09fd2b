"""The ``shardstream`` command: pack, info, ls, cat, verify, index.

User mistakes and damaged data end with one ``error:`` line and a non-zero exit,
never a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import click
from tqdm import tqdm

from . import __version__
from .errors import ShardstreamError
from .manifest import dataset_store, load_manifest
from .sizes import format_size
from .storage import connection_options


class _Cli(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ShardstreamError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt:
            click.echo("interrupted; nothing was published", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            sys.stderr.close()  # the reader went away (`| head`); not an error
            ctx.exit(0)
        except OSError as exc:
            where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
            click.echo(f"error:{where} {exc.strerror or exc}", err=True)
            ctx.exit(1)


def _storage_options(values: tuple[str, ...], url: str) -> dict[str, Any]:
    """Storage options for ``url``: --endpoint-url, --anon and --profile, then each -o KEY=VALUE."""
    flags = click.get_current_context().meta.get("shardstream.connection", {})
    out: dict[str, Any] = connection_options(url, **flags)
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--storage-option")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value:
        ctx.meta.setdefault("shardstream.connection", {})[param.name] = value
    return value


def storage_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that say how to reach object storage, for every command."""
    for option in reversed([
        click.option("--endpoint-url", expose_value=False, callback=_remember, metavar="URL",
                     help="S3-compatible or GCS endpoint, e.g. http://127.0.0.1:9000 (MinIO, R2, Ceph)."),
        click.option("--anon", is_flag=True, expose_value=False, callback=_remember,
                     help="Anonymous access to a public bucket."),
        click.option("--profile", expose_value=False, callback=_remember, metavar="NAME",
                     help="AWS credentials profile (s3://)."),
        click.option("--storage-option", "-o", "storage_options", multiple=True, metavar="KEY=VALUE",
                     help="fsspec storage option (repeatable); VALUE is parsed as JSON when it can be."),
    ]):
        command = option(command)
    return command


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardstream")
def cli() -> None:
    """Pack folders and tables into sharded datasets; inspect and verify them."""
    _quiet_logging()


class _NoTraceback(logging.Formatter):
    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return ""

    def format(self, record: logging.LogRecord) -> str:
        record.exc_text = ""
        return super().format(record)


def _quiet_logging() -> None:
    """shardstream's warnings as ``warning: ...`` lines; the storage clients' own error logs (with
    tracebacks) are left out, since the error line that follows says what went wrong."""
    handler = logging.StreamHandler()
    handler.setFormatter(_NoTraceback("warning: %(message)s"))
    log = logging.getLogger("shardstream")
    if not log.handlers:
        log.addHandler(handler)
        log.propagate = False
    for name in ("gcsfs", "s3fs", "fsspec", "aiobotocore", "botocore", "google"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


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
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def pack(source: str, dest: str, fmt: str | None, shard_size: str, samples_per_shard: int | None,
         compression: str | None, workers: int | None, layout: str, overwrite: bool, quiet: bool,
         storage_options: tuple[str, ...]) -> None:
    """Pack SOURCE (a folder tree or table files) into a dataset at DEST."""
    from .packing import pack as run_pack

    result = run_pack(
        source, dest, format=fmt, shard_size=shard_size, samples_per_shard=samples_per_shard,
        compression=compression, workers=workers, layout=layout, overwrite=overwrite,
        storage_options=_storage_options(storage_options, dest), progress=not quiet,
    )
    click.echo(result.summary())


def _open(dataset: str, storage_options: tuple[str, ...]):
    store = dataset_store(dataset, _storage_options(storage_options, dataset))
    return store, load_manifest(store)


@cli.command()
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@storage_option
def info(dataset: str, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """Summarise DATASET: format, counts, sizes, fields, classes."""
    store, m = _open(dataset, storage_options)
    doc = {
        "url": store.url, "shard_format": m.shard_format, "num_shards": m.num_shards,
        "num_samples": m.num_samples, "total_bytes": m.total_bytes, "fields": m.fields,
        "classes": m.classes, "created": m.created,
    }
    if as_json:
        click.echo(json.dumps(doc, indent=2, ensure_ascii=False))
        return
    mean = m.total_bytes / m.num_shards if m.num_shards else 0
    fewest, most = (int(m.samples.min()), int(m.samples.max())) if m.num_shards else (0, 0)
    fields = ", ".join(
        f"{f['name']} ({f['samples']:,})" if "samples" in f else f"{f['name']}: {f['type']}" for f in m.fields
    )
    lines = [
        ("dataset", store.url),
        ("format", m.shard_format),
        ("samples", f"{m.num_samples:,}"),
        ("shards", f"{m.num_shards:,} (mean {format_size(mean)}, {fewest:,}-{most:,} samples)"),
        ("size", format_size(m.total_bytes)),
        ("fields", fields or "-"),
    ]
    if m.classes is not None:
        shown = ", ".join(m.classes[:10]) + (", ..." if len(m.classes) > 10 else "")
        lines.append(("classes", f"{len(m.classes):,}: {shown}"))
    created = m.created
    if created:
        lines.append(("created", " ".join(str(x) for x in (created.get("at"), "by", created.get("by"),
                                                           "from", created.get("source")) if x)))
    width = max(len(k) for k, _ in lines)
    for key, value in lines:
        click.echo(f"{key:<{width}}  {value}")


@cli.command(name="ls")
@click.argument("dataset")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one per shard.")
@storage_option
def ls_(dataset: str, as_json: bool, storage_options: tuple[str, ...]) -> None:
    """List DATASET's shards with sample counts and sizes."""
    _, m = _open(dataset, storage_options)
    rows = zip(m.paths, m.samples.tolist(), m.nbytes.tolist(), m.sha256)
    if as_json:
        for path, n, size, digest in rows:
            click.echo(json.dumps({"path": path, "samples": n, "bytes": size, "sha256": digest}))
        return
    width = max([len(p) for p in m.paths] + [5])
    click.echo(f"{'shard':<{width}}  {'samples':>10}  {'size':>10}  sha256")
    for path, n, size, digest in rows:
        click.echo(f"{path:<{width}}  {n:>10,}  {format_size(size):>10}  {digest[:16]}")
    click.echo(f"{m.num_shards:,} shards, {m.num_samples:,} samples, {format_size(m.total_bytes)}")


def _preview(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        if len(value) <= 200:
            try:
                text = value.decode("utf-8")
                if text.isprintable() or not text.strip("\n\t "):
                    return repr(text) if text != text.strip() else text
            except UnicodeDecodeError:
                pass
        return f"<{len(value):,} bytes: {value[:16].hex(' ')}{' ...' if len(value) > 16 else ''}>"
    if isinstance(value, str) and value.isprintable() and value == value.strip():
        return value if len(value) <= 200 else value[:200] + " ..."
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + " ..."


@cli.command(context_settings={"ignore_unknown_options": True})  # so that INDEX may be -1
@click.argument("dataset")
@click.argument("index", type=int, required=False)
@click.option("--key", default=None, help="Find the sample by its key instead of its index.")
@click.option("--field", default=None, help="Write this field's raw bytes to stdout.")
@storage_option
def cat(dataset: str, index: int | None, key: str | None, field: str | None,
        storage_options: tuple[str, ...]) -> None:
    """Show one sample of DATASET, by INDEX (default 0) or --key."""
    from .inspect import sample_at, sample_by_key

    if index is not None and key is not None:
        raise click.UsageError("give an INDEX or --key, not both")
    store, m = _open(dataset, storage_options)
    sample = sample_by_key(store, m, key) if key is not None else sample_at(store, m, index or 0)
    if field is not None:
        if field not in sample:
            raise ShardstreamError(f"sample {sample.get('__key__')!r} has no field {field!r}; "
                                   f"it has {', '.join(k for k in sample if k != '__key__')}")
        value = sample[field]
        if not isinstance(value, (bytes, bytearray)):
            value = (value if isinstance(value, str) else json.dumps(value, default=str)).encode()
        sys.stdout.buffer.write(value)
        sys.stdout.buffer.flush()
        return
    width = max(len(k) for k in sample)
    for name, value in sample.items():
        click.echo(f"{name:<{width}}  {_preview(value)}")


@cli.command()
@click.argument("dataset")
@click.option("--workers", type=int, default=4, show_default=True, help="Shards checked at once.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def verify(dataset: str, workers: int, quiet: bool, storage_options: tuple[str, ...]) -> None:
    """Check every shard's size and checksum, and that every sample parses."""
    from .verify import verify as run_verify

    options = _storage_options(storage_options, dataset)
    store = dataset_store(dataset, options)
    m = load_manifest(store)
    with tqdm(total=m.total_bytes, unit="B", unit_scale=True, desc="verifying", leave=False,
              disable=True if quiet else None) as bar:
        report = run_verify(dataset, options, workers, on_shard=bar.update)
    if report.ok:
        summary = f"{m.num_shards:,} shards, {m.num_samples:,} samples, {format_size(m.total_bytes)}"
        click.echo(f"ok: {summary} in {store.url}")
        return
    for problem in report.problems:
        click.echo(f"damaged: {problem}", err=True)
    raise ShardstreamError(f"{len(report.problems)} of {m.num_shards} shards are damaged in {store.url}")


@cli.command(name="index")
@click.argument("shards", nargs=-1, required=True)
@click.option("--output", default=None, help="Folder for _manifest.json [default: the shards' folder].")
@click.option("--overwrite", is_flag=True, help="Replace an existing manifest.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@storage_option
def index_(shards: tuple[str, ...], output: str | None, overwrite: bool, quiet: bool,
           storage_options: tuple[str, ...]) -> None:
    """Write a manifest for existing WebDataset tars: files, 'shard-{000..009}.tar' or a folder."""
    from .index import index as run_index

    with tqdm(unit="B", unit_scale=True, desc="indexing", leave=False, disable=True if quiet else None) as bar:
        options = _storage_options(storage_options, output or shards[0])
        result = run_index(list(shards), output, options, overwrite, on_shard=bar.update)
    m = result.manifest
    if result.unkeyed:
        click.echo(f"warning: {len(result.unkeyed)} members have no KEY.EXT name and belong to no sample "
                   f"(webdataset skips them too), e.g. {result.unkeyed[0]!r}", err=True)
    click.echo(f"indexed {m.num_shards:,} shards, {m.num_samples:,} samples, {format_size(m.total_bytes)} "
               f"-> {result.url}/_manifest.json")


def main() -> None:
    cli(prog_name="shardstream")


if __name__ == "__main__":
    main()
