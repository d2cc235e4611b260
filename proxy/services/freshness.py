"""How long the answer a request is making stays fresh: the least remaining freshness of the cached documents
it was made from, noted as they are read (a context variable per request, like the access log's cache outcome).

`proxy.web.cache_headers` turns it into the answer's `Cache-Control` `max-age`, so a shared cache in front
of the proxy never keeps an answer longer than the proxy itself would.
"""

from __future__ import annotations

from contextvars import ContextVar

_fresh_for: ContextVar[list[float] | None] = ContextVar("fresh_for", default=None)


def begin_request() -> None:
    """Start noting for a new request (a keep-alive connection serves several in one context)."""
    _fresh_for.set([])


def note_fresh_for(seconds: float) -> None:
    """A document this answer is made from stays fresh `seconds` more (infinite: immutable; ≤ 0: stale)."""
    seen = _fresh_for.get()
    if seen is None:
        return
    if not seen:
        seen.append(seconds)
    elif seconds < seen[0]:
        seen[0] = seconds


def request_fresh_for() -> float | None:
    """The least remaining freshness noted by this request; None if it read no cached document."""
    seen = _fresh_for.get()
    return seen[0] if seen else None
