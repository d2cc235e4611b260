"""What an upstream offers, checked before any per-version or per-platform upstream request.

Versions and platforms in request URLs are anyone's to invent; each would cost an upstream
request (a `download` document, a SHA256SUMS) if passed on. So they are checked against the
cached version list first. A cached list may miss a version published since it was fetched:
then the list is fetched again, but at most once per `interval` per list (the gate below),
however many made-up names arrive. Pure: no I/O here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TypeVar

from proxy.domain.addresses import Platform
from proxy.domain.lru import Lru

T = TypeVar("T")
MAX_TRACKED = 10_000


class RecheckGate:
    """Lets a list be rechecked at most once per `interval` per key (bounded memory, oldest forgotten)."""

    def __init__(
        self, interval: float, *, max_keys: int = MAX_TRACKED, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._last: Lru[Hashable, float] = Lru(max_keys)  # a use: a recheck allowed (not one refused)

    def allow(self, key: Hashable) -> bool:
        """True (and remembered) if `key` was not rechecked within the interval."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and 0 <= now - last < self.interval:
            return False
        self._last.put(key, now)
        return True


async def listed(
    load: Callable[[float | None], Awaitable[T]], lacks: Callable[[T], bool], gate: RecheckGate, key: Hashable
) -> T:
    """`load(None)` (the cached list); if `lacks` it and the gate allows, `load(max_age)` once more.

    `load(max_age)` must refresh the list if its cached copy is older than `max_age`.
    """
    found = await load(None)
    if lacks(found) and gate.allow(key):
        found = await load(gate.interval)
    return found


def list_ttl(ttl: float, max_age: float | None) -> float:
    """The freshness TTL for a list lookup: its own TTL, or `max_age` when a recheck asks for less."""
    return ttl if max_age is None else min(ttl, max_age)


def missing_platforms(offered: Iterable[Platform], requested: Iterable[Platform]) -> list[Platform]:
    """The requested platforms not offered, in request order."""
    available = set(offered)
    return [p for p in requested if p not in available]


def no_package_message(what: str, missing: list[Platform], offered: Iterable[Platform | str]) -> str:
    """`provider X 1.0.0 has no package for a_b, c_d (it offers: …)`: the proxy's 404, and `warm`'s failure
    for a platform the proxy lists no archive of (`offered` as the proxy's answer names them)."""
    return (
        f"{what} has no package for {', '.join(map(str, missing))} "
        f"(it offers: {', '.join(map(str, offered)) or 'none'})"
    )
