"""`registry-proxy policy baseline`: the versions listed now recorded as old, on purpose, audited with who did it;
without ADDRESS every provider and module the store knows; a running proxy lets them through once it refreshes
the version list; a version with a first-seen time keeps it."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_cooldown_state_loss_e2e import baseline, get
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, wait_until
from tests.fakes.registry import ModuleRelease

FOO = f"{REGISTRY_HOST}/acme/foo"
COOLDOWN = '[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n'


async def listed(proxy) -> set[str]:
    status, body = await get(proxy, f"/mirror/v1/{FOO}/index.json")
    assert status == 200, body
    return set(body["versions"])


@pytest.mark.one_metadata_store
async def test_baseline_without_address_covers_what_the_store_knows_and_keeps_first_seen_times(
    in_process_proxy, registry, signing_key, ca_file, tmp_path
):
    policy = tmp_path / "policy.toml"
    policy.write_text(COOLDOWN)
    audit = tmp_path / "audit.jsonl"
    flags = ("--policy", str(policy), "--ttl-versions", "1s", "--audit-log", str(audit))
    proxy = await in_process_proxy(*flags)
    assert await listed(proxy) == set()  # a first listing, no publish dates: the ages are unknown, held back
    status, body = await get(proxy, f"/mirror/v1/{FOO}/1.0.0.json")
    assert status == 403 and "its age is unknown" in body["reason"] and f"policy baseline {FOO}" in body["reason"]
    registry.add(Release("acme", "foo", "1.2.0", signing_key))

    async def seen() -> bool:  # once the list is refreshed, 1.2.0 is seen now: young, not of an unknown age
        status, body = await get(proxy, f"/mirror/v1/{FOO}/1.2.0.json")
        return status == 403 and "the time the proxy first saw it" in body["reason"]

    await wait_until(seen, 30, "1.2.0 to be seen")
    code, output = await baseline(registry, ca_file, proxy.data_dir, flags, actor="bob")
    assert code == 0, output
    assert (
        f"baselined {FOO}: 2 versions recorded as old (1.0.0, 1.1.0); 1 kept with their first-seen time (1.2.0)"
        in output
    ), output

    async def released() -> bool:  # the running proxy reads the baseline when it next refreshes the list
        return await listed(proxy) == {"1.0.0", "1.1.0"}

    await wait_until(released, 30, "the running proxy to let the baselined versions through")
    status, body = await get(proxy, f"/mirror/v1/{FOO}/1.2.0.json")
    assert status == 403 and body["code"] == "policy_held_back"
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [(e["artifact"], e["client"], e["versions"]) for e in events if e["event"] == "baselined"] == [
        ({"kind": "provider", "address": FOO}, "bob", ["1.0.0", "1.1.0"])
    ]


async def test_baseline_refuses_what_is_not_an_address_and_says_when_nothing_is_known(registry, ca_file, tmp_path):
    flags = ("--policy", str(tmp_path / "none.toml"))
    (tmp_path / "none.toml").write_text(COOLDOWN)
    code, output = await baseline(registry, ca_file, tmp_path / "data", flags, f"{FOO}@1.0.0", actor="x")
    assert code == 1 and "no @VERSION" in output, output
    code, output = await baseline(registry, ca_file, tmp_path / "data", flags, actor="x")
    assert code == 1 and "nothing to baseline" in output, output


@pytest.mark.one_metadata_store
async def test_baseline_of_a_module_records_the_versions_its_registry_lists(
    in_process_proxy, registry, ca_file, tmp_path
):
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net-1.0.0.tar.gz"))
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nname = "cooldown"\nmodules = ["*/*/*/*"]\nmin-age = "72h"\n')
    flags = ("--policy", str(policy))
    proxy = await in_process_proxy(*flags)
    versions = f"/registry/{REGISTRY_HOST}/modules/v1/acme/net/aws/versions"
    status, body = await get(proxy, versions)
    assert status == 200 and [v["version"] for v in body["modules"][0]["versions"]] == [], body  # unknown age
    code, output = await baseline(registry, ca_file, proxy.data_dir, flags, f"{REGISTRY_HOST}/acme/net/aws", actor="x")
    assert code == 0 and f"baselined {REGISTRY_HOST}/acme/net/aws: 1 versions recorded as old (1.0.0)" in output
    code, output = await baseline(registry, ca_file, proxy.data_dir, flags, f"{REGISTRY_HOST}/acme/gone/aws", actor="x")
    assert code == 1 and "not known to its registry" in output, output
