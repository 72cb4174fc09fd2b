"""Names of a manifest's side files (a split's selection, the recorded image sizes):
``<prefix><16 hex of the content's sha256>-<16 hex of the run><suffix>``.

The content's digest says what a file holds; the run's own random part keeps two runs that write the
same content (two packs of one folder into one place at once, an overwrite with the same images) from
sharing one file, which the losing run, or the winner's clean-up of what it replaced, would remove from
under the other's manifest. Names without the run's part (written before it) still read.
"""

from __future__ import annotations

import re
import uuid


def side_name(prefix: str, suffix: str, digest: str) -> str:
    """A new side file's name for content of sha256 ``digest`` (hex), unique to this run."""
    return f"{prefix}{digest[:16]}-{uuid.uuid4().hex[:16]}{suffix}"


def side_name_fits(name: object, prefix: str, suffix: str, digest: object) -> bool:
    """Whether ``name`` is a side file name of ``prefix`` and ``suffix`` for content of sha256 ``digest``."""
    if not isinstance(name, str) or not isinstance(digest, str) or len(digest) != 64:
        return False
    found = re.fullmatch(
        rf"{re.escape(prefix)}([0-9a-f]{{16}})(?:-[0-9a-f]{{16}})?{re.escape(suffix)}", name
    )
    return found is not None and found[1] == digest[:16]


def side_file_pattern(prefix: str, suffix: str) -> re.Pattern[str]:
    """What names of side files of ``prefix`` and ``suffix`` look like (for a folder's clean-up)."""
    return re.compile(
        rf"^{re.escape(prefix)}[0-9a-f]{{16}}(?:-[0-9a-f]{{16}})?{re.escape(suffix)}$"
    )


__all__ = ["side_file_pattern", "side_name", "side_name_fits"]
