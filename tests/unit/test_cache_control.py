"""The Cache-Control of metadata answers (pure): never fresher than the proxy's own copy nor than the front's
bound, private for what depends on the client, errors kept only as the proxy keeps them."""

from __future__ import annotations

import math

import pytest

from proxy.protocol.cache_control import FRONT_BOUND, StaleWindows, cache_control

WINDOWS = StaleWindows(stale=7200, negative_ttl=60)


@pytest.mark.parametrize(
    ("fresh_for", "expected"),
    [
        (3.5, "public, max-age=2, stale-while-revalidate=1, stale-if-error=1"),
        (1.9, "public, max-age=0, stale-while-revalidate=1, stale-if-error=1"),
        (-5.0, "public, max-age=0, stale-while-revalidate=1, stale-if-error=1"),  # served stale
        (None, "public, no-cache"),
    ],
)
def test_an_answer_is_fresh_for_what_remains_of_its_documents_less_a_second(fresh_for, expected) -> None:
    assert cache_control(200, fresh_for, False, WINDOWS) == expected
    assert cache_control(304, fresh_for, False, WINDOWS) == expected


@pytest.mark.parametrize("fresh_for", [600.0, math.inf])  # a version list's 10 minutes, an immutable document
def test_a_shared_cache_keeps_an_answer_no_longer_than_the_fronts_bound(fresh_for) -> None:
    """Fresh 3 s, answered while revalidated or while no replica answers 1 s more, and a second of clock grain: a cache
    does not know the proxy's decisions changed (a policy, tokens, a purge), so whatever the TTLs and the proxy's own
    stale window (7200 s here) it answers one made before 5 s at most."""
    expected = "public, max-age=3, stale-while-revalidate=1, stale-if-error=1"
    assert cache_control(200, fresh_for, False, WINDOWS) == expected
    assert FRONT_BOUND == 5
    assert cache_control(200, fresh_for, False, StaleWindows(stale=0, negative_ttl=60)) == (
        "public, max-age=3, stale-while-revalidate=0, stale-if-error=0"
    )


def test_what_a_client_opened_is_private() -> None:
    assert cache_control(200, 600.0, True, WINDOWS).startswith("private, max-age=3,")
    assert cache_control(404, 600.0, True, WINDOWS) == "private, max-age=3"


@pytest.mark.parametrize(
    ("fresh_for", "negative_ttl", "max_age"), [(None, 60, 3), (600.0, 60, 3), (2.5, 60, 1), (None, 2, 1), (-1.0, 60, 0)]
)
def test_a_404_is_kept_at_most_the_negative_ttl_and_the_fronts_bound(fresh_for, negative_ttl, max_age) -> None:
    windows = StaleWindows(stale=7200, negative_ttl=negative_ttl)
    assert cache_control(404, fresh_for, False, windows) == f"public, max-age={max_age}"
    assert cache_control(410, fresh_for, False, windows) == f"public, max-age={max_age}"


@pytest.mark.parametrize("status", [400, 401, 403, 429, 500, 502, 503, 504])
def test_other_errors_are_never_stored(status) -> None:
    assert cache_control(status, 600.0, False, WINDOWS) == "no-store"
