"""The fleet's secret marker over a store in memory, the seal's accepted secrets, and the URL the mismatch shows."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from proxy.metadata_store.fleet_secret import FleetSecret, Standing
from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import Seal, seal
from proxy.settings.config import ConfigError
from proxy.settings.values import shown_redis_url

OLD, NEW = b"old-secret-0123456789abcdef", b"new-secret-0123456789abcdef"


class MarkerStoreInMemory:
    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.down = False

    async def get_kept(self, key: str) -> bytes | None:
        return None if self.down else self.values.get(key)

    async def add(self, key: str, value: bytes) -> bool | None:
        if self.down:
            return None
        if key in self.values:
            return False
        self.values[key] = value
        return True

    async def swap(self, key: str, old: bytes, new: bytes) -> bool | None:
        if self.down:
            return None
        if self.values.get(key) != old:
            return False
        self.values[key] = new
        return True

    async def sealed_keys(self) -> AsyncIterator[str]:
        for key in list(self.values):
            if key != FLEET_SECRET:
                yield key


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fleet(store: MarkerStoreInMemory, secret: bytes, *accepted: bytes, clock: Clock | None = None) -> FleetSecret:
    return FleetSecret(store, Seal(secret, store="test", accepted=accepted), mismatch="differs", clock=clock or Clock())


async def test_the_first_replica_marks_the_store_and_the_others_open_the_mark() -> None:
    store = MarkerStoreInMemory()
    assert await fleet(store, OLD).require() is Standing.OWN
    marker = store.values[FLEET_SECRET]
    assert OLD not in marker and marker.startswith(b"rps1.")  # the id and its MAC, never the secret
    assert await fleet(store, OLD).require() is Standing.OWN
    assert store.values[FLEET_SECRET] == marker


async def test_another_secret_is_refused_with_the_one_line_and_nothing_is_written() -> None:
    store = MarkerStoreInMemory()
    await fleet(store, OLD).require()
    marker = store.values[FLEET_SECRET]
    other = fleet(store, NEW)
    with pytest.raises(ConfigError, match=r"^differs$"):
        await other.require()
    assert store.values[FLEET_SECRET] == marker
    assert other.problem == "differs" and not await other.confirm()


@pytest.mark.parametrize("forged", [b"rps1." + b"0" * 64 + b".id", b"an unsealed fleet id", b""])
async def test_a_forged_marker_is_a_mismatch_never_replaced(forged: bytes) -> None:
    store = MarkerStoreInMemory()
    store.values[FLEET_SECRET] = forged
    assert await fleet(store, OLD).check() is Standing.OTHER
    assert store.values[FLEET_SECRET] == forged


async def test_a_marker_sealed_under_another_key_does_not_open() -> None:
    store = MarkerStoreInMemory()
    store.values[FLEET_SECRET] = seal(OLD, "archive:some/other/key", b"id")
    assert await fleet(store, OLD).check() is Standing.OTHER


async def test_a_store_that_does_not_answer_leaves_the_standing_unknown() -> None:
    store = MarkerStoreInMemory()
    store.down = True
    replica = fleet(store, OLD)
    assert await replica.require() is Standing.UNKNOWN
    assert replica.problem is None and await replica.confirm()
    store.down = False
    assert await replica.check() is Standing.OWN


async def test_a_serving_replica_checks_again_after_the_interval_and_stops_using_the_store() -> None:
    store, clock = MarkerStoreInMemory(), Clock()
    replica = fleet(store, OLD, clock=clock)
    await replica.require()
    store.values[FLEET_SECRET] = seal(NEW, FLEET_SECRET, b"another fleet's id")
    assert await replica.confirm()  # not checked again yet
    clock.now += 10
    assert not await replica.confirm()
    assert replica.problem == "differs"
    del store.values[FLEET_SECRET]  # lost: written again with this replica's secret
    clock.now += 10
    assert await replica.confirm() and replica.standing is Standing.OWN


async def test_a_rotation_accepts_either_secret_and_rotate_reseals_the_marker_last() -> None:
    store = MarkerStoreInMemory()
    await fleet(store, OLD).require()
    assert await fleet(store, OLD, NEW).require() is Standing.OWN  # step 1
    rotated = fleet(store, NEW, OLD)
    assert await rotated.require() is Standing.ACCEPTED  # step 2
    with pytest.raises(ConfigError):
        await fleet(store, NEW).require()  # step 4 before step 3
    assert await rotated.reseal()
    assert await fleet(store, NEW).require() is Standing.OWN
    assert await fleet(store, NEW, OLD).require() is Standing.OWN
    assert await fleet(store, OLD, NEW).require() is Standing.ACCEPTED
    with pytest.raises(ConfigError):
        await fleet(store, OLD).require()


def test_the_seal_opens_what_an_accepted_secret_sealed_and_seals_with_its_own() -> None:
    both = Seal(NEW, store="test", accepted=(OLD,))
    assert both.unseal("k", seal(OLD, "k", b"v")) == (b"v", False, "")
    assert both.unseal("k", seal(NEW, "k", b"v")) == (b"v", True, "")
    assert both.close("k", b"v") == seal(NEW, "k", b"v")
    assert both.unseal("k", seal(b"a third secret 0123456789", "k", b"v"))[0] is None
    assert Seal(NEW, store="test").unseal("k", seal(OLD, "k", b"v"))[0] is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://redis:6379/0", "redis://redis:6379/0"),
        ("redis://:hunter2@redis:6379/0", "redis://redis:6379/0"),
        ("rediss://user:pa/ss@word@redis:6380/1?password=x", "rediss://redis:6380/1"),
        ("redis+sentinel://:pw@s1:26379,s2:26379/mymaster/0", "redis+sentinel://s1:26379,s2:26379/mymaster/0"),
        ("unix:///run/redis.sock?password=x&db=2", "unix:///run/redis.sock"),
    ],
)
def test_the_mismatch_line_shows_the_url_without_credentials(url: str, shown: str) -> None:
    assert shown_redis_url(url) == shown
