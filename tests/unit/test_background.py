"""Unit tests for proxy.runtime.background.BackgroundTasks."""

from __future__ import annotations

import asyncio
import gc

from proxy.runtime.background import BackgroundTasks


async def test_a_task_is_kept_until_it_ends_then_told_and_forgotten():
    tasks = BackgroundTasks("test.failed")
    release, told = asyncio.Event(), asyncio.Event()
    ended: list[asyncio.Task] = []

    async def work() -> str:
        await release.wait()
        return "done"

    def then(task: asyncio.Task) -> None:
        ended.append(task)
        told.set()

    tasks.start(work(), then=then)
    gc.collect()  # the loop's weak reference alone would let it go
    assert len(tasks) == 1 and not ended
    release.set()
    await asyncio.wait_for(told.wait(), 5)
    assert [t.result() for t in ended] == ["done"] and len(tasks) == 0


async def test_a_failure_is_retrieved():
    unretrieved: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: unretrieved.append(context))
    tasks = BackgroundTasks("test.failed")
    told = asyncio.Event()

    async def fail() -> None:
        raise RuntimeError("boom")

    tasks.start(fail(), then=lambda _: told.set())
    await asyncio.wait_for(told.wait(), 5)
    assert len(tasks) == 0
    gc.collect()
    assert unretrieved == []  # no "Task exception was never retrieved"
