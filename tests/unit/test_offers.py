"""Unit tests for proxy.protocol.offers: the recheck gate and the "not offered" checks."""

from __future__ import annotations

from proxy.domain.addresses import Platform
from proxy.protocol.offers import RecheckGate, list_ttl, listed, missing_platforms, no_package_message


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_gate_allows_one_recheck_per_interval_per_key() -> None:
    clock = Clock()
    gate = RecheckGate(60, clock=clock)
    assert gate.allow("a") is True
    assert [gate.allow("a") for _ in range(1000)] == [False] * 1000
    assert gate.allow("b") is True  # keys are independent
    clock.now += 59.9
    assert gate.allow("a") is False
    clock.now += 0.1
    assert gate.allow("a") is True
    clock.now -= 3600  # a clock that went backwards does not lock the key out forever
    assert gate.allow("a") is True


def test_the_gate_forgets_the_oldest_keys_beyond_its_bound() -> None:
    gate = RecheckGate(60, max_keys=2, clock=Clock())
    assert all(gate.allow(key) for key in ("a", "b", "c"))
    assert gate.allow("a") is True  # forgotten, so allowed again
    assert gate.allow("c") is False


async def test_listed_reloads_only_when_lacking_and_allowed() -> None:
    gate = RecheckGate(5, clock=Clock())
    calls: list[float | None] = []

    async def load(max_age: float | None) -> set[str]:
        calls.append(max_age)
        return {"1.0.0"} if max_age is None else {"1.0.0", "1.1.0"}

    assert await listed(load, lambda found: "1.0.0" not in found, gate, "k") == {"1.0.0"}
    assert calls == [None]
    assert await listed(load, lambda found: "1.1.0" not in found, gate, "k") == {"1.0.0", "1.1.0"}
    assert calls == [None, None, 5]
    assert await listed(load, lambda found: "9.9.9" not in found, gate, "k") == {"1.0.0"}
    assert calls == [None, None, 5, None]  # the gate is closed for this key now


def test_list_ttl_and_missing_platforms() -> None:
    assert list_ttl(600, None) == 600 and list_ttl(600, 60) == 60 and list_ttl(30, 60) == 30
    offered = [Platform.parse("linux_amd64"), Platform.parse("darwin_arm64")]
    requested = [Platform.parse(p) for p in ("plan9_mips", "linux_amd64", "fake_arch")]
    missing = missing_platforms(offered, requested)
    assert missing == [Platform.parse("plan9_mips"), Platform.parse("fake_arch")]
    assert no_package_message("provider x 1.0.0", missing, offered) == (
        "provider x 1.0.0 has no package for plan9_mips, fake_arch (it offers: linux_amd64, darwin_arm64)"
    )
