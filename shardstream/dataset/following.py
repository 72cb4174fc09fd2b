"""Which version of a living dataset a ``ShardDataset`` reads, epoch by epoch.

By default (``on_new_version="stay"``) a dataset reads the version it was opened on for as long as it
lives, and a resume state loads only on the version it was saved on. With ``"next_epoch"`` the main
process moves it: a resume state of another version reopens that version for the rest of its epoch, and
each epoch starts on the latest version (read again at the start of every epoch). Never mid-epoch.

Under DDP the ranks agree on the version at each epoch's start (the oldest latest any rank saw, by one
all-reduce), so every rank reads the same data. The version chosen lives in a small shared-memory block, as the position does, so persistent DataLoader
workers reopen the same version (a pinned one, not "the latest" as each would see it) before their next
pass.
"""

from __future__ import annotations

from typing import Literal

from ..errors import UsageError
from .batches.shared_memory import shared_zeros
from .ranks import agree

OnNewVersion = Literal["stay", "next_epoch"]
ON_NEW_VERSION = ("stay", "next_epoch")


def agreed_version(version: int) -> int:
    """The version every rank starts the epoch on: the oldest of the latest versions the ranks saw (a
    publish between two ranks' looks would otherwise give them different data)."""
    return agree(version, "min")


class VersionChoice:
    """The version every process of one dataset reads, as the main process chose it (0: as opened)."""

    def __init__(self, mode: OnNewVersion):
        if mode not in ON_NEW_VERSION:
            raise UsageError(f"on_new_version must be 'stay' or 'next_epoch', not {mode!r}")
        self.mode = mode
        self.block = shared_zeros(1)

    @property
    def follows(self) -> bool:
        """Whether epochs move to the latest version."""
        return self.mode == "next_epoch"

    def choose(self, version: int) -> None:
        self.block.numpy()[0] = int(version)

    def other_than(self, current: int) -> int | None:
        """The chosen version if this process reads another one (it reopens it before a pass), else None."""
        chosen = int(self.block.numpy()[0])
        return chosen if chosen and chosen != current else None


__all__ = ["ON_NEW_VERSION", "OnNewVersion", "VersionChoice", "agreed_version"]
