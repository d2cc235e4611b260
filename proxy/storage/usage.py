"""Which archives are in use: pinned while a response streams them, and when each was last served.

`ArchiveUsage.serving(sha256)` pins an archive in this process for as long as a response sends
it (eviction never removes a pinned archive) and notes the time. Last-served times go where the
metadata's connection is (`ServedTimes`: a Redis sorted set for the fleet, a table of the embedded
file) at most once per `every` seconds per archive and process, so a hot archive costs one write a
minute, not one per request; eviction's grace window (longer than `every`) covers what is not
written yet.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable

from proxy.domain.lru import Lru
from proxy.storage.interface import ServedTimes

WRITE_EVERY = 60.0
REMEMBERED = 100_000  # archives whose last write time this process keeps (the least recently served are dropped)


class ArchiveUsage:
    """Pins and throttled last-served times for one process."""

    def __init__(
        self,
        times: ServedTimes,
        *,
        every: float = WRITE_EVERY,
        grace: float = math.inf,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`grace`: eviction's; a serve not written yet must stay within it, so writes are at most half of it
        apart (a grace below two minutes is for tests only)."""
        self._times = times
        self._every = min(every, grace / 2)
        self._clock = clock
        self._pins: Counter[str] = Counter()
        self._written: Lru[str, float] = Lru(REMEMBERED)  # a use: every serve noted, written or not

    @contextlib.asynccontextmanager
    async def serving(self, sha256: str) -> AsyncIterator[None]:
        """Pin `sha256` while the block runs (a response streams it) and note it as served."""
        self._pins[sha256] += 1
        try:
            await self.note(sha256)
            yield
        finally:
            self._pins[sha256] -= 1
            if self._pins[sha256] <= 0:
                del self._pins[sha256]

    def pinned(self) -> frozenset[str]:
        """The archives a response of this process is sending right now."""
        return frozenset(self._pins)

    def is_pinned(self, sha256: str) -> bool:
        return sha256 in self._pins

    async def note(self, sha256: str) -> None:
        """Record that `sha256` is served now, unless this process wrote its time less than `every` ago."""
        now = self._clock()
        last = self._written.get(sha256)
        if last is not None and 0 <= now - last < self._every:
            self._written.touch(sha256)
            return
        self._written.put(sha256, now)
        await self._times.note_served({sha256: now})

    async def last_served(self, sha256s: list[str]) -> dict[str, float]:
        """When the fleet last served each of `sha256s` (those never served are absent); the page's inventory."""
        wanted = set(sha256s)
        return {sha: at for sha, at in (await self._times.served_times()).items() if sha in wanted}

    def forget(self, sha256: str) -> None:
        """An archive removed from the store: its next serve is written at once."""
        self._written.pop(sha256)
