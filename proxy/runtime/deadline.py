"""Per-request time budgets for waiting on upstream fetches.

A request gets a budget when it arrives (`budget`, kept in its state: `proxy.runtime.request_state`): it may wait
at most `--request-deadline` for upstream answers it has no copy of, and at most `--stale-deadline` (from its
start) for a refresh when it holds a stale copy. Only *waiting* is bounded: the
shared fetches themselves run detached from any request (`detached_context`), bounded by the
upstream timeouts, so the next request finds their result. Code outside a request (CLI
commands, shared fetches) has no budget and waits as long as the upstream timeouts allow.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator

from proxy.errors import UpstreamTimeoutError
from proxy.runtime.request_state import Budget, current

__all__ = ["budget", "detached_context", "remaining", "stale_wait", "timed_out", "unbounded"]

# Set (to True) only where waits are bounded otherwise or shared by many requests: the request's budget is not theirs.
_unbudgeted: contextvars.ContextVar[bool] = contextvars.ContextVar("unbudgeted", default=False)


def budget(total: float, stale: float) -> Budget:
    """A budget starting now, of `total` seconds, `stale` of them for stale refreshes (given to the request's state:
    `proxy.runtime.request_state.begin_request`)."""
    return Budget(time.monotonic(), total, stale)


def _budget() -> Budget | None:
    state = current()
    return None if state is None or _unbudgeted.get() else state.budget


@contextlib.contextmanager
def unbounded() -> Iterator[None]:
    """No budget inside: for waits bounded otherwise (a download, by the minimum transfer rate)."""
    token = _unbudgeted.set(True)
    try:
        yield
    finally:
        _unbudgeted.reset(token)


def detached_context() -> contextvars.Context:
    """The current context without a request budget, for work shared by many requests."""
    context = contextvars.copy_context()
    context.run(_unbudgeted.set, True)
    return context


def remaining() -> float | None:
    """Seconds this request may still wait for an upstream (None: no budget)."""
    budget = _budget()
    return None if budget is None else budget.deadline - time.monotonic()


def stale_wait(default: float) -> float:
    """Seconds this request may wait for a refresh before it answers its stale copy."""
    budget = _budget()
    if budget is None:
        return default
    return max(0.0, budget.stale_deadline - time.monotonic())


def timed_out(what: str) -> UpstreamTimeoutError:
    """The error for a request that stopped waiting for `what` (an upstream URL)."""
    budget = _budget()
    limit = f" within the {budget.total:g}s request deadline" if budget is not None else ""
    return UpstreamTimeoutError(
        f"the upstream did not answer {what}{limit}; the fetch goes on in the background, so a retry may find it"
    )
