"""Issue 30, item 1: the start-up log says, in one warning, when a min-age rule is in force and its Redis may lose
the records the rule depends on (they are written without a TTL, so only an `allkeys-*` maxmemory-policy evicts
them; without RDB or AOF a restart of Redis empties it; a Redis whose CONFIG is refused is of unknown state).
Against real redis-servers so configured."""

from __future__ import annotations

import pytest

from proxy.metadata_store.redis import durability_risks
from tests.fakes.redis_server import METADATA_SECRET, RedisServer

COOLDOWN = '[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n'
DENY = '[[rule]]\nname = "no-evil"\nproviders = ["*/evilcorp/*"]\naction = "deny"\n'
DURABLE = ["--appendonly", "yes"]


@pytest.mark.process
@pytest.mark.parametrize(
    ("options", "policy", "warned"),
    [
        ([], COOLDOWN, ["persists nothing"]),  # the test servers' own: no RDB save points, appendonly no
        ([*DURABLE, "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"], COOLDOWN, ["allkeys-lru"]),
        ([*DURABLE, "--rename-command", "CONFIG", ""], COOLDOWN, ["cannot be read"]),
        ([*DURABLE, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru"], COOLDOWN, []),  # no TTL: kept
        ([], DENY, []),  # no min-age rule: nothing depends on the records
    ],
    ids=["no-persistence", "allkeys-lru", "config-refused", "durable", "no-min-age-rule"],
)
async def test_start_up_warns_when_redis_may_lose_what_a_min_age_rule_depends_on(
    in_process_proxy, tmp_path, options, policy, warned
):
    server = RedisServer(tmp_path / "redis", options=options)
    server.start()
    try:
        path = tmp_path / "policy.toml"
        path.write_text(policy)
        proxy = await in_process_proxy(
            "--policy", str(path), "--redis-url", server.url, "--metadata-secret", METADATA_SECRET
        )
        warnings = proxy.events("redis.policy_records_at_risk")
        if not warned:
            assert warnings == []
            return
        [warning] = warnings
        assert warning["level"] == "warning" and "min-age rule is in force" in warning["effect"]
        assert len(warning["risks"]) == len(warned)
        assert all(text in risk for text, risk in zip(warned, warning["risks"], strict=True))
    finally:
        server.stop()


def test_only_allkeys_policies_and_no_persistence_put_the_records_at_risk():
    durable = {"maxmemory": "0", "maxmemory-policy": "noeviction", "save": "3600 1", "appendonly": "no"}
    assert durability_risks(durable) == []
    assert durability_risks({**durable, "save": "", "appendonly": "yes"}) == []  # AOF alone persists
    for policy in ("volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"):  # only keys with a TTL
        assert durability_risks({**durable, "maxmemory-policy": policy}) == []
    for policy in ("allkeys-lru", "allkeys-lfu", "allkeys-random"):
        [risk] = durability_risks({**durable, "maxmemory-policy": policy})
        assert policy in risk
    [risk] = durability_risks({**durable, "save": ""})
    assert "persists nothing" in risk
    [risk] = durability_risks(None)
    assert "unknown" in risk
