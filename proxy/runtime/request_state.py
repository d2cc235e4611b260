"""What a request notes while it is served, in one object and one context variable, set once per request
(`begin_request`): its id (on every log line: `proxy.runtime.log`), its time budget for upstream waits
(`proxy.runtime.deadline`), the worst cache outcome of the documents its answer is made from (the access log's
`cache`) and the least remaining freshness among them (`proxy.services.freshness`).

Tasks a request starts copy its context and so share the object: what they note counts for the request (a shared
fetch too, which is run without the budget: `proxy.runtime.deadline.detached_context`). Code outside a request
sees none, and its notes go nowhere. Pure: no I/O here.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

_RANK = {"hit": 0, "miss": 1, "stale": 2}


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


class RequestState:
    """One request's id and budget, and what it noted so far."""

    __slots__ = ("budget", "cache", "fresh_for", "request_id")

    def __init__(self, request_id: str | None, budget: Budget | None) -> None:
        self.request_id = request_id
        self.budget = budget
        self.cache: str | None = None  # the worst outcome noted: stale > miss > hit
        self.fresh_for: float | None = None  # the least freshness noted (seconds; None: no document read)

    def note_cache(self, outcome: str) -> None:
        if self.cache is None or _RANK[outcome] > _RANK[self.cache]:
            self.cache = outcome

    def note_fresh_for(self, seconds: float) -> None:
        if self.fresh_for is None or seconds < self.fresh_for:
            self.fresh_for = seconds


_state: ContextVar[RequestState | None] = ContextVar("request_state", default=None)


def begin_request(request_id: str | None, budget: Budget | None = None) -> RequestState:
    """The state of the request this context serves from now on (a keep-alive connection serves several in one)."""
    state = RequestState(request_id, budget)
    _state.set(state)
    return state


current = _state.get  # the state of the request this context serves (None outside a request); a C call per look
