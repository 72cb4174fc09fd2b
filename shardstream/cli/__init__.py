"""The ``shardstream`` command, one module per command group: ``pack``; ``show`` (info, ls,
cat); ``check`` (verify, index); ``doctor``. ``common`` holds the group, the storage flags, the
one-line errors and the terminal-safe printing (``safe``) they all share.
"""

from .bench import bench
from .check import index_, verify
from .common import cli, storage_option
from .doctor import doctor
from .pack import pack
from .show import cat, info, ls_

__all__ = ["bench", "cat", "cli", "doctor", "index_", "info", "ls_", "main", "pack", "storage_option", "verify"]


def main() -> None:
    cli(prog_name="shardstream")

