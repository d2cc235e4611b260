"""One contract for fleet-wide single flight: Redis locks (replicas; on one server, Sentinel and Cluster)
and lock files (workers on one data dir).

Two lock objects stand for two processes: Redis locks carry an owner token each, and two
FileLocks open the lock file separately, so their flocks exclude each other like two processes'.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from proxy.metadata_store.file_locks import FileLocks
from proxy.metadata_store.redis import RedisFleetLocks
from tests.fakes.redis_server import REDIS_SETUPS


@pytest.fixture(params=[*REDIS_SETUPS, "file"])
async def two_processes(request, tmp_path, open_redis):
    """Two lock objects on the same keys, as two processes would hold them."""
    if request.param == "file":
        yield FileLocks(tmp_path, poll=0.02), FileLocks(tmp_path, poll=0.02)
        return
    prefix = f"locks-{uuid.uuid4().hex[:10]}"
    first, second = open_redis(request.param, prefix=prefix), open_redis(request.param, prefix=prefix)
    yield RedisFleetLocks(first, ttl=5, poll=0.05), RedisFleetLocks(second, ttl=5, poll=0.05)
    await first.close()
    await second.close()


async def nothing() -> None:
    return None


class StoredResult:
    """A recheck that finds what the owner stored (nothing until it stores something)."""

    def __init__(self) -> None:
        self.stored: list[str] = []

    async def __call__(self) -> str | None:
        return self.stored[0] if self.stored else None


async def owner_then_waiter(locks, recheck: StoredResult, result: str | None) -> list[str]:
    """The first process holds "k"; the second asks for "k" meanwhile: what each saw, in order.

    Ordered by events, not sleeps: the waiter asks only once the owner holds the lock, and the
    owner finishes (storing `result`, or nothing) only after the waiter has found the lock taken
    and looked for a result, so a waiter that did not wait cannot pass."""
    first, second = locks
    order: list[str] = []
    owner_holds, waiter_looked = asyncio.Event(), asyncio.Event()

    async def waiter_recheck():
        waiter_looked.set()
        return await recheck()

    async def owner():
        async with first.hold("k", recheck) as existing:
            assert existing is None
            owner_holds.set()
            await asyncio.wait_for(waiter_looked.wait(), 10)
            if result is not None:
                recheck.stored.append(result)
            order.append("owner-done")

    async def waiter():
        await asyncio.wait_for(owner_holds.wait(), 10)
        async with second.hold("k", waiter_recheck) as existing:
            order.append(f"waiter-got-{existing}")

    await asyncio.gather(owner(), waiter())
    return order


async def test_the_second_holder_waits_and_gets_the_owners_result(two_processes):
    order = await owner_then_waiter(two_processes, StoredResult(), "done")
    assert order == ["owner-done", "waiter-got-done"]


async def test_a_waiter_takes_over_when_the_owner_stored_nothing(two_processes):
    order = await owner_then_waiter(two_processes, StoredResult(), None)
    assert order == ["owner-done", "waiter-got-None"]


async def test_different_keys_do_not_wait_for_each_other(two_processes):
    first, second = two_processes
    async with first.hold("a", nothing), asyncio.timeout(1), second.hold("b", nothing) as existing:
        assert existing is None
