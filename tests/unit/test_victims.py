"""The choice of victims: least recently served first, nothing in use, nothing referenced (gc). No I/O."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from proxy.storage.victims import excess_bytes, in_use, last_use, orphans, victims

NOW = 1_000_000.0
GRACE = 600.0
DAY = 86400.0


@dataclass(frozen=True)
class Obj:
    sha256: str
    size: int
    modified: float


def sha(letter: str) -> str:
    return letter * 64


def objs(*specs: tuple[str, int, float]) -> list[Obj]:
    return [Obj(sha(letter), size, modified) for letter, size, modified in specs]


def names(chosen: list[Obj]) -> list[str]:
    return [obj.sha256[0] for obj in chosen]


def test_least_recently_served_go_first_until_the_excess_is_freed():
    store = objs(
        ("a", 100, NOW - 9 * DAY), ("b", 100, NOW - 9 * DAY), ("c", 100, NOW - 9 * DAY), ("d", 100, NOW - 9 * DAY)
    )
    served = {sha("a"): NOW - 1 * DAY, sha("b"): NOW - 5 * DAY, sha("c"): NOW - 3 * DAY, sha("d"): NOW - 2 * DAY}
    assert names(victims(store, served, excess=150, now=NOW, grace=GRACE)) == ["b", "c"]
    assert names(victims(store, served, excess=100, now=NOW, grace=GRACE)) == ["b"]
    assert names(victims(store, served, excess=1, now=NOW, grace=GRACE)) == ["b"]
    assert names(victims(store, served, excess=400, now=NOW, grace=GRACE)) == ["b", "c", "d", "a"]


def test_nothing_to_free_chooses_nothing():
    store = objs(("a", 100, NOW - DAY))
    assert victims(store, {}, excess=0, now=NOW, grace=GRACE) == []
    assert victims(store, {}, excess=-5, now=NOW, grace=GRACE) == []


def test_never_served_counts_from_when_it_was_stored():
    """An archive never served counts as used when it was stored: yesterday's goes after one served two days ago."""
    store = objs(("a", 10, NOW - 1 * DAY), ("b", 10, NOW - 9 * DAY), ("c", 10, NOW - 9 * DAY))
    served = {sha("b"): NOW - 2 * DAY}  # c: stored 9 days ago, never served: the oldest use
    assert names(victims(store, served, excess=30, now=NOW, grace=GRACE)) == ["c", "b", "a"]


def test_a_served_time_before_the_file_was_stored_again_does_not_count():
    """An archive evicted and fetched again today is as fresh as its new file."""
    store = objs(("a", 10, NOW - 3600), ("b", 10, NOW - 2 * DAY))
    served = {sha("a"): NOW - 5 * DAY}
    assert last_use(store[0], served, NOW, GRACE) == NOW - 3600
    assert names(victims(store, served, excess=10, now=NOW, grace=GRACE)) == ["b"]


def test_pinned_and_recently_used_archives_are_never_chosen_even_if_that_leaves_the_store_over_the_cap():
    store = objs(("a", 100, NOW - 9 * DAY), ("b", 100, NOW - 9 * DAY), ("c", 100, NOW - 60), ("d", 100, NOW - 9 * DAY))
    served = {sha("b"): NOW - GRACE + 1, sha("d"): NOW - GRACE}  # b within the grace, d just outside it
    chosen = victims(store, served, excess=400, now=NOW, grace=GRACE, pinned={sha("a")})
    assert names(chosen) == ["d"]  # a: pinned (streaming now); b: served within the grace; c: stored a minute ago


def test_equal_times_break_ties_by_digest():
    store = objs(("c", 1, NOW - DAY), ("a", 1, NOW - DAY), ("b", 1, NOW - DAY))
    assert names(victims(store, {}, excess=2, now=NOW, grace=GRACE)) == ["a", "b"]


def test_a_served_time_in_the_future_beyond_the_grace_is_ignored():
    """A forged or skewed entry far in the future must not shield an archive forever."""
    store = objs(("a", 10, NOW - 9 * DAY), ("b", 10, NOW - 2 * DAY))
    served = {sha("a"): NOW + 365 * DAY, sha("b"): NOW + GRACE / 2}
    assert not in_use(store[0], served, (), NOW, GRACE)
    assert in_use(store[1], served, (), NOW, GRACE)  # a little skew: counts as just served
    assert names(victims(store, served, excess=100, now=NOW, grace=GRACE)) == ["a"]


@pytest.mark.parametrize(
    ("total", "cap", "free", "min_free", "expected"),
    [
        (1000, 800, None, 0, 200),  # over the cap
        (700, 800, None, 0, 0),  # under it
        (700, 800, 50, 300, 250),  # under the cap, but the disk is below its free-space floor
        (1000, 800, 50, 100, 200),  # both: the larger need
        (1000, None, 50, 300, 250),  # no cap: the floor alone
        (1000, None, None, 0, 0),
    ],
)
def test_excess_bytes(total, cap, free, min_free, expected):
    assert excess_bytes(total, cap, free, min_free) == expected


def test_orphans_are_unreferenced_and_not_in_use():
    store = objs(
        ("a", 1, NOW - 9 * DAY),
        ("b", 1, NOW - 9 * DAY),
        ("c", 1, NOW - 9 * DAY),
        ("d", 1, NOW - 10),
        ("e", 1, NOW - 9 * DAY),
    )
    referenced = {sha("a")}
    served = {sha("c"): NOW - 60}
    chosen = orphans(store, referenced, served, now=NOW, grace=GRACE, pinned={sha("e")})
    assert names(chosen) == ["b"]  # a referenced, c served a minute ago, d stored 10 s ago, e pinned
