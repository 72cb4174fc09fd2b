"""What every command shares: the ``shardstream`` group, one-line errors, storage flags, quiet logs.

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

from ..errors import ShardstreamError
from ..manifest import Manifest, dataset_store, load_manifest
from ..storage import Store, connection_options
from ..version import __version__


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


def storage_options_for(values: tuple[str, ...], url: str) -> dict[str, Any]:
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


def open_dataset(dataset: str, storage_options: tuple[str, ...]) -> tuple[Store, Manifest]:
    """The store and manifest of DATASET, with the command's storage flags."""
    store = dataset_store(dataset, storage_options_for(storage_options, dataset))
    return store, load_manifest(store)
