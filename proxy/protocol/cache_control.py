"""The `Cache-Control` of a metadata answer, for a shared cache in front of the proxy (deploy/nginx.conf's
micro-cache): pure, from the answer's status, its remaining freshness and whether it depends on the client.

- A 200 (or 304) is fresh for what remains of the first-expiring document it was made from (less a second),
  then may be served stale while one request revalidates it, or when the proxy fails, for as long as the
  proxy itself would serve its stale copy (`stale-while-revalidate`, `stale-if-error`).
- A 404 is remembered as the proxy remembers it: at most `--ttl-negative`, no stale use.
- Any other error: `no-store` (the proxy does not cache it either).
- An answer a token or a grant opened, or that a policy made for this client, is `private`: a shared cache
  never keeps it. Every answer says `Vary: Authorization` (see `proxy.web.cache_headers`).
See docs/deployment.md#a-micro-cache-in-front.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

IMMUTABLE_MAX_AGE = 31536000  # a year: what only-immutable documents get (the archives' own max-age)
NOT_FOUND = frozenset({404, 410})
CACHEABLE = frozenset({200, 203, 304})
# Caches count whole seconds (nginx keeps an answer until the second its max-age ends, up to a second more):
# one second less, so no copy outlives the proxy's own.
CLOCK_GRAIN = 1


@dataclass(frozen=True)
class StaleWindows:
    """What the proxy does with stale copies, in seconds: how long it keeps serving them (while it refreshes,
    and when the upstream fails), and how long it remembers a 404."""

    stale: float
    negative_ttl: float


def cache_control(status: int, fresh_for: float | None, private: bool, windows: StaleWindows) -> str:
    """The `Cache-Control` value of a metadata answer; `fresh_for` None: it read no cached document."""
    scope = "private" if private else "public"
    if status in NOT_FOUND:
        limit = windows.negative_ttl if fresh_for is None else min(fresh_for, windows.negative_ttl)
        return f"{scope}, max-age={_seconds(limit - CLOCK_GRAIN)}"
    if status not in CACHEABLE:
        return "no-store"
    if fresh_for is None:
        return f"{scope}, no-cache"
    if fresh_for == math.inf:
        return f"{scope}, max-age={IMMUTABLE_MAX_AGE}"
    return _fresh(scope, _seconds(fresh_for - CLOCK_GRAIN), windows.stale)


@functools.lru_cache(maxsize=4096)
def _fresh(scope: str, max_age: int, stale_window: float) -> str:
    """The value of an answer fresh for `max_age` whole seconds (made once: a warm answer asks for it every time)."""
    stale = _seconds(stale_window)
    return f"{scope}, max-age={max_age}, stale-while-revalidate={stale}, stale-if-error={stale}"


def _seconds(value: float) -> int:
    """Whole seconds, rounded down (never more freshness than is left), never negative."""
    return max(0, math.floor(min(value, IMMUTABLE_MAX_AGE)))
