"""What ``/proc`` says about processes and the machine: a process tree's memory, busy CPU time, the cores.

Peak memory is that of the whole process tree (the main process and its DataLoader workers, summed),
sampled by the benchmark's parent, outside the measured processes. A summed RSS counts shared pages,
such as memory-mapped shards, once per process; "anon" is the anonymous part alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def _status(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, RSS bytes, anonymous RSS bytes) of ``pid``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except OSError:
        return None
    ppid = rss = anon = 0
    for line in text.split(b"\n"):
        if line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(b"VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"RssAnon:"):
            anon = int(line.split()[1]) * 1024
    return ppid, rss, anon


def descendants(root: int) -> list[int]:
    """``root`` and every process under it (a scan of /proc).

    Only processes with a larger pid than ``root`` are read: descendants are started after it
    (barring pid wrap-around), which keeps a scan cheap enough to repeat every 50 ms.
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) > root:
            status = _status(int(entry.name))
            if status is not None:
                children.setdefault(status[0], []).append(int(entry.name))
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(children.get(pid, ()))
    return out


def tree_memory(pids: Iterable[int]) -> tuple[int, int, int]:
    """(RSS, anonymous RSS, processes alive) of ``pids``, summed."""
    rss = anon = count = 0
    for pid in pids:
        status = _status(pid)
        if status is not None:
            rss, anon, count = rss + status[1], anon + status[2], count + 1
    return rss, anon, count


class TreeSampler:
    """Peak memory of a process tree, summed over its processes at each sample."""

    def __init__(self, root: int):
        self.root = root
        self.peak_rss = self.peak_anon = self.peak_processes = 0

    def sample(self) -> None:
        rss, anon, processes = tree_memory(descendants(self.root))
        if rss > self.peak_rss:
            self.peak_rss, self.peak_processes = rss, processes
        self.peak_anon = max(self.peak_anon, anon)


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (all cores, from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields)
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and its finished (waited-for) descendants."""
    import resource

    me, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
