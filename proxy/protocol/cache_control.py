"""The `Cache-Control` of a metadata answer, for a shared cache in front of the proxy (deploy/nginx.conf's
micro-cache): pure, from the answer's status, its remaining freshness and whether it depends on the client.

- A 200 (or 304) is fresh for what remains of the first-expiring document it was made from (less a second),
  but never more than `FRONT_MAX_AGE`, then may be served stale while one request revalidates it, or while no
  replica answers, for `FRONT_STALE` more (`stale-while-revalidate`, `stale-if-error`). A cache cannot know
  that the proxy's decisions changed (a policy, tokens or OIDC issuers read again, a purge): these bound how
  long it answers one made before (`FRONT_BOUND`), whatever the TTLs, also while the proxy is down (the proxy
  itself serves its stale copies when the upstream fails; a front does not stand in for the proxy's decisions).
- A 404 is remembered as the proxy remembers it: at most `--ttl-negative` (and `FRONT_MAX_AGE`), no stale use.
- Any other error: `no-store` (the proxy does not cache it either).
- An answer a token or a grant opened, or that a policy made for this client, is `private`: a shared cache
  never keeps it. Every answer says `Vary: Authorization` (see `proxy.web.cache_headers`).
See docs/deployment.md#a-micro-cache-in-front.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

IMMUTABLE_MAX_AGE = 31536000  # a year: the longest freshness counted (the archives' own max-age)
NOT_FOUND = frozenset({404, 410})
CACHEABLE = frozenset({200, 203, 304})
# Caches count whole seconds (nginx keeps an answer until the second its max-age ends, up to a second more):
# one second less, so no copy outlives the proxy's own.
CLOCK_GRAIN = 1
# A shared cache's bound on an answer the proxy made: fresh at most FRONT_MAX_AGE seconds, then answered while one
# request revalidates it, or while no replica answers, at most FRONT_STALE more, and a second of clock grain: no
# answer decided before a change of the proxy's decisions (a restart, a SIGHUP, a purge) is given from the cache
# later than FRONT_BOUND after it.
FRONT_MAX_AGE = 3
FRONT_STALE = 1
FRONT_BOUND = FRONT_MAX_AGE + FRONT_STALE + CLOCK_GRAIN


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
        return f"{scope}, max-age={_max_age(limit)}"
    if status not in CACHEABLE:
        return "no-store"
    if fresh_for is None:
        return f"{scope}, no-cache"
    return _fresh(scope, _max_age(fresh_for), windows.stale)


def _max_age(fresh_for: float) -> int:
    """The max-age of an answer whose documents stay fresh `fresh_for` more seconds (math.inf: immutable ones)."""
    return min(_seconds(fresh_for - CLOCK_GRAIN), FRONT_MAX_AGE)


@functools.lru_cache(maxsize=4096)
def _fresh(scope: str, max_age: int, stale_window: float) -> str:
    """The value of an answer fresh for `max_age` whole seconds (made once: a warm answer asks for it every time)."""
    stale = min(_seconds(stale_window), FRONT_STALE)
    return f"{scope}, max-age={max_age}, stale-while-revalidate={stale}, stale-if-error={stale}"


def _seconds(value: float) -> int:
    """Whole seconds, rounded down (never more freshness than is left), never negative."""
    return max(0, math.floor(min(value, IMMUTABLE_MAX_AGE)))
