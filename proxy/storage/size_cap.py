"""Keeping the archive store under `--max-store-size`: least-recently-served eviction, one replica at a time.

`Evictor` lists the store every `--eviction-interval` (which also sets the store's size metrics) and
right after a stored archive takes the store past the cap. With a cap, a run takes the fleet lock
`store-eviction` (Redis across replicas, lock files across workers), lists the store again, reads the
fleet's last-served times and removes the victims `proxy.storage.victims` chooses until the store is back
under the cap and the disk above `--min-free-space`. An archive a response of this process is sending
is never removed (its pin is checked once more right before the removal), nor one served or stored
within `--eviction-grace` anywhere; a download under way is a temp file, not an object, so it is
never a candidate. An evicted archive keeps its metadata record: the next request finds no file
behind it and fetches and verifies it again, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from proxy.runtime.coalescing import FleetLocks
from proxy.runtime.metrics import Metrics
from proxy.storage import victims
from proxy.storage.interface import ArchiveStore, ServedTimes
from proxy.storage.objects import ObjectInfo, StoredArchive
from proxy.storage.space import DiskSpace
from proxy.storage.usage import ArchiveUsage

log = structlog.get_logger(__name__)
LOCK_KEY = "store-eviction"


@dataclass(frozen=True)
class EvictionRun:
    """What one run found and did."""

    objects: int
    bytes: int
    excess: int
    evicted: tuple[str, ...] = ()
    freed: int = 0


class Evictor:
    """Size metrics of the store and, with a cap, least-recently-served eviction."""

    def __init__(
        self,
        store: ArchiveStore,
        usage: ArchiveUsage,
        times: ServedTimes,
        locks: FleetLocks,
        space: DiskSpace,
        metrics: Metrics,
        *,
        cap: int | None,
        grace: float,
        interval: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._usage = usage
        self._times = times
        self._locks = locks
        self._space = space
        self._metrics = metrics
        self._cap = cap
        self._grace = grace
        self._interval = interval
        self._clock = clock
        self._bytes = 0
        self._objects = 0
        self._running = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loop: asyncio.Task | None = None
        self._closing = False
        if cap is not None:
            metrics.store_cap(cap)

    def start(self) -> None:
        """Run in the background: a run now, then every interval and whenever `stored` passes the cap."""
        self._wake.set()
        self._loop = asyncio.create_task(self._periodically(), name="store-eviction")

    async def close(self) -> None:
        self._closing = True  # a cancel that Python 3.11's wait_for swallows still ends the loop
        self._wake.set()
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    def stored(self, archive: StoredArchive) -> None:
        """An archive was published: count it, and wake a run if it took the store past the cap."""
        self._bytes += archive.size
        self._objects += 1
        self._report()
        if self._cap is not None and self._bytes > self._cap:
            self._wake.set()

    async def _periodically(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)
            self._wake.clear()
            if self._closing:
                return
            try:
                await self.run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed run must not end the loop: the next one tries again
                log.exception("store.eviction_failed", error=str(exc) or type(exc).__name__)

    async def run(self) -> EvictionRun:
        """One run: measure, and with a cap evict (under the fleet lock) until under it again."""
        async with self._running:
            if self._cap is None:
                return await self._measure()

            async def nobody() -> None:
                return None

            async with self._locks.hold(LOCK_KEY, nobody):
                return await self._evict()

    async def _list(self) -> list[ObjectInfo]:
        """The store's objects, listed once; the counts and the size metrics follow the listing."""
        objects = await self._store.list_objects()
        self._objects, self._bytes = len(objects), sum(obj.size for obj in objects)
        self._report()
        return objects

    async def _measure(self) -> EvictionRun:
        await self._list()
        return EvictionRun(self._objects, self._bytes, 0)

    async def _evict(self) -> EvictionRun:
        objects = await self._list()
        if self._store.local:  # the archives are on this disk: evicting frees it
            space = await self._space.report()
            excess = victims.excess_bytes(self._bytes, self._cap, space.free_bytes, space.min_free_bytes)
        else:  # object storage: only the cap counts (the local disk holds downloads under way)
            excess = victims.excess_bytes(self._bytes, self._cap)
        if excess <= 0:
            return EvictionRun(self._objects, self._bytes, 0)
        try:
            served = await self._times.served_times()
        except Exception as exc:  # Redis down, the file unreadable: evict nothing rather than blindly
            log.warning("store.eviction_skipped", reason=f"last-served times unreadable: {exc}", excess_bytes=excess)
            return EvictionRun(self._objects, self._bytes, excess)
        now = self._clock()
        chosen = victims.victims(
            objects, served, excess=excess, now=now, grace=self._grace, pinned=self._usage.pinned()
        )
        last_used = {obj.sha256: victims.last_use(obj, served, now, self._grace) for obj in chosen}
        evicted, freed = await self._remove(chosen, last_used)
        if len(evicted) < len(chosen) or freed < excess:
            log.warning(
                "store.over_cap",
                excess_bytes=excess - freed,
                reason="the rest is in use (served or stored within --eviction-grace, or being sent now)",
            )
        return EvictionRun(self._objects, self._bytes, excess, tuple(evicted), freed)

    async def _remove(self, chosen: list[ObjectInfo], last_used: dict[str, float]) -> tuple[list[str], int]:
        evicted: list[str] = []
        freed = 0
        for obj in chosen:
            if self._usage.is_pinned(obj.sha256):  # a response began sending it since the choice
                continue
            size = await self._store.remove(obj.sha256)
            if not size:
                continue  # gone already (another process, or gc)
            evicted.append(obj.sha256)
            freed += size
            self._usage.forget(obj.sha256)
            self._bytes -= size
            self._objects -= 1
            self._metrics.evictions.inc()
            self._metrics.evicted_bytes.inc(size)
            log.info("store.evicted", sha256=obj.sha256, bytes=size, last_used=last_used[obj.sha256])
        if evicted:
            await self._times.forget_served(evicted)
            self._report()
            log.info(
                "store.eviction_done", evicted=len(evicted), freed_bytes=freed, store_bytes=self._bytes, cap=self._cap
            )
        return evicted, freed

    def _report(self) -> None:
        self._metrics.store_bytes.set(self._bytes)
        self._metrics.store_objects.set(self._objects)
