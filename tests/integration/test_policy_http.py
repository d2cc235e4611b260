"""The policy through the real application: filtered lists, 403s naming the rule, no upstream request for
anything denied, min-age with an injected clock, warn mode, the audit trail and the metrics."""

from __future__ import annotations

import json

import pytest

from proxy.commands import CommandError
from proxy.commands.bundle import export_bundle
from proxy.commands.proxy_api import ProxyClient
from proxy.commands.warm import run_warm
from proxy.domain.addresses import ModuleAddr, Platform, ProviderAddr, Version
from proxy.governance.gatekeeper import load_policy
from proxy.governance.release_times import FirstSeen
from proxy.identity.tokens import hash_token
from proxy.services.shared_fetches import SharedFetches
from proxy.web.app_keys import GATEKEEPER, METRICS
from proxy.web.app_keys import MIRROR as MIRROR_SERVICE
from tests.conftest import serve_proxy
from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.process import REGISTRY_HOST, registry_proxy_in_process
from tests.fakes.registry import ModuleRelease
from tests.integration.test_lock_warm_bundle import _stores

pytestmark = pytest.mark.one_metadata_store

MIRROR = f"/mirror/v1/{REGISTRY_HOST}/acme"
REGISTRY = f"/registry/{REGISTRY_HOST}/providers/v1/acme"
LINUX = Platform.parse("linux_amd64")
FOO = ProviderAddr.parse(REGISTRY_HOST, "acme", "foo")
TERRAFORM = {"User-Agent": "Terraform/1.11.0"}
POLICY = f"""
[[rule]]
name = "unvetted"
providers = ["{REGISTRY_HOST}/evilcorp/*", "*/acme/bar"]
action = "deny"
reason = "namespace not approved (SEC-123)"

[[rule]]
name = "foo-known-bad"
providers = ["{REGISTRY_HOST}/acme/foo"]
versions = "= 1.1.0"
action = "deny"
reason = "breaks IAM policies"

[[rule]]
name = "cooldown"
providers = ["*/*/*"]
min-age = "72h"

[[rule]]
name = "platforms"
providers = ["*/*/*"]
platforms = ["linux_amd64", "darwin_arm64"]

[default]
action = "allow"
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def policy_file(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return path


async def baseline(running, addr: ProviderAddr | ModuleAddr, *versions: str) -> None:
    """What `registry-proxy policy baseline` records: `versions` of `addr` are old, on purpose (their ages would be
    unknown on a first listing, and held back)."""
    await running.app[GATEKEEPER].first_seen.record_baseline(addr, [Version.parse(v) for v in versions], "test")


@pytest.fixture
async def policed(make_settings, client_ssl, policy_file, tmp_path, registry, signing_key):
    """The policy in force, after an operator baselined the versions of foo the registry lists."""
    registry.add(Release("acme", "foo", "1.0.1", signing_key))
    audit = tmp_path / "audit.jsonl"
    settings = make_settings(policy_file=policy_file, audit_log=str(audit), versions=600.0)
    async with serve_proxy(settings, client_ssl) as running:
        await baseline(running, FOO, "1.0.0", "1.0.1", "1.1.0")
        running.audit = audit
        yield running


def audit_events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def upstream_paths(registry) -> list[str]:
    return [path for _, path in registry.requests]


async def test_lists_leave_out_denied_versions_so_constraints_resolve_to_allowed_ones(policed, registry):
    status, index = await policed.json(f"{MIRROR}/foo/index.json")
    assert status == 200 and set(index["versions"]) == {"1.0.0", "1.0.1"}
    status, versions = await policed.json(f"{REGISTRY}/foo/versions")
    assert status == 200
    assert {v["version"] for v in versions["versions"]} == {"1.0.0", "1.0.1"}
    assert any("1.1.0" in w and "foo-known-bad" in w and "breaks IAM policies" in w for w in versions["warnings"])


async def test_a_denied_version_is_refused_with_rule_and_reason_and_never_fetched(policed, registry):
    before = len(registry.requests)
    for path in (
        f"{MIRROR}/foo/1.1.0.json",
        f"{MIRROR}/foo/1.1.0/linux_amd64/terraform-provider-foo_1.1.0_linux_amd64.zip",
        f"{REGISTRY}/foo/1.1.0/download/linux/amd64",
        f"{REGISTRY}/foo/1.1.0/download/linux/amd64/SHA256SUMS",
        f"/lock/v1/{REGISTRY_HOST}/acme/foo/1.1.0?platform=linux_amd64",
    ):
        status, _, body = await policed.get(path)
        document = json.loads(body)
        assert status == 403, path
        assert (document["code"], document["rule"], document["reason"]) == (
            "policy_denied",
            "foo-known-bad",
            "breaks IAM policies",
        )
    assert not [p for p in upstream_paths(registry)[before:] if "1.1.0" in p]
    async with policed.session.get(policed.url + f"{REGISTRY}/foo/1.1.0/download/linux/amd64/SHA256SUMS") as response:
        assert response.reason == "Denied by policy rule foo-known-bad: breaks IAM policies"
    denied = [e for e in audit_events(policed.audit) if e["event"] == "denied"]
    assert denied and denied[0]["rule"] == "foo-known-bad" and denied[0]["artifact"]["version"] == "1.1.0"
    assert denied[0]["client"] == "anonymous" and denied[0]["request_id"]
    metrics = policed.app[METRICS].exposition().decode()
    assert 'registry_proxy_policy_decisions_total{decision="deny",rule="foo-known-bad"} 6.0' in metrics


async def test_a_denied_namespace_is_refused_without_any_upstream_request(policed, registry):
    before = len(registry.requests)
    status, body = await policed.json(f"/mirror/v1/{REGISTRY_HOST}/evilcorp/thing/index.json")
    assert status == 403 and body["rule"] == "unvetted"
    status, body = await policed.json(f"{REGISTRY}/bar/versions")
    assert status == 403 and body["code"] == "policy_denied"
    assert registry.requests[before:] == []


async def test_terraform_reads_the_reason_of_a_denied_provider_in_its_versions_and_sha256sums(policed, registry):
    before = len(registry.requests)
    status, _, body = await policed.get(f"{REGISTRY}/bar/versions", headers=TERRAFORM)
    document = json.loads(body)
    assert status == 200 and "namespace not approved (SEC-123)" in document["warnings"][0]
    placeholder = document["versions"][0]["version"]
    status, _, body = await policed.get(f"{REGISTRY}/bar/{placeholder}/download/linux/amd64", headers=TERRAFORM)
    assert status == 200
    sums = json.loads(body)["shasums_url"]
    async with policed.session.get(policed.url + sums, headers=TERRAFORM) as response:
        assert response.status == 403
        assert response.reason == "Denied by policy rule unvetted: namespace not approved (SEC-123)"
    assert registry.requests[before:] == []


async def test_a_platform_outside_the_list_is_refused_without_any_upstream_request(policed, registry):
    path = f"{MIRROR}/foo/1.0.0/windows_amd64/terraform-provider-foo_1.0.0_windows_amd64.zip"
    status, _, body = await policed.get(path)
    assert status == 403 and json.loads(body)["rule"] == "platforms"
    assert not [p for p in upstream_paths(registry) if "windows" in p]
    status, document = await policed.json(f"{MIRROR}/foo/1.0.0.json")
    assert status == 200 and set(document["archives"]) == {"linux_amd64", "darwin_arm64"}
    assert not [p for p in upstream_paths(registry) if "windows" in p]  # nothing about it fetched


async def test_min_age_holds_new_versions_back_until_the_injected_clock_passes_it(policed, registry, signing_key):
    clock = Clock()
    gate = policed.app[GATEKEEPER]
    gate.clock = gate.first_seen.clock = clock
    status, index = await policed.json(f"{MIRROR}/foo/index.json")
    assert set(index["versions"]) == {"1.0.0", "1.0.1"}  # baselined: old
    registry.add(Release("acme", "foo", "1.2.0", signing_key))
    clock.now += 3600
    await policed.app[MIRROR_SERVICE].provider_versions(FOO, max_age=0.0)  # the list refreshed: 1.2.0 seen now
    status, index = await policed.json(f"{MIRROR}/foo/index.json")
    assert set(index["versions"]) == {"1.0.0", "1.0.1"}
    status, body = await policed.json(f"{MIRROR}/foo/1.2.0.json")
    assert status == 403 and body["code"] == "policy_held_back" and body["available_at"]
    assert not [p for p in upstream_paths(registry) if "1.2.0" in p]
    clock.now += 72 * 3600
    status, index = await policed.json(f"{MIRROR}/foo/index.json")
    assert set(index["versions"]) == {"1.0.0", "1.0.1", "1.2.0"}
    status, _ = await policed.json(f"{MIRROR}/foo/1.2.0.json")
    assert status == 200


async def test_warn_mode_denies_nothing_and_records_what_it_would_have(
    make_settings, client_ssl, tmp_path, registry, policy_file
):
    policy_file.write_text('mode = "warn"\n' + POLICY)
    audit = tmp_path / "warn.jsonl"
    async with serve_proxy(make_settings(policy_file=policy_file, audit_log=str(audit)), client_ssl) as running:
        status, index = await running.json(f"{MIRROR}/foo/index.json")
        assert status == 200 and set(index["versions"]) == {"1.0.0", "1.1.0"}
        for _ in range(2):  # a would-be denial is recorded every time, not remembered as an answer
            status, _ = await running.json(f"{MIRROR}/foo/1.1.0.json")
            assert status == 200
        status, _, _ = await running.get(f"{MIRROR}/foo/1.1.0/linux_amd64/terraform-provider-foo_1.1.0_linux_amd64.zip")
        assert status == 200
        events = audit_events(audit)
    would = [e for e in events if e["event"] == "denied"]
    assert {e["decision"] for e in would} == {"would-deny"} and len(would) == 3
    assert {e["rule"] for e in would} == {"foo-known-bad"}
    assert [e["event"] for e in events if e["event"] != "denied"] == ["fetched", "served"]


async def test_the_page_shows_recent_denials_and_what_each_rule_blocked(policed):
    await policed.json(f"{MIRROR}/foo/1.1.0.json")
    await policed.json(f"/mirror/v1/{REGISTRY_HOST}/evilcorp/thing/index.json")
    status, _, body = await policed.get("/")
    html = body.decode()
    assert status == 200 and 'id="policy"' in html
    rules = html[html.index('id="policy-rules"') : html.index("</table>", html.index('id="policy-rules"'))]
    assert "foo-known-bad" in rules and "unvetted" in rules
    denials = html[html.index('id="policy-denials"') :]
    assert "evilcorp" in denials and "namespace not approved (SEC-123)" in denials
    assert "breaks IAM policies" in denials


async def test_warm_obeys_the_policy_and_names_the_rule(policed, ca_file, registry, tmp_path):
    lock = tmp_path / ".terraform.lock.hcl"  # pinned before the rule existed
    lock.write_text(f'provider "{REGISTRY_HOST}/acme/foo" {{\n  version = "1.1.0"\n}}\n')
    async with ProxyClient(policed.url, ca_file) as client:
        report = await run_warm(client, [LINUX], lock_file=lock)
    assert report.done == [] and report.failed == {}
    [refusal] = report.refused
    assert "1.1.0" in refusal.what and (refusal.rule, refusal.reason) == ("foo-known-bad", "breaks IAM policies")
    assert not [p for p in upstream_paths(registry) if "1.1.0" in p]


async def test_export_leaves_out_what_the_policy_denies(make_local_settings, client_ssl, tmp_path, policy_file):
    settings = make_local_settings(data_dir=tmp_path / "a")
    async with serve_proxy(settings, client_ssl) as running:  # cached before the rule: no policy yet
        for version in ("1.0.0", "1.1.0"):
            path = f"{MIRROR}/foo/{version}/linux_amd64/terraform-provider-foo_{version}_linux_amd64.zip"
            assert (await running.get(path))[0] == 200
    cache, store = await _stores(settings.data_dir)
    try:
        with pytest.raises(CommandError, match="nothing to export"):  # their ages are unknown: held back
            await export_bundle(cache, store, tmp_path / "a.tar", [], load_policy(policy_file))
        await FirstSeen(cache, SharedFetches(), lambda: 0.0).record_baseline(FOO, [Version.parse("1.0.0")], "test")
        report = await export_bundle(cache, store, tmp_path / "b.tar", [], load_policy(policy_file))
    finally:
        await cache.close()
        await store.close()
    assert [p.split()[1] for p in report.providers] == ["1.0.0"]  # baselined
    assert len(report.denied_left_out) == 1 and "1.1.0" in report.denied_left_out[0]
    assert "foo-known-bad: breaks IAM policies" in report.denied_left_out[0]


async def test_a_version_denied_after_it_was_cached_is_refused_at_once(make_settings, client_ssl, tmp_path, registry):
    policy = tmp_path / "later.toml"
    policy.write_text('mode = "enforce"\n')
    archive = f"{MIRROR}/foo/1.1.0/linux_amd64/terraform-provider-foo_1.1.0_linux_amd64.zip"
    async with serve_proxy(make_settings(policy_file=policy), client_ssl) as running:
        assert (await running.get(archive))[0] == 200
        policy.write_text(POLICY)
        running.app[GATEKEEPER].reload()  # what SIGHUP does
        before = len(registry.requests)
        status, _, body = await running.get(archive)
        assert status == 403 and json.loads(body)["rule"] == "foo-known-bad"
        assert registry.requests[before:] == []


async def test_modules_are_filtered_and_refused_by_their_rules(
    make_settings, client_ssl, tmp_path, registry, policy_file
):
    registry.static["net.tar.gz"] = module_tar_gz(MODULE_FILES)
    for version in ("1.0.0", "1.1.0"):
        registry.add_module(ModuleRelease("acme", "net", "aws", version, "{base}/static/net.tar.gz"))
    policy_file.write_text(
        f'[[rule]]\nname = "net-bad"\nmodules = ["{REGISTRY_HOST}/acme/net/*"]\nversions = ">= 1.1.0"\n'
        'action = "deny"\nreason = "unreviewed"\n'
    )
    modules = f"/registry/{REGISTRY_HOST}/modules/v1/acme/net/aws"
    async with serve_proxy(make_settings(policy_file=policy_file), client_ssl) as running:
        status, document = await running.json(f"{modules}/versions")
        assert status == 200 and [v["version"] for v in document["modules"][0]["versions"]] == ["1.0.0"]
        for path in (f"{modules}/1.1.0/download", f"{modules}/1.1.0/archive.tar.gz"):
            status, body = await running.json(path)
            assert status == 403 and (body["rule"], body["reason"]) == ("net-bad", "unreviewed")
        assert (await running.get(f"{modules}/1.0.0/download"))[0] in (200, 204)
    assert not [path for _, path in registry.requests if "1.1.0" in path]


async def test_rules_limited_by_scope_give_tokens_of_different_scopes_different_answers(
    make_settings, client_ssl, tmp_path, registry, signing_key, policy_file
):
    """A `scopes` rule applies to the token whose scope matches only: its list leaves out the new version and
    it is refused; the other token sees and gets every version."""
    registry.add(Release("acme", "foo", "1.0.1", signing_key))
    release, ops = "rpt_policy_scope_release_01", "rpt_policy_scope_ops_00002"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[tokens.release]\nhash = "{hash_token(release)}"\nhosts = ["{REGISTRY_HOST}"]\nnamespaces = ["acme"]\n'
        f'[tokens.ops]\nhash = "{hash_token(ops)}"\nhosts = ["{REGISTRY_HOST}"]\n'
    )
    policy_file.write_text(
        f'[[rule]]\nname = "release-pinned"\nproviders = ["*/acme/foo"]\nversions = ">= 1.1.0"\n'
        f'scopes = ["{REGISTRY_HOST}/acme"]\naction = "deny"\nreason = "release builds stay on 1.0"\n'
    )
    settings = make_settings(policy_file=policy_file, auth_tokens=tokens)
    async with serve_proxy(settings, client_ssl) as running:
        seen = {}
        for name, token in (("ops", ops), ("release", release), ("ops", ops)):  # ops' answers are remembered
            headers = {"Authorization": f"Bearer {token}"}
            async with running.session.get(running.url + f"{MIRROR}/foo/index.json", headers=headers) as response:
                assert response.status == 200
                seen[name] = set((await response.json(content_type=None))["versions"])
            status, _, body = await running.get(f"{MIRROR}/foo/1.1.0.json", headers=headers)
            seen.setdefault((name, "1.1.0"), set()).add((status, json.loads(body).get("rule")))
    assert seen["release"] == {"1.0.0", "1.0.1"}
    assert seen["ops"] == {"1.0.0", "1.0.1", "1.1.0"}
    assert seen["release", "1.1.0"] == {(403, "release-pinned")}
    assert seen["ops", "1.1.0"] == {(200, None)}


WARM_POLICY = f"""
[[rule]]
name = "unvetted"
providers = ["{REGISTRY_HOST}/acme/bravo"]
action = "deny"
reason = "namespace not approved (SEC-123)"

[[rule]]
name = "charlie-bad"
providers = ["{REGISTRY_HOST}/acme/charlie"]
versions = ">= 2.0.0"
action = "deny"
reason = "breaks IAM policies"

[[rule]]
name = "cooldown"
providers = ["{REGISTRY_HOST}/acme/echo"]
min-age = "72h"

[default]
action = "allow"
"""


def required_providers(constraints: dict[str, str]) -> str:
    entries = "".join(
        f'    {name} = {{\n      source  = "{REGISTRY_HOST}/acme/{name}"\n      version = "{version}"\n    }}\n'
        for name, version in constraints.items()
    )
    return f"terraform {{\n  required_providers {{\n{entries}  }}\n}}\n"


async def test_warm_goes_on_past_refusals_and_lists_each_with_its_rule_and_reason(
    make_local_settings, client_ssl, registry, signing_key, ca_file, tmp_path
):
    for name, version in (("alpha", "1.0.0"), ("bravo", "1.0.0"), ("charlie", "1.0.0"), ("charlie", "2.0.0")):
        registry.add(Release("acme", name, version, signing_key))
    registry.add(Release("acme", "delta", "1.0.0", signing_key))
    policy = tmp_path / "warm-policy.toml"
    policy.write_text(WARM_POLICY)
    config = tmp_path / "config"
    config.mkdir()
    wanted = {"alpha": "~> 1.0", "bravo": "~> 1.0", "charlie": "~> 2.0", "delta": "~> 1.0", "echo": "~> 1.1"}
    (config / "main.tf").write_text(required_providers(wanted))
    registry.add(Release("acme", "echo", "1.0.0", signing_key))
    async with serve_proxy(make_local_settings(policy_file=policy), client_ssl) as running:
        assert (await running.json(f"{MIRROR}/echo/index.json"))[0] == 200  # listed: echo seen
        registry.add(Release("acme", "echo", "1.1.0", signing_key))  # then a new version, seen now: held back
        await running.app[MIRROR_SERVICE].provider_versions(
            ProviderAddr.parse(REGISTRY_HOST, "acme", "echo"), max_age=0
        )
        code, output = await registry_proxy_in_process(
            "warm", str(config), "--proxy", running.url, "--ca-file", str(ca_file), "--platform", "linux_amd64"
        )
    assert code == 1, output
    for name in ("alpha", "delta"):  # before and after the refusals: warmed
        assert registry.count(registry.archive_path(registry.releases[("acme", name)]["1.0.0"], "linux_amd64")) == 1
        assert f"provider {REGISTRY_HOST}/acme/{name} 1.0.0 linux_amd64: ok" in output
    assert "warm: 2 fetched" in output and "3 refused by policy" in output, output
    summary = output[output.index("refused by policy") :]
    assert f"refused provider {REGISTRY_HOST}/acme/bravo" in summary
    assert "rule unvetted: namespace not approved (SEC-123)" in summary
    assert f"refused provider {REGISTRY_HOST}/acme/charlie" in summary and "2.0.0" in summary
    assert "rule charlie-bad: breaks IAM policies" in summary
    assert f"refused provider {REGISTRY_HOST}/acme/echo 1.1.0: rule cooldown: " in summary
    assert not [p for p in upstream_paths(registry) if "bravo" in p or "charlie_2.0.0" in p or "echo_1.1.0" in p]
