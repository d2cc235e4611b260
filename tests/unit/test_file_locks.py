"""proxy.metadata_store.file_locks.FileLocks beyond the fleet lock contract (tests/contract): lock files are
removed after use, and a crashed holder (a real process killed with SIGKILL) frees its lock at once.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from proxy.metadata_store.file_locks import FileLocks

HOLD_FOREVER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


async def nothing() -> None:
    return None


async def test_the_lock_file_is_removed_after_use(tmp_path):
    locks = FileLocks(tmp_path / "locks")
    async with locks.hold("k", nothing):
        assert locks.path("k").exists()
    assert list((tmp_path / "locks").iterdir()) == []


@pytest.mark.process
async def test_a_killed_holders_lock_is_free_at_once(tmp_path):
    locks = FileLocks(tmp_path, poll=0.02)
    path = locks.path("k")
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD_FOREVER, str(path), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert await holder.stdout.readline() == b"locked\n"
        blocked = asyncio.Event()
        with_holder = asyncio.create_task(_enter(locks, _RecheckCounter(blocked)))
        await asyncio.wait(
            [with_holder, asyncio.create_task(blocked.wait())], timeout=10, return_when="FIRST_COMPLETED"
        )
        assert blocked.is_set() and not with_holder.done()  # polls while the other process holds the lock
        holder.kill()  # SIGKILL: the kernel drops its lock
        await holder.wait()
        assert await asyncio.wait_for(with_holder, 2) is None
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


class _RecheckCounter:
    """A re-check that finds nothing; sets `blocked` at its second call, which `hold` makes only after a try
    that did not get the lock (a try that gets it leaves after one re-check)."""

    def __init__(self, blocked: asyncio.Event) -> None:
        self.calls = 0
        self._blocked = blocked

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls == 2:
            self._blocked.set()


async def _enter(locks: FileLocks, recheck: _RecheckCounter) -> None:
    async with locks.hold("k", recheck) as existing:
        return existing
