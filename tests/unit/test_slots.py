"""Unit tests for proxy.runtime.upstream_slots.HostSlots: a global cap, a per-host cap, bounded waits."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from yarl import URL

from proxy.errors import UpstreamBusyError
from proxy.runtime.upstream_slots import HostSlots

A = URL("https://a.example/x")
A_OTHER_PORT = URL("https://a.example:8443/x")
B = URL("https://b.example/y")


async def test_one_host_cannot_take_every_slot() -> None:
    slots = HostSlots(total=3, per_host=2)
    async with contextlib.AsyncExitStack() as held:
        for _ in range(2):
            await held.enter_async_context(slots.hold(A, 1, "a"))
        with pytest.raises(UpstreamBusyError, match=r"gave up waiting 0\.05s"):
            async with slots.hold(A, 0.05, "a third from a"):
                pass
        async with slots.hold(B, 0.05, "b"):  # another host still gets the slot left
            pass
        async with slots.hold(A_OTHER_PORT, 0.05, "a on another port"):  # host means host:port
            pass


async def test_the_global_cap_stays() -> None:
    slots = HostSlots(total=2, per_host=8)
    async with slots.hold(A, 1, "a"), slots.hold(B, 1, "b"):
        with pytest.raises(UpstreamBusyError):
            async with slots.hold(URL("https://c.example/"), 0.05, "c"):
                pass


async def test_a_waiter_gets_the_slot_when_it_frees_and_hosts_are_forgotten() -> None:
    slots = HostSlots(total=1, per_host=1)
    release, holding = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    async def first_holder() -> None:
        async with slots.hold(A, 5, "a"):
            order.append("first in")
            holding.set()
            await release.wait()
            order.append("first out")

    async def waiter() -> None:
        async with slots.hold(A, 5, "a"):
            order.append("second in")

    first = asyncio.create_task(first_holder())
    await holding.wait()
    second = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the second runs until it waits for the slot (or takes it, were the cap broken)
    assert slots._hosts[f"{A.host}:{A.port}"][1] == 2  # it asked for the slot
    release.set()
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert order == ["first in", "first out", "second in"]  # never both in at once
    assert not slots._hosts  # no holder and no waiter: the host is forgotten


async def test_a_timed_out_waiter_leaves_no_slot_taken() -> None:
    slots = HostSlots(total=1, per_host=1)
    async with slots.hold(A, 1, "a"):
        with pytest.raises(UpstreamBusyError):
            async with slots.hold(B, 0.02, "b"):  # holds b's host slot while waiting for the global one
                pass
    async with slots.hold(B, 0.05, "b again"):
        pass
    assert not slots._hosts
