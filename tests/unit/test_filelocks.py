"""proxy.cache.filelocks.FileLocks: one holder per key among the processes sharing a data dir.

Two FileLocks objects open the lock file separately, so their flocks exclude each other exactly
as two processes' do; a crashed holder is a real child process killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import sys

from proxy.cache.filelocks import FileLocks

HOLD_FOREVER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


async def nothing() -> None:
    return None


async def test_the_second_holder_waits_and_gets_the_owners_result(tmp_path):
    first, second = FileLocks(tmp_path, poll=0.02), FileLocks(tmp_path, poll=0.02)
    result: list[str] = []
    order: list[str] = []

    async def recheck():
        return result[0] if result else None

    async def owner():
        async with first.hold("k", recheck) as existing:
            assert existing is None
            order.append("owner-start")
            await asyncio.sleep(0.3)
            result.append("done")
            order.append("owner-done")

    async def waiter():
        await asyncio.sleep(0.05)
        async with second.hold("k", recheck) as existing:
            order.append(f"waiter-got-{existing}")

    await asyncio.gather(owner(), waiter())
    assert order == ["owner-start", "owner-done", "waiter-got-done"]


async def test_a_waiter_takes_over_when_the_owner_failed(tmp_path):
    first, second = FileLocks(tmp_path, poll=0.02), FileLocks(tmp_path, poll=0.02)
    took_over = asyncio.Event()

    async def owner():
        async with first.hold("k", nothing):
            await asyncio.sleep(0.2)  # then fails: nothing stored

    async def waiter():
        await asyncio.sleep(0.05)
        async with second.hold("k", nothing) as existing:
            assert existing is None
            took_over.set()

    await asyncio.gather(owner(), waiter())
    assert took_over.is_set()


async def test_different_keys_do_not_wait_for_each_other(tmp_path):
    first, second = FileLocks(tmp_path), FileLocks(tmp_path)
    async with first.hold("a", nothing):
        async with asyncio.timeout(1):
            async with second.hold("b", nothing) as existing:
                assert existing is None


async def test_the_lock_file_is_removed_after_use(tmp_path):
    locks = FileLocks(tmp_path / "locks")
    async with locks.hold("k", nothing):
        assert locks.path("k").exists()
    assert list((tmp_path / "locks").iterdir()) == []


async def test_a_killed_holders_lock_is_free_at_once(tmp_path):
    locks = FileLocks(tmp_path, poll=0.02)
    path = locks.path("k")
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLD_FOREVER, str(path),
                                                  stdout=asyncio.subprocess.PIPE)
    try:
        assert await holder.stdout.readline() == b"locked\n"
        with_holder = asyncio.create_task(_enter(locks))
        await asyncio.sleep(0.3)
        assert not with_holder.done()  # waits while the other process holds the lock
        holder.kill()  # SIGKILL: the kernel drops its lock
        await holder.wait()
        assert await asyncio.wait_for(with_holder, 2) is None
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def _enter(locks: FileLocks) -> None:
    async with locks.hold("k", nothing) as existing:
        return existing
