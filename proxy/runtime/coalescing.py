"""Per-key coalescing of cold fetches, in one process and across a fleet.

The first caller for a key starts the work in its own task (tracked, so shutdown can
wait for it or cancel it); every caller, the first included, awaits it through
`asyncio.shield`, so a client that disconnects (or stops waiting at its deadline) cancels
only its own wait, never the shared fetch. The task runs without the first caller's
request budget (`proxy.runtime.deadline`): shared work is bounded by the upstream timeouts.

Across processes, a `FleetLocks` implementation (e.g. `proxy.metadata_store.redis.RedisFleetLocks`)
makes one replica do the work while the others wait and re-check the shared result.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from proxy.errors import ShuttingDownError
from proxy.runtime.deadline import detached_context

T = TypeVar("T")


class FleetLocks(Protocol):
    """The lock protocol the mirror accepts for fleet-wide single flight."""

    def hold(self, key: str, recheck: Callable[[], Awaitable[Any]]) -> contextlib.AbstractAsyncContextManager[Any]:
        """Yield what `recheck` found (someone else did the work), or None: the caller must do it."""
        ...


async def no_recheck() -> None:
    """The `recheck` of a fleet lock held to change a record in place: nobody else's work replaces the caller's."""
    return None


class LocalLocks:
    """A single process needs no fleet lock: in-process single flight already coalesces."""

    @contextlib.asynccontextmanager
    async def hold(self, key: str, recheck: Callable[[], Awaitable[Any]]) -> AsyncIterator[Any]:
        yield None


class SingleFlight:
    """Runs at most one task per key at a time and shares its result."""

    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[Any]] = {}

    def in_flight(self, key: str) -> bool:
        return key in self._tasks

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                _call(work), name=f"singleflight:{key}", context=detached_context()
            )
            self._tasks[key] = task
            task.add_done_callback(lambda done, key=key: self._forget(key, done))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                raise ShuttingDownError("the proxy is shutting down and stopped this fetch; retry") from None
            raise

    def _forget(self, key: str, task: asyncio.Task[Any]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # mark retrieved: waiters may all have gone away

    def cancel_all(self) -> int:
        """Cancel every running task (their waiters get a ShuttingDownError); returns how many."""
        running = [task for task in self._tasks.values() if not task.done()]
        for task in running:
            task.cancel()
        return len(running)

    async def close(self, grace: float | None = None, unwind: float = 5.0) -> int:
        """At shutdown: wait for running work at most `grace` seconds (None: as long as it takes), then
        cancel what is left and give it `unwind` seconds to clean up. Returns how many were cancelled."""
        tasks = list(self._tasks.values())
        if not tasks:
            return 0
        _, running = await asyncio.wait(tasks, timeout=grace)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running, timeout=unwind)
        return len(running)


async def _call(work: Callable[[], Awaitable[T]]) -> T:
    return await work()
