"""Unit tests for proxy.runtime.coalescing.SingleFlight."""

from __future__ import annotations

import asyncio

import pytest

from proxy.errors import ShuttingDownError
from proxy.runtime import deadline
from proxy.runtime.coalescing import SingleFlight
from proxy.runtime.request_state import begin_request


class Work:
    """A coroutine factory that counts executions and blocks until released."""

    def __init__(self, result: object = "value", error: BaseException | None = None) -> None:
        self.calls = 0
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = False
        self.result = result
        self.error = error

    async def __call__(self) -> object:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        self.finished = True
        if self.error is not None:
            raise self.error
        return self.result


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_concurrent_callers_share_one_execution() -> None:
    flight = SingleFlight()
    work = Work(result={"answer": 42})
    callers = [asyncio.create_task(flight.run("key", work)) for _ in range(10)]
    await work.started.wait()
    await _settle()
    assert flight.in_flight("key")
    work.release.set()
    results = await asyncio.gather(*callers)
    assert work.calls == 1
    assert all(result is results[0] for result in results)
    assert results[0] == {"answer": 42}


async def test_different_keys_run_separately() -> None:
    flight = SingleFlight()
    first, second = Work("one"), Work("two")
    tasks = [asyncio.create_task(flight.run("a", first)), asyncio.create_task(flight.run("b", second))]
    await first.started.wait()
    await second.started.wait()
    first.release.set()
    second.release.set()
    assert await asyncio.gather(*tasks) == ["one", "two"]
    assert (first.calls, second.calls) == (1, 1)


async def test_exception_propagates_to_all_callers() -> None:
    flight = SingleFlight()
    work = Work(error=ValueError("upstream broke"))
    callers = [asyncio.create_task(flight.run("key", work)) for _ in range(5)]
    await work.started.wait()
    work.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert work.calls == 1
    assert len(results) == 5
    for result in results:
        assert isinstance(result, ValueError)
        assert str(result) == "upstream broke"
    assert not flight.in_flight("key")


async def test_cancelled_waiter_does_not_cancel_shared_work() -> None:
    flight = SingleFlight()
    work = Work(result="shared")
    first = asyncio.create_task(flight.run("key", work))
    await work.started.wait()
    others = [asyncio.create_task(flight.run("key", work)) for _ in range(3)]
    await _settle()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert flight.in_flight("key")
    work.release.set()
    assert await asyncio.gather(*others) == ["shared"] * 3
    assert work.finished
    assert work.calls == 1


async def test_work_finishes_even_when_every_waiter_is_cancelled() -> None:
    flight = SingleFlight()
    work = Work(result="done")
    waiters = [asyncio.create_task(flight.run("key", work)) for _ in range(2)]
    await work.started.wait()
    for waiter in waiters:
        waiter.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert all(waiter.cancelled() for waiter in waiters)
    assert flight.in_flight("key")
    work.release.set()
    await flight.close()
    assert work.finished
    assert not flight.in_flight("key")


async def test_late_joiner_gets_result_after_first_caller_cancelled() -> None:
    flight = SingleFlight()
    work = Work(result="late")
    first = asyncio.create_task(flight.run("key", work))
    await work.started.wait()
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    late = asyncio.create_task(flight.run("key", work))
    await _settle()
    work.release.set()
    assert await late == "late"
    assert work.calls == 1


async def test_key_is_forgotten_after_completion() -> None:
    flight = SingleFlight()
    work = Work(result="first")
    work.release.set()
    assert await flight.run("key", work) == "first"
    assert not flight.in_flight("key")
    work.result = "second"
    assert await flight.run("key", work) == "second"
    assert work.calls == 2


async def test_key_is_forgotten_after_failure() -> None:
    flight = SingleFlight()
    work = Work(error=RuntimeError("boom"))
    work.release.set()
    with pytest.raises(RuntimeError):
        await flight.run("key", work)
    assert not flight.in_flight("key")
    work.error = None
    work.result = "recovered"
    assert await flight.run("key", work) == "recovered"
    assert work.calls == 2


async def test_close_waits_for_running_tasks() -> None:
    flight = SingleFlight()
    work = Work(result="slow")
    caller = asyncio.create_task(flight.run("key", work))
    await work.started.wait()
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    closing = asyncio.create_task(flight.close())
    await _settle()
    assert not closing.done()
    assert not work.finished
    work.release.set()
    await asyncio.wait_for(closing, timeout=5)
    assert work.finished


async def test_close_swallows_failures_and_is_noop_when_idle() -> None:
    flight = SingleFlight()
    await flight.close()
    work = Work(error=KeyError("x"))
    caller = asyncio.create_task(flight.run("key", work))
    await work.started.wait()
    work.release.set()
    await flight.close()
    with pytest.raises(KeyError):
        await caller


async def test_close_with_a_grace_cancels_what_outlives_it() -> None:
    flight = SingleFlight()
    work = Work(result="never")
    caller = asyncio.create_task(flight.run("key", work))
    await work.started.wait()
    assert await asyncio.wait_for(flight.close(grace=0.05, unwind=1), 5) == 1
    assert not work.finished and not flight.in_flight("key")
    with pytest.raises(ShuttingDownError):  # the waiter gets an answer, not a bare cancellation
        await caller


async def test_a_waiter_that_is_cancelled_itself_sees_a_cancellation() -> None:
    flight = SingleFlight()
    work = Work()
    caller = asyncio.create_task(flight.run("key", work))
    await work.started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert flight.in_flight("key")  # the shared work goes on
    assert flight.cancel_all() == 1


async def test_shared_work_runs_without_the_callers_request_budget() -> None:
    seen = []

    async def work() -> None:
        seen.append(deadline.remaining())

    begin_request("a request", deadline.budget(5, 1))
    assert deadline.remaining() is not None
    await SingleFlight().run("key", work)
    assert seen == [None]
