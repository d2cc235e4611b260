"""Minimum release age from the upstream's own publish times, through the real application and the fake HTTPS
registry: the public registry API's `published_at` (asked once per version, only for a version a client asks
for), the SHA256SUMS's `Last-Modified` (no extra request), an injected clock."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from proxy.domain.addresses import ModuleAddr
from proxy.web.app_keys import GATEKEEPER
from tests.conftest import serve_proxy
from tests.fakes.packages import MODULE_FILES, Release, module_tar_gz
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.registry import Fault, ModuleRelease
from tests.integration.test_policy_http import (
    FOO,
    MIRROR,
    POLICY,
    REGISTRY,
    TERRAFORM,
    Clock,
    audit_events,
    baseline,
    upstream_paths,
)

pytestmark = pytest.mark.one_metadata_store

HOUR = 3600.0


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def per_version_requests(registry, version: str) -> list[str]:
    """The requests to the public registry API's per-version documents for `version`."""
    return [p for p in upstream_paths(registry) if p.startswith("/v1/") and p.endswith(f"/{version}")]


@pytest.fixture
async def dated(make_settings, client_ssl, tmp_path, registry, signing_key):
    """A proxy with the cooldown policy (72h) and an injected clock, before the registry lists 1.3.0 (published
    an hour ago by the registry API), 1.0.1 (published 100 days ago) and 1.4.0 (no date in the API; its
    SHA256SUMS last modified an hour ago); an operator baselined the versions listed (old on purpose: a publish
    time still counts)."""
    clock = Clock()
    registry.add(Release("acme", "foo", "1.0.1", signing_key))
    registry.add(Release("acme", "foo", "1.3.0", signing_key))
    registry.add(Release("acme", "foo", "1.4.0", signing_key))
    registry.published_at[("acme", "foo", "1.3.0")] = iso(clock.now - HOUR)
    registry.published_at[("acme", "foo", "1.0.1")] = iso(clock.now - 100 * 24 * HOUR)
    registry.sums_last_modified[("acme", "foo", "1.4.0")] = format_datetime(
        datetime.fromtimestamp(clock.now - HOUR, UTC), usegmt=True
    )
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    audit = tmp_path / "audit.jsonl"
    async with serve_proxy(make_settings(policy_file=policy, audit_log=str(audit)), client_ssl) as running:
        gate = running.app[GATEKEEPER]
        gate.clock = gate.first_seen.clock = clock
        await baseline(running, FOO, "1.0.0", "1.0.1", "1.3.0", "1.4.0")
        running.clock, running.audit = clock, audit
        yield running


async def test_a_version_the_registry_api_says_is_young_is_held_back_with_its_time_asked_once(dated, registry):
    status, index = await dated.json(f"{MIRROR}/foo/index.json")
    assert status == 200 and set(index["versions"]) == {"1.0.0", "1.0.1", "1.3.0", "1.4.0"}  # nothing known yet
    assert (
        not [  # a list causes no per-version request
            p
            for p in upstream_paths(registry)
            if p.startswith("/v1/providers/acme/foo/") and not p.endswith("/versions")
        ]
    )
    for _ in range(2):
        status, body = await dated.json(f"{MIRROR}/foo/1.3.0.json")
        assert status == 403 and body["code"] == "policy_held_back" and body["rule"] == "cooldown"
        assert body["available_at"] == iso(dated.clock.now - HOUR + 72 * HOUR)
        assert "registry API's published_at" in body["reason"]
    assert per_version_requests(registry, "1.3.0") == ["/v1/providers/acme/foo/1.3.0"]  # once, then recorded
    assert not [p for p in upstream_paths(registry) if "1.3.0" in p and p != "/v1/providers/acme/foo/1.3.0"]
    status, index = await dated.json(f"{MIRROR}/foo/index.json")  # the list now uses the recorded time
    assert set(index["versions"]) == {"1.0.0", "1.0.1", "1.4.0"}
    status, _ = await dated.json(f"{MIRROR}/foo/1.0.1.json")  # published long ago: allowed
    assert status == 200 and per_version_requests(registry, "1.0.1") == ["/v1/providers/acme/foo/1.0.1"]
    dated.clock.now += 72 * HOUR
    status, _ = await dated.json(f"{MIRROR}/foo/1.3.0.json")
    assert status == 200 and len(per_version_requests(registry, "1.3.0")) == 1
    held = [e for e in audit_events(dated.audit) if e["event"] == "denied" and e["artifact"].get("version") == "1.3.0"]
    assert held and held[0]["rule"] == "cooldown"


async def test_the_sha256sums_last_modified_holds_back_the_version_before_its_archive_is_fetched(dated, registry):
    status, refusal = await dated.json(f"{MIRROR}/foo/1.4.0.json")  # no date yet: its SHA256SUMS is fetched
    assert status == 403 and refusal["code"] == "policy_held_back"
    assert refusal["available_at"] == iso(dated.clock.now - HOUR + 72 * HOUR)
    assert "SHA256SUMS's Last-Modified" in refusal["reason"]
    archive = f"{MIRROR}/foo/1.4.0/linux_amd64/terraform-provider-foo_1.4.0_linux_amd64.zip"
    status, _, body = await dated.get(archive)
    assert status == 403 and json.loads(body)["code"] == "policy_held_back"
    assert not [p for p in upstream_paths(registry) if p.endswith(".zip")]  # the archive was never fetched
    assert per_version_requests(registry, "1.4.0") == ["/v1/providers/acme/foo/1.4.0"]
    dated.clock.now += 72 * HOUR
    status, _, _ = await dated.get(archive)
    assert status == 200


async def test_terraform_reads_a_last_modified_hold_in_the_status_line_of_the_sha256sums(dated, registry):
    """Registry mode: the SHA256SUMS whose fetch learned the date is refused, with the reason in its status line."""
    download = f"{REGISTRY}/foo/1.4.0/download/linux/amd64"
    status, _, body = await dated.get(download, headers=TERRAFORM)
    assert status == 200
    async with dated.session.get(dated.url + json.loads(body)["shasums_url"], headers=TERRAFORM) as response:
        assert response.status == 403
        assert response.reason.startswith("Denied by policy rule cooldown: 1.4.0 is younger than 72h")
        assert "Last-Modified" in response.reason
    assert not [p for p in upstream_paths(registry) if p.endswith(".zip")]


async def test_a_failing_malformed_or_future_published_at_is_no_date_or_counts_from_when_it_was_learned(
    dated, registry
):
    registry.published_at[("acme", "foo", "1.3.0")] = "last tuesday"  # malformed: no date, first-seen decides
    registry.published_at[("acme", "foo", "1.4.0")] = iso(dated.clock.now + 1000 * HOUR)  # in the future
    registry.faults["/v1/providers/acme/foo/1.0.1"] = Fault(status=500)  # failing: no date, never an error
    registry.sums_last_modified.clear()
    for version in ("1.3.0", "1.0.1"):
        status, _ = await dated.json(f"{MIRROR}/foo/{version}.json")
        assert status == 200  # baselined: old
    status, body = await dated.json(f"{MIRROR}/foo/1.4.0.json")
    assert status == 403 and body["available_at"] == iso(dated.clock.now + 72 * HOUR)  # not 1000h ahead


async def test_modules_are_held_back_by_their_published_at(make_settings, client_ssl, tmp_path, registry):
    clock = Clock()
    registry.static["net.tar.gz"] = module_tar_gz(MODULE_FILES)
    for version in ("1.0.0", "1.1.0"):
        registry.add_module(ModuleRelease("acme", "net", "aws", version, "{base}/static/net.tar.gz"))
    registry.published_at[("acme", "net", "aws", "1.1.0")] = iso(clock.now - 2 * HOUR)
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nname = "cooldown"\nmodules = ["*/*/*/*"]\nmin-age = "1d"\n')
    modules = f"/registry/{REGISTRY_HOST}/modules/v1/acme/net/aws"
    async with serve_proxy(make_settings(policy_file=policy), client_ssl) as running:
        gate = running.app[GATEKEEPER]
        gate.clock = gate.first_seen.clock = clock
        await baseline(running, ModuleAddr.parse(REGISTRY_HOST, "acme", "net", "aws"), "1.0.0", "1.1.0")
        status, document = await running.json(f"{modules}/versions")
        assert status == 200 and len(document["modules"][0]["versions"]) == 2
        status, body = await running.json(f"{modules}/1.1.0/download")
        assert status == 403 and body["available_at"] == iso(clock.now - 2 * HOUR + 24 * HOUR)
        assert (await running.get(f"{modules}/1.0.0/download"))[0] in (200, 204)
    assert per_version_requests(registry, "1.1.0") == ["/v1/modules/acme/net/aws/1.1.0"]
    assert not [p for p in upstream_paths(registry) if "1.1.0/download" in p or p.endswith("net.tar.gz")]


async def test_without_a_baseline_a_list_of_unknown_ages_is_decided_by_the_registry_apis_dates(
    make_settings, client_ssl, tmp_path, registry, signing_key
):
    """A fresh deployment (or a lost first-seen record): the ages of the versions listed are unknown, so the list
    asks the registry API for their dates (once for the fleet): dated long ago, listed; dated lately or not
    dated, held back, the undated with the unknown age named."""
    clock = Clock()
    registry.add(Release("acme", "foo", "1.3.0", signing_key))
    registry.published_at[("acme", "foo", "1.0.0")] = iso(clock.now - 100 * 24 * HOUR)
    registry.published_at[("acme", "foo", "1.3.0")] = iso(clock.now - HOUR)
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n')
    async with serve_proxy(make_settings(policy_file=policy), client_ssl) as running:
        gate = running.app[GATEKEEPER]
        gate.clock = gate.first_seen.clock = clock
        for _ in range(2):
            status, index = await running.json(f"{MIRROR}/foo/index.json")
            assert status == 200 and set(index["versions"]) == {"1.0.0"}
        for version in ("1.0.0", "1.1.0", "1.3.0"):
            assert per_version_requests(registry, version) == [f"/v1/providers/acme/foo/{version}"]  # once
        status, body = await running.json(f"{MIRROR}/foo/1.1.0.json")
        assert status == 403 and body["code"] == "policy_held_back"
        assert "its age is unknown" in body["reason"] and "registry-proxy policy baseline" in body["reason"]
        status, body = await running.json(f"{MIRROR}/foo/1.3.0.json")
        assert status == 403 and "registry API's published_at" in body["reason"]
        clock.now += 72 * HOUR  # listed for the min-age: old enough, whatever its age
        assert (await running.json(f"{MIRROR}/foo/1.1.0.json"))[0] == 200
