"""A mix's remote sources: each one's shards downloaded ahead, in the order the mix reaches them.

The mix reads its sources interleaved, so each remote source gets a prefetcher of its own (with the
source's byte budget) that is told, chunk by chunk, which of its shards the next chunks read.
Token sources and local ones read in place, with nothing to fetch ahead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ...storage import Prefetcher

# chunks whose shards are fetched ahead (the prefetchers' byte budgets bound the bytes)
LOOK_AHEAD = 16


class SourcePrefetch:
    """Prefetchers for the remote sources among ``sources`` (``shards[i]``: source ``i``'s open shards)."""

    def __init__(self, sources: Sequence[Any], shards: Sequence[Any], depth: int = LOOK_AHEAD):
        self.depth = max(int(depth), 2)
        self.prefetchers: dict[int, tuple[Prefetcher[Any], Any]] = {}
        for i, (source, open_shards) in enumerate(zip(sources, shards)):
            if open_shards is None or source.store.local:
                continue
            nbytes = source.manifest.nbytes
            prefetcher: Prefetcher[Any] = Prefetcher(
                open_shards.load, lambda k, n=nbytes: int(n[k]), source.storage.prefetch_bytes
            )
            open_shards.attach(prefetcher)
            self.prefetchers[i] = (prefetcher, open_shards)

    def ahead(self, chunks: Iterable[tuple[Any, list[Any]]]) -> Iterator[tuple[Any, list[Any]]]:
        """The chunks (positions, located parts), while the shards of the next ones are fetched."""
        if not self.prefetchers:
            yield from chunks
            return
        it = iter(chunks)
        queue: deque[tuple[Any, list[Any]]] = deque()
        for item in it:
            queue.append(item)
            if len(queue) >= self.depth:
                break
        while queue:
            self._tell(queue)
            yield queue.popleft()
            following = next(it, None)
            if following is not None:
                queue.append(following)

    def _tell(self, queue: Iterable[tuple[Any, list[Any]]]) -> None:
        for i, (prefetcher, open_shards) in self.prefetchers.items():
            order: dict[int, None] = {}
            for _, located in queue:
                for source, _, ids, _ in located:
                    if source == i:
                        order.update(dict.fromkeys(ids.tolist()))
            wanted = list(order)
            prefetcher.want(wanted)
            prefetcher.keep_only(wanted)
            open_shards.retain(set(wanted))

    def close(self) -> None:
        for prefetcher, open_shards in self.prefetchers.values():
            prefetcher.close()
            open_shards.detach()


__all__ = ["LOOK_AHEAD", "SourcePrefetch"]
