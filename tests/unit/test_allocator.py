"""proxy.web.allocator: when memory is trimmed after a burst of connections, and the operator's malloc
settings win over ours."""

from __future__ import annotations

import os

import pytest

from proxy.web import allocator
from proxy.web.allocator import BurstTrimmer, operator_tuned
from tests.fakes.process import wait_for


class Releases:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> bool:
        self.count += 1
        return True


async def test_a_burst_that_closed_is_trimmed_once():
    releases = Releases()
    trimmer = BurstTrimmer(drop=100, delay=0.01, release=releases, enabled=True)
    for open_now in range(1, 301):
        trimmer.opened(open_now)
    for open_now in range(299, -1, -1):  # the whole burst closes: one trim for all of it
        trimmer.closed(open_now)
    await wait_for(lambda: trimmer.trims == 1, 5, "the trim")
    assert releases.count == 1
    assert trimmer.peak == 0  # the next burst is measured from what was open then


async def test_connections_coming_and_going_below_the_drop_are_not_trimmed():
    releases = Releases()
    trimmer = BurstTrimmer(drop=100, delay=0.01, release=releases, enabled=True)
    for _ in range(50):  # churn: 150 open, 60 close, 60 open again, ...
        for open_now in range(91, 151):
            trimmer.opened(open_now)
        for open_now in range(149, 89, -1):
            trimmer.closed(open_now)
    assert not trimmer.pending and releases.count == 0
    trimmer.closed(49)  # and once a hundred fewer are open than at the peak, it is trimmed
    await wait_for(lambda: trimmer.trims == 1, 5, "the trim")
    assert releases.count == 1
    trimmer.close()


async def test_close_cancels_a_pending_trim():
    trimmer = BurstTrimmer(drop=1, delay=60, release=Releases(), enabled=True)
    trimmer.opened(5)
    trimmer.closed(0)
    assert trimmer.pending
    trimmer.close()
    assert not trimmer.pending


async def test_without_glibc_nothing_is_scheduled():
    trimmer = BurstTrimmer(drop=1, delay=0, release=Releases(), enabled=False)
    trimmer.opened(500)
    trimmer.closed(0)
    assert not trimmer.pending


@pytest.mark.parametrize(
    ("environ", "tuned"),
    [
        ({}, False),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, False),
    ],
)
def test_the_operators_malloc_settings_are_left_alone(environ, tuned):
    assert operator_tuned(environ) is tuned


@pytest.mark.skipif(not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc only (on another C library it is a no-op)")
def test_on_glibc_the_threshold_is_pinned_and_memory_trimmed(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    assert allocator.pin_mmap_threshold() is True
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert allocator.pin_mmap_threshold() is False
    allocator.trim()  # callable; whether it freed anything depends on the heap
