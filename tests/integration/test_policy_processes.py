"""The policy with real processes and a real Redis: SIGHUP reloads it in every worker (a broken file keeps the
policy in force), a broken file stops start-up with one clear line, and two replicas sharing Redis agree on
when each version was first seen."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator

import pytest

from proxy.domain.addresses import ProviderAddr, Version
from proxy.web.app_keys import GATEKEEPER, MIRROR
from tests.conftest import serve_proxy
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, registry_proxy, registry_proxy_in_process, wait_for
from tests.fakes.redis_server import METADATA_SECRET
from tests.integration.test_access_processes import status_of
from tests.integration.test_policy_http import baseline

INDEX = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json"
DENY_110 = f"""
[[rule]]
name = "foo-known-bad"
providers = ["{REGISTRY_HOST}/acme/foo"]
versions = "= 1.1.0"
action = "deny"
reason = "breaks IAM policies"
"""


async def test_sighup_reloads_the_policy_in_every_worker_and_a_broken_file_keeps_it(proxy_process, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('mode = "enforce"\n')
    proxy = await proxy_process("--policy", str(policy), "--workers", "2")
    await wait_for(lambda: len(proxy.events("worker.started")) == 2, 20, "the workers")
    serving = {record["pid"] for record in proxy.events("worker.started")}
    status, body = await status_of(proxy, INDEX)
    assert status == 200 and "1.1.0" in json.loads(body)["versions"]

    policy.write_text(DENY_110)
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("policy.reloaded")} == serving, 20, "every worker reloaded")
    for _ in range(6):  # fresh connections, spread over both workers
        status, body = await status_of(proxy, INDEX)
        assert status == 200 and set(json.loads(body)["versions"]) == {"1.0.0"}

    policy.write_text(DENY_110 + "colour = 1\n")
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("policy.reload_failed")} == serving, 20, "all refused it")
    failure = proxy.events("policy.reload_failed")[0]
    assert "rule 'foo-known-bad' (#1)" in failure["error"] and "'colour'" in failure["error"]
    for _ in range(4):
        status, body = await status_of(proxy, INDEX)
        assert set(json.loads(body)["versions"]) == {"1.0.0"}  # the policy in force stays
    assert not proxy.events("worker.stopped")


@pytest.mark.process
@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('[[rule]]\nname = "r"\nproviders = ["*/*"]\naction = "deny"\n', ["rule 'r' (#1)", "'providers'"]),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nversions = "~> x"\naction = "deny"\n', ["'versions'"]),
    ],
)
async def test_a_broken_policy_file_stops_start_up_and_check_says_the_same(tmp_path, text, names):
    policy = tmp_path / "policy.toml"
    policy.write_text(text)
    code, output = await registry_proxy_in_process("policy", "check", str(policy))
    assert code == 2
    line = output.strip().splitlines()[-1]
    assert line.startswith(f"registry-proxy: error: {policy}: ") and all(name in line for name in names), output
    code, output = await registry_proxy(
        "serve",
        "--data-dir",
        str(tmp_path / "data"),
        "--plain-http",
        "--listen",
        "127.0.0.1:1",
        "--policy",
        str(policy),
    )
    assert code == 2 and line in output, output


async def test_explain_says_which_rule_decides_for_the_client_and_scope_given(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rule]]\nname = "acme-only"\nproviders = ["*/acme/*"]\nscopes = ["registry.terraform.io/acme"]\n'
        'action = "allow"\n[default]\naction = "deny"\nreason = "not vetted"\n'
    )
    address = "registry.terraform.io/acme/foo@1.0.0"
    code, output = await registry_proxy_in_process("policy", "explain", "--policy", str(policy), address)
    assert code == 0 and "1. acme-only: does not apply" in output and "decision: deny by default" in output, output
    code, output = await registry_proxy_in_process(
        "policy", "explain", "--policy", str(policy), "--scope", "registry.terraform.io/acme", address
    )
    assert code == 0 and "scopes registry.terraform.io/acme" in output, output
    assert "decision: allow by acme-only" in output, output


async def test_explain_reads_the_policy_file_from_serves_variable(tmp_path, monkeypatch):
    policy = tmp_path / "policy.toml"
    policy.write_text('[default]\naction = "deny"\nreason = "not vetted"\n')
    monkeypatch.delenv("REGISTRY_PROXY_POLICY", raising=False)
    code, output = await registry_proxy_in_process("policy", "explain", "registry.terraform.io/acme/foo")
    assert code == 2 and "--policy FILE or REGISTRY_PROXY_POLICY" in output, output  # names both ways to give it
    monkeypatch.setenv("REGISTRY_PROXY_POLICY", str(policy))  # the variable `serve --policy` reads
    code, output = await registry_proxy_in_process("policy", "explain", "registry.terraform.io/acme/foo")
    assert code == 0 and f"policy {policy}" in output and "decision: deny by default" in output, output


@contextlib.asynccontextmanager
async def two_replicas(make_settings, client_ssl, redis_server, tmp_path) -> AsyncIterator[tuple]:
    """Two replicas sharing a Redis (a prefix of their own per test) with a 72h cooldown policy, after an operator
    baselined foo's versions (through the first: the record is the fleet's)."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n')
    shared = {
        "redis_url": redis_server.url,
        "redis_prefix": f"policy-{os.getpid()}-{tmp_path.name}",
        "metadata_secret": METADATA_SECRET,
    }
    async with (
        serve_proxy(make_settings(data_dir=tmp_path / "a", policy_file=policy, **shared), client_ssl) as a,
        serve_proxy(make_settings(data_dir=tmp_path / "b", policy_file=policy, **shared), client_ssl) as b,
    ):
        await baseline(a, ProviderAddr.parse(REGISTRY_HOST, "acme", "foo"), "1.0.0", "1.1.0")
        yield a, b


@pytest.mark.one_metadata_store
async def test_two_replicas_sharing_redis_agree_on_first_seen_times(
    make_settings, client_ssl, redis_server, tmp_path, registry, signing_key
):
    addr = ProviderAddr.parse(REGISTRY_HOST, "acme", "foo")
    clocks = {"a": 1_900_000_000.0, "b": 1_900_000_500.0}  # the replicas' clocks differ
    async with two_replicas(make_settings, client_ssl, redis_server, tmp_path) as (a, b):
        for name, replica in (("a", a), ("b", b)):
            replica.app[GATEKEEPER].clock = replica.app[GATEKEEPER].first_seen.clock = lambda n=name: clocks[n]
        for replica in (a, b):
            status, index = await replica.json(INDEX)
            assert status == 200 and set(index["versions"]) == {"1.0.0", "1.1.0"}  # baselined through a
        registry.add(Release("acme", "foo", "1.2.0", signing_key))
        for replica in (a, b):
            await replica.app[MIRROR].provider_versions(addr, max_age=0.0)  # both see 1.2.0 now
        statuses = await asyncio.gather(a.json(INDEX), b.json(INDEX))  # at once: one of them records it
        assert all(set(index["versions"]) == {"1.0.0", "1.1.0"} for _, index in statuses)
        seen = [
            (await r.app[GATEKEEPER].first_seen.times(addr, [Version.parse("1.2.0")]))[
                Version.parse("1.2.0")
            ].first_seen
            for r in (a, b)
        ]
        assert seen[0] == seen[1] and seen[0] in clocks.values()
        status, held = await b.json(f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.2.0.json")
        assert status == 403 and held["code"] == "policy_held_back"


@pytest.mark.one_metadata_store
async def test_two_replicas_sharing_redis_ask_the_registry_api_once_and_agree_on_its_publish_time(
    make_settings, client_ssl, redis_server, tmp_path, registry, signing_key
):
    now = 1_900_000_000.0
    registry.published_at[("acme", "foo", "1.1.0")] = "2030-03-17T16:46:40Z"  # an hour before `now`
    async with two_replicas(make_settings, client_ssl, redis_server, tmp_path) as (a, b):
        for replica in (a, b):
            replica.app[GATEKEEPER].clock = replica.app[GATEKEEPER].first_seen.clock = lambda: now
        for replica in (a, b):
            assert (await replica.json(INDEX))[0] == 200  # a list: no per-version request
        assert registry.count("/v1/providers/acme/foo/1.1.0") == 0
        path = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.1.0.json"
        answers = await asyncio.gather(a.json(path), b.json(path))  # at once: one of them asks
    assert [status for status, _ in answers] == [403, 403]
    assert {body["available_at"] for _, body in answers} == {"2030-03-20T16:46:40Z"}
    assert registry.count("/v1/providers/acme/foo/1.1.0") == 1
