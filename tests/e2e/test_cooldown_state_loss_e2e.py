"""Issue 30, item 1: no loss, flush, eviction or forgery of the proxy's state shortens a cooldown.

The issue's reproduction, against a real redis-server (one of the test's own: it is flushed and restarted) or the
embedded SQLite file, and a real `terraform init`: a policy with only a 72h cooldown, `--ttl-versions 1s` (the
issue's 2s, halved for time); the upstream lists hello 1.0.0, the proxy sees it and an operator baselines it
(`policy baseline`); the upstream adds 1.1.0, held back. Then the first-seen record is lost (DEL, FLUSHDB, a
restart of Redis without persistence, a deleted SQLite row) or forged (unsealed, or sealed with another secret).
1.1.0 must stay held after the list is refreshed and after the proxy restarts, never fetched; `~> 1.0` resolves to
1.0.0 (by the baseline where it survives; where the flush took it too, by the registry API's publish date)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import ssl

import aiohttp
import pytest

from proxy.domain.addresses import Version
from proxy.governance.release_times import ReleaseRecord
from proxy.metadata_store.sealed import seal
from tests.e2e.test_network_mirror_e2e import mirror_config
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, registry_proxy_in_process, wait_until
from tests.fakes.redis_server import METADATA_SECRET, RedisServer

pytestmark = pytest.mark.e2e

HELLO = f"{REGISTRY_HOST}/acme/hello"
FIRST_SEEN = f"first-seen:{HELLO}"
VERSIONS = "/v1/providers/acme/hello/versions"  # the upstream's version list
POLICY = '[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n'
PREFIX = "cooldown"
LOSSES = ["del", "flushdb", "redis-restart", "unsealed", "sealed-with-another-secret", "sqlite-row"]
FLUSHED = ("flushdb", "redis-restart")  # the baseline is lost too


def hello_tf(constraint: str) -> str:
    return (
        f'terraform {{\n  required_providers {{\n    hello = {{\n      source  = "{HELLO}"\n'
        f'      version = "{constraint}"\n    }}\n  }}\n}}\n'
    )


async def get(proxy, path: str) -> tuple[int, dict]:
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path, ssl=context) as response:
        return response.status, await response.json(content_type=None)


async def listed(proxy) -> set[str]:
    status, body = await get(proxy, f"/mirror/v1/{HELLO}/index.json")
    assert status == 200, body
    return set(body["versions"])


async def baseline(registry, ca_file, data_dir, flags, *addresses: str, actor: str) -> tuple[int, str]:
    """`registry-proxy policy baseline [ADDRESS...]` with the options of the proxy `in_process_proxy` started."""
    return await registry_proxy_in_process(
        "policy",
        "baseline",
        *addresses,
        "--actor",
        actor,
        "--data-dir",
        str(data_dir),
        "--upstream-map",
        f"{REGISTRY_HOST}={registry.url}",
        "--allow-host",
        "",
        "--upstream-ca-file",
        str(ca_file),
        *flags,
    )


def forged_record() -> bytes:
    """What an attacker would write: every version seen long ago (a record the proxy never sealed)."""
    return ReleaseRecord(seen={Version.parse("1.0.0"): 0.0, Version.parse("1.1.0"): 0.0}).encode()


@pytest.mark.parametrize("loss", LOSSES)
async def test_a_lost_or_forged_first_seen_record_never_lets_a_young_version_through(
    in_process_proxy, registry, signing_key, terraform, ca_file, tmp_path, loss
):
    registry.add(Release("acme", "hello", "1.0.0", signing_key))
    if loss in FLUSHED:  # the registry API dates 1.0.0 (not 1.1.0): where state is gone, its date decides
        registry.published_at[("acme", "hello", "1.0.0")] = "2020-01-01T00:00:00Z"
    server = None
    store = ()
    if loss != "sqlite-row":
        server = RedisServer(tmp_path / "redis")
        server.start()
        store = ("--redis-url", server.url, "--redis-prefix", PREFIX, "--metadata-secret", METADATA_SECRET)
    try:
        policy = tmp_path / "policy.toml"
        policy.write_text(POLICY)
        audit = tmp_path / "audit.jsonl"
        flags = ("--policy", str(policy), "--ttl-versions", "1s", "--audit-log", str(audit), *store)
        data_dir = tmp_path / "proxy-data"
        proxy = await in_process_proxy(*flags, data_dir=data_dir)
        assert await listed(proxy) == ({"1.0.0"} if loss in FLUSHED else set())  # a first listing: ages unknown
        code, output = await baseline(registry, ca_file, data_dir, flags, HELLO, actor="alice")
        assert code == 0 and f"baselined {HELLO}: 1 versions recorded as old (1.0.0)" in output, output
        events = [json.loads(line) for line in audit.read_text().splitlines()]
        assert {(e["event"], e["client"], tuple(e["versions"])) for e in events if e["event"] == "baselined"} == {
            ("baselined", "alice", ("1.0.0",))
        }

        registry.add(Release("acme", "hello", "1.1.0", signing_key))

        async def held() -> bool:  # once the list (1s) is refreshed, 1.1.0 is new: held back
            return (await get(proxy, f"/mirror/v1/{HELLO}/1.1.0.json"))[0] == 403

        await wait_until(held, 30, "1.1.0 to be listed and held back")
        status, body = await get(proxy, f"/mirror/v1/{HELLO}/1.1.0.json")
        assert body["code"] == "policy_held_back", body
        assert await listed(proxy) == {"1.0.0"}

        lose_the_record(loss, server, data_dir)
        refreshes = registry.count(VERSIONS)

        async def refreshed() -> bool:  # the list (1s) fetched again since the loss
            await listed(proxy)
            return registry.count(VERSIONS) > refreshes

        await wait_until(refreshed, 30, "the version list to be refreshed")
        assert await listed(proxy) == {"1.0.0"}
        assert (await get(proxy, f"/mirror/v1/{HELLO}/1.1.0.json"))[0] == 403
        await proxy.stop()  # a restart: nothing of the record is left in the proxy's memory either
        proxy = await in_process_proxy(*flags, data_dir=data_dir)
        assert await listed(proxy) == {"1.0.0"}
        [unknown] = proxy.events("policy.release_times_unknown")  # said loudly, once
        assert unknown["level"] == "warning" and unknown["artifact"] == HELLO
        if loss in ("unsealed", "sealed-with-another-secret"):
            assert [e["key"] for e in proxy.events("security.metadata_poisoned")] == [FIRST_SEEN]
        status, body = await get(proxy, f"/mirror/v1/{HELLO}/1.1.0.json")
        assert status == 403 and body["code"] == "policy_held_back", body
        assert "its age is unknown" in body["reason"], body

        code, output = await terraform.init(
            terraform.workdir("w", hello_tf("~> 1.0")), mirror_config(proxy), proxy.ca_file
        )
        assert code == 0 and f"- Installed {HELLO} v1.0.0" in output, output
        assert not [path for _, path in registry.requests if "hello" in path and "1.1.0" in path and "/files/" in path]
        if server is not None:  # a record the policy depends on has no TTL
            assert server.client().ttl(f"{PREFIX}:{FIRST_SEEN}") == -1
            assert server.client().ttl(f"{PREFIX}:baseline:{HELLO}") == (-2 if loss in FLUSHED else -1)
    finally:
        if server is not None:
            server.stop()


def lose_the_record(loss: str, server: RedisServer | None, data_dir) -> None:
    """Lose or forge the first-seen record of hello as `loss` says."""
    name = f"{PREFIX}:{FIRST_SEEN}"
    if loss == "sqlite-row":
        with contextlib.closing(sqlite3.connect(data_dir / "metadata" / "metadata.sqlite")) as db, db:
            assert db.execute("DELETE FROM metadata WHERE key = ?", (FIRST_SEEN,)).rowcount == 1
        return
    assert server is not None
    client = server.client()
    assert client.exists(name)
    if loss == "del":
        client.delete(name)
    elif loss == "flushdb":
        client.flushdb()
    elif loss == "redis-restart":  # no RDB, no AOF: it comes back empty
        server.stop()
        server.start()
    elif loss == "unsealed":
        client.set(name, forged_record())
    elif loss == "sealed-with-another-secret":
        client.set(name, seal(b"another-fleet-secret-0123456789abcdef", FIRST_SEEN, forged_record()))
