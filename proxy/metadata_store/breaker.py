"""The circuit breaker both metadata stores use: after a failure, no call for `retry_interval` seconds.

A store answers like a miss while the breaker is open, so requests are served from memory, disk
and the upstream at full speed; the next call after the interval tries again. The breaker only
keeps state; the store logs the changes it reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Breaker:
    """Up/down state of a backing store, with the reason while down."""

    def __init__(self, retry_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._retry_interval = retry_interval
        self._clock = clock
        self._up = True
        self._retry_at = 0.0
        self._problem: str | None = None

    @property
    def up(self) -> bool:
        return self._up

    @property
    def available(self) -> bool:
        """False while open: the store failed less than `retry_interval` seconds ago."""
        return self._up or self._clock() >= self._retry_at

    @property
    def problem(self) -> str | None:
        """Why the store is down (None while it works)."""
        return None if self._up else self._problem

    def trip(self, problem: str) -> bool:
        """Record a failure; True when this took the store down (log it then)."""
        self._retry_at = self._clock() + self._retry_interval
        self._problem = problem
        was_up, self._up = self._up, False
        return was_up

    def reset(self) -> bool:
        """Record a success; True when this brought the store back up (log it then)."""
        was_down, self._up = not self._up, True
        self._problem = None
        return was_down
