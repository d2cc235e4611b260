"""Shared upstream work: one fetch per key in this process and, with fleet locks, in the fleet.

A request joins the shared fetch of a key for at most its remaining deadline (then 504
naming the upstream URL, while the fetch goes on for the others). Documents, SHA256SUMS
and archives all go through one `SharedFetches`, so shutdown can wait for and cancel them all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import structlog

from proxy.runtime import deadline
from proxy.runtime.coalescing import FleetLocks, LocalLocks, SingleFlight

log = structlog.get_logger(__name__)
T = TypeVar("T")


class SharedFetches:
    """The process's single flights and the fleet's locks."""

    def __init__(self, locks: FleetLocks | None = None) -> None:
        self.locks = locks or LocalLocks()
        self.in_process = SingleFlight()
        self._shutdown_timer: asyncio.TimerHandle | None = None

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """Join (or start) the shared work of `key`, waiting as long as it takes."""
        return await self.in_process.run(key, work)

    async def join(self, key: str, work: Callable[[], Awaitable[T]], what: str) -> T:
        """Join (or start) the shared work of `key`, waiting at most the request's remaining deadline."""
        try:
            async with asyncio.timeout(deadline.remaining()) as scope:
                return await self.in_process.run(key, work)
        except TimeoutError:
            if not scope.expired():
                raise
        log.warning("upstream.deadline_exceeded", key=key, upstream=what)
        raise deadline.timed_out(what)

    async def once_for_the_fleet(
        self,
        key: str,
        recheck: Callable[[], Awaitable[T | None]],
        work: Callable[[], Awaitable[T]],
        what: str | None = None,
    ) -> T:
        """Run `work` once per key in this process and, with fleet locks, once in the fleet.

        A request waits for it at most its deadline (504 naming `what`, the upstream URL).
        """

        async def locked() -> T:
            async with self.locks.hold(key, recheck) as done:
                return done if done is not None else await work()

        return await self.join(key, locked, what or key)

    def begin_shutdown(self, grace: float) -> None:
        """Requests may wait for running fetches `grace` seconds more; then the fetches are cancelled."""
        self._shutdown_timer = asyncio.get_running_loop().call_later(grace, self._cancel_all)

    def _cancel_all(self) -> None:
        cancelled = self.in_process.cancel_all()
        if cancelled:
            log.info("proxy.fetches_cancelled", count=cancelled)

    async def close(self) -> None:
        """At shutdown (requests have had their grace): cancel the fetches still running, wait for their cleanup."""
        if self._shutdown_timer is not None:
            self._shutdown_timer.cancel()
        self._cancel_all()
        await self.in_process.close(grace=0)


async def gather_bounded(coros: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """`asyncio.gather` with at most `limit` awaitables running at once."""
    slots = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[T]) -> T:
        async with slots:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros))
