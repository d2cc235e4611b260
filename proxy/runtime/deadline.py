"""Per-request time budgets for waiting on upstream fetches.

A request gets a budget when it arrives (`request_budget`): it may wait at most
`--request-deadline` for upstream answers it has no copy of, and at most `--stale-deadline`
(from its start) for a refresh when it holds a stale copy. Only *waiting* is bounded: the
shared fetches themselves run detached from any request (`detached_context`), bounded by the
upstream timeouts, so the next request finds their result. Code outside a request (CLI
commands, shared fetches) has no budget and waits as long as the upstream timeouts allow.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.errors import UpstreamTimeoutError


@dataclass(frozen=True)
class Budget:
    """Monotonic instants: when the request started, when it must stop waiting, and for a stale refresh."""

    started: float
    total: float
    stale: float

    @property
    def deadline(self) -> float:
        return self.started + self.total

    @property
    def stale_deadline(self) -> float:
        return self.started + min(self.stale, self.total)


_budget: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("request_budget", default=None)


class request_budget:
    """Give the code inside (one request) a budget of `total` seconds, `stale` of them for stale refreshes (a plain
    context manager: it runs on every request)."""

    __slots__ = ("_budget", "_token")

    def __init__(self, total: float, stale: float) -> None:
        self._budget = Budget(time.monotonic(), total, stale)

    def __enter__(self) -> Budget:
        self._token = _budget.set(self._budget)
        return self._budget

    def __exit__(self, *exc: object) -> None:
        _budget.reset(self._token)


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    """No budget inside: for waits bounded otherwise (a download, by the minimum transfer rate)."""
    token = _budget.set(None)
    try:
        yield
    finally:
        _budget.reset(token)


def detached_context() -> contextvars.Context:
    """The current context without a request budget, for work shared by many requests."""
    context = contextvars.copy_context()
    context.run(_budget.set, None)
    return context


def remaining() -> float | None:
    """Seconds this request may still wait for an upstream (None: no budget)."""
    budget = _budget.get()
    return None if budget is None else budget.deadline - time.monotonic()


def stale_wait(default: float) -> float:
    """Seconds this request may wait for a refresh before it answers its stale copy."""
    budget = _budget.get()
    if budget is None:
        return default
    return max(0.0, budget.stale_deadline - time.monotonic())


def timed_out(what: str) -> UpstreamTimeoutError:
    """The error for a request that stopped waiting for `what` (an upstream URL)."""
    budget = _budget.get()
    limit = f" within the {budget.total:g}s request deadline" if budget is not None else ""
    return UpstreamTimeoutError(
        f"the upstream did not answer {what}{limit}; the fetch goes on in the background, so a retry may find it"
    )
