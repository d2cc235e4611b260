"""The Cache-Control of metadata answers (pure): never fresher than the proxy's own copy, private for what
depends on the client, errors kept only as the proxy keeps them."""

from __future__ import annotations

import math

import pytest

from proxy.protocol.cache_control import IMMUTABLE_MAX_AGE, StaleWindows, cache_control

WINDOWS = StaleWindows(stale=7200, negative_ttl=60)


@pytest.mark.parametrize(
    ("fresh_for", "expected"),
    [
        (600.0, "public, max-age=599, stale-while-revalidate=7200, stale-if-error=7200"),
        (1.9, "public, max-age=0, stale-while-revalidate=7200, stale-if-error=7200"),
        (-5.0, "public, max-age=0, stale-while-revalidate=7200, stale-if-error=7200"),  # served stale
        (math.inf, f"public, max-age={IMMUTABLE_MAX_AGE}"),
        (None, "public, no-cache"),
    ],
)
def test_an_answer_is_fresh_for_what_remains_of_its_documents_less_a_second(fresh_for, expected) -> None:
    assert cache_control(200, fresh_for, False, WINDOWS) == expected
    assert cache_control(304, fresh_for, False, WINDOWS) == expected


def test_what_a_client_opened_is_private() -> None:
    assert cache_control(200, 600.0, True, WINDOWS).startswith("private, max-age=599,")
    assert cache_control(404, 600.0, True, WINDOWS) == "private, max-age=59"


@pytest.mark.parametrize(("fresh_for", "max_age"), [(None, 59), (600.0, 59), (10.0, 9), (-1.0, 0)])
def test_a_404_is_kept_at_most_the_negative_ttl(fresh_for, max_age) -> None:
    assert cache_control(404, fresh_for, False, WINDOWS) == f"public, max-age={max_age}"
    assert cache_control(410, fresh_for, False, WINDOWS) == f"public, max-age={max_age}"


@pytest.mark.parametrize("status", [400, 401, 403, 429, 500, 502, 503, 504])
def test_other_errors_are_never_stored(status) -> None:
    assert cache_control(status, 600.0, False, WINDOWS) == "no-store"
