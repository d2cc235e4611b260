"""Redis under Sentinel fails over beneath the metadata store: the store follows the new master at once, and a
fleet lock held across the failover keeps every other replica waiting.

Real failovers (`SENTINEL FAILOVER`) of the session's Sentinel setup. The old master is left taking writes
for minutes (`old_master_lingers`), as one the sentinels cannot reach would be: a client that still writes
there after the switch loses those writes, and a lock it renews there is not renewed where everyone else
looks. Each store opens several connections first, as a busy replica's pool holds.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from proxy.metadata_store.keys import FLEET_LOCK
from proxy.metadata_store.redis import RedisFleetLocks, RedisStore
from tests.fakes.process import wait_for

CONNECTIONS = 8


def open_store(setup, prefix: str, **options) -> RedisStore:
    listening = switch_listeners(setup)
    store = setup.open_store(prefix=prefix, **options)
    store.follow_failovers()
    store.watch = (setup, listening)  # `busy` waits until its watcher listens on the sentinel too
    return store


def switch_listeners(setup) -> int:
    """How many clients listen to the sentinel (the stores' failover watchers, on `+switch-master`)."""
    with setup.sentinel_client() as client:  # a sentinel has no PUBSUB: its clients with a subscription
        return sum(1 for entry in client.client_list() if int(entry.get("sub", 0)) > 0)


async def busy(store: RedisStore) -> None:
    """Writes at once: the store's pool then holds several connections to the master; and its watcher listens on
    the sentinel (on a loaded machine it subscribes a moment after the store opens: a failover before that is
    one the store only learns of later, by itself, which is not what these tests check)."""
    await asyncio.gather(*(store.set(f"warm:{n}", b"v") for n in range(CONNECTIONS)))
    assert store.available
    setup, listening = store.watch
    await wait_for(lambda: switch_listeners(setup) > listening, 10, "the store's watcher to subscribe")


def holds(server, name: str) -> bool:
    with server.client() as client:
        return bool(client.exists(name))


async def lands_on(server, store: RedisStore, key: str) -> bool:
    await store.set(key, b"v")
    return holds(server, store.key(key))


async def test_the_store_follows_the_new_master_at_once(redis_sentinel):
    await asyncio.to_thread(redis_sentinel.settle)
    store = open_store(redis_sentinel, f"follow-{uuid.uuid4().hex[:10]}")
    await busy(store)
    old = redis_sentinel.master()
    new = await asyncio.to_thread(redis_sentinel.failover, old_master_lingers=True)
    deadline, probe = time.monotonic() + 10, 0
    while not await lands_on(new, store, f"probe:{probe}"):  # a write goes to the new master
        assert time.monotonic() < deadline, "the store kept writing to the old master"
        probe += 1
        await asyncio.sleep(0.05)
    # From then on nothing goes to the old master, whichever pooled connection a command takes.
    await asyncio.gather(*(store.set(f"after:{n}", b"v") for n in range(CONNECTIONS)))
    with new.client() as on_new, old.client() as on_old:
        assert [on_new.exists(store.key(f"after:{n}")) for n in range(CONNECTIONS)] == [1] * CONNECTIONS
        assert [on_old.exists(store.key(f"after:{n}")) for n in range(CONNECTIONS)] == [0] * CONNECTIONS
        assert on_old.info("replication")["role"] == "master"  # still taking writes: the test proves something
    assert store.available and store.problem is None
    await store.close()


async def test_a_fleet_lock_held_across_a_failover_keeps_others_waiting(redis_sentinel):
    """The holder's renewals reach the new master, so a replica asking there (one that connects after the
    failover) finds the lock held for as long as the holder works, and then the holder's result."""
    await asyncio.to_thread(redis_sentinel.settle)
    # a lease of 7 s: the lock the new master has when promoted lives what is left of one lease (at least three
    # quarters of it), and the holder's renewals reach it once the sentinels announce the switch; on a loaded
    # machine the promotion and the announcement took more than 2 s, and once more than 3.75 s (a lease of 5 s)
    prefix, lease, poll = f"lease-{uuid.uuid4().hex[:10]}", 7.0, 0.05
    holder_store = open_store(redis_sentinel, prefix)
    await busy(holder_store)
    holder = RedisFleetLocks(holder_store, ttl=lease, poll=poll)
    stored: list[str] = []
    order: list[str] = []
    holding, failed_over = asyncio.Event(), asyncio.Event()
    refused: list[float] = []  # when the waiter found the lock taken

    async def result() -> str | None:
        return stored[0] if stored else None

    async def waiter_result() -> str | None:
        found = await result()
        if found is None:
            refused.append(time.monotonic())
        return found

    async def hold() -> None:
        async with holder.hold("k", result) as existing:
            assert existing is None
            holding.set()
            await failed_over.wait()
            # Work on while the waiter asks for more than a lease (its first refusal came after the promotion):
            # past what the lock had left on the new master then, had the renewals gone on to the old master.
            await wait_for(
                lambda: order or (refused and refused[-1] - refused[0] > 1.2 * lease), 30, "the waiter asking"
            )
            stored.append("the holder's result")
            order.append("holder-done")

    async def wait(store: RedisStore) -> None:
        async with RedisFleetLocks(store, ttl=lease, poll=poll).hold("k", waiter_result) as existing:
            order.append(f"waiter-got-{existing}")

    holding_task = asyncio.create_task(hold())
    await asyncio.wait_for(holding.wait(), 10)
    replica = redis_sentinel.replica()
    await wait_for(lambda: holds(replica, holder_store.key(FLEET_LOCK.key("k"))), 10, "the lock to reach the replica")
    new = await asyncio.to_thread(redis_sentinel.failover, old_master_lingers=True)
    assert new.port == replica.port
    waiter_store = open_store(redis_sentinel, prefix)
    failed_over.set()
    await asyncio.wait_for(asyncio.gather(holding_task, wait(waiter_store)), 60)
    assert order == ["holder-done", "waiter-got-the holder's result"]
    for store in (holder_store, waiter_store):
        await store.close()


@pytest.mark.process
async def test_when_the_master_dies_the_store_misses_until_the_new_master_answers(redis_sentinel):
    """No error reaches a caller: while no master answers, reads miss and writes are dropped (the proxy serves
    from disk and upstream); once the sentinel promotes the replica, what was written before is there again."""
    await asyncio.to_thread(redis_sentinel.settle)
    store = open_store(redis_sentinel, f"death-{uuid.uuid4().hex[:10]}", retry_interval=0.1)
    await busy(store)
    await store.set("before", b"v1")
    old, replica = redis_sentinel.master(), redis_sentinel.replica()
    await wait_for(lambda: holds(replica, store.key("before")), 10, "the value to reach the replica")
    old.kill()
    try:
        assert await store.get("before") is None  # the master is gone, none promoted yet: a miss
        assert not store.available and "Redis" in (store.problem or "")
        deadline = time.monotonic() + 30
        while await store.get("before") != b"v1":
            assert time.monotonic() < deadline, f"the store never reached the new master: {store.problem}"
            await asyncio.sleep(0.05)
        assert redis_sentinel.master_port() == replica.port
        assert await lands_on(replica, store, "after")
    finally:  # also when the test fails: the session's setup stays whole for the tests after it
        await store.close()
        await asyncio.to_thread(old.start)  # back, empty: the sentinel makes it the new master's replica
    await asyncio.to_thread(redis_sentinel.settle)
