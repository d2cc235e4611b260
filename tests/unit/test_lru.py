"""`proxy.domain.lru`: the one bounded mapping that drops the least recently used key first."""

from __future__ import annotations

from proxy.domain.lru import Lru


def test_beyond_its_limit_the_least_recently_put_or_touched_key_goes_first():
    lru: Lru[str, int] = Lru(3)
    for key, value in (("a", 1), ("b", 2), ("c", 3)):
        lru.put(key, value)
    lru.touch("a")  # a use: "b" is now the least recently used
    lru.put("d", 4)
    assert list(lru) == ["c", "a", "d"]
    lru.put("c", 30)  # putting a key held is a use too, and takes no room
    lru.put("e", 5)
    assert dict(lru) == {"d": 4, "c": 30, "e": 5}


def test_reads_are_not_uses():
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert (lru.get("a"), lru["a"], "a" in lru, lru.get("z"), "z" in lru) == (1, 1, True, None, False)
    lru.put("c", 3)
    assert list(lru) == ["b", "c"]


def test_pop_forgets_a_key_and_touch_of_an_absent_key_adds_nothing():
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    assert lru.pop("a") == 1 and lru.pop("a") is None
    lru.touch("a")
    assert len(lru) == 0 and lru.get("a") is None


def test_with_weigh_the_weight_in_all_is_bounded_too_and_one_heavier_than_the_bound_is_not_held():
    lru: Lru[str, bytes] = Lru(10, weigh=lambda key, value: len(value), max_weight=6)
    lru.put("a", b"11")
    lru.put("b", b"22")
    lru.touch("a")
    lru.put("c", b"333")  # 7 in all: "b", the least recently used, goes
    assert (list(lru), lru.weight) == (["a", "c"], 5)
    lru.put("a", b"1")  # replacing counts the new value only
    assert lru.weight == 4
    lru.put("c", b"x" * 7)  # heavier than the whole bound: not held, its old value forgotten, nothing else lost
    assert (dict(lru), lru.weight) == ({"a": b"1"}, 1)
    assert lru.pop("a") == b"1" and lru.weight == 0
