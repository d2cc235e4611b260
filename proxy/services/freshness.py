"""How long the answer a request is making stays fresh: the least remaining freshness of the cached documents
it was made from, noted as they are read (in the request's state, `proxy.runtime.request_state`).

`proxy.web.cache_headers` turns it into the answer's `Cache-Control` `max-age`, so a shared cache in front
of the proxy never keeps an answer longer than the proxy itself would.
"""

from __future__ import annotations

from proxy.runtime.request_state import current


def note_fresh_for(seconds: float) -> None:
    """A document this answer is made from stays fresh `seconds` more (infinite: immutable; ≤ 0: stale)."""
    state = current()
    if state is not None:
        state.note_fresh_for(seconds)


def request_fresh_for() -> float | None:
    """The least remaining freshness noted by this request; None if it read no cached document."""
    state = current()
    return None if state is None else state.fresh_for
