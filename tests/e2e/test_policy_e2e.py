"""`terraform init` through a proxy with a policy: constraints resolve to allowed versions (network mirror and
host blocks), denials show their reason in terraform's output (host blocks) or are refused and findable in
the audit trail (network mirror), and the upstream never sees a request for anything denied; a min-age hold by
the registry API's publish time (a real clock: the fake registry dates a version an hour ago)."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.conftest import PROVIDER
from tests.e2e.test_cooldown_state_loss_e2e import baseline
from tests.e2e.test_network_mirror_e2e import mirror_config, provider_tf
from tests.e2e.test_registry_e2e import host_config
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST

pytestmark = pytest.mark.e2e

POLICY = f"""
[[rule]]
name = "unvetted-namespace"
providers = ["{REGISTRY_HOST}/evilcorp/*"]
action = "deny"
reason = "namespace not approved (SEC-123)"

[[rule]]
name = "foo-known-bad"
providers = ["{REGISTRY_HOST}/acme/foo"]
versions = "= 1.1.0"
action = "deny"
reason = "breaks IAM policies"

[default]
action = "allow"
"""


def evil_tf() -> str:
    return (
        f'terraform {{\n  required_providers {{\n    thing = {{\n      source  = "{REGISTRY_HOST}/evilcorp/thing"\n'
        '      version = "~> 1.0"\n    }\n  }\n}\n'
    )


@pytest.fixture
async def policed_proxy(in_process_proxy, tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    audit = tmp_path / "audit.jsonl"
    proxy = await in_process_proxy("--policy", str(path), "--audit-log", str(audit))
    proxy.audit = audit
    return proxy


def said(output: str) -> str:
    return " ".join(output.split())  # terraform wraps its messages


def upstream_saw(registry, text: str) -> list[str]:
    return [path for _, path in registry.requests if text in path]


@pytest.mark.parametrize("mode", ["network_mirror", "host"])
async def test_a_constraint_resolves_to_the_newest_allowed_version(registry, policed_proxy, terraform, mode):
    config = mirror_config(policed_proxy) if mode == "network_mirror" else host_config(policed_proxy)
    code, output = await terraform.init(terraform.workdir("w", provider_tf("~> 1.0")), config, policed_proxy.ca_file)
    assert code == 0, output
    # Directly, `~> 1.0` selects 1.1.0 (the newest); the policy denies it.
    assert f"- Installed {REGISTRY_HOST}/acme/foo v1.0.0" in output, output
    assert upstream_saw(registry, "1.1.0") == []


async def test_registry_mode_shows_the_reason_of_a_denied_version_and_namespace(
    registry, signing_key, policed_proxy, terraform
):
    registry.add(Release("evilcorp", "thing", "1.0.0", signing_key))
    config = host_config(policed_proxy)
    code, output = await terraform.init(
        terraform.workdir("pinned", provider_tf("1.1.0")), config, policed_proxy.ca_file
    )
    assert code != 0
    assert "breaks IAM policies" in said(output) and "foo-known-bad" in said(output), output
    code, output = await terraform.init(terraform.workdir("evil", evil_tf()), config, policed_proxy.ca_file)
    assert code != 0
    assert "namespace not approved (SEC-123)" in said(output), output
    assert upstream_saw(registry, "evilcorp") == [] and upstream_saw(registry, "1.1.0") == []


async def test_mirror_mode_refuses_a_denied_version_and_the_audit_trail_says_why(registry, policed_proxy, terraform):
    config = mirror_config(policed_proxy)
    workdir = terraform.workdir("pinned", provider_tf("1.1.0"))
    code, output = await terraform.init(workdir, config, policed_proxy.ca_file)
    assert code != 0, output
    assert "- Installed" not in output
    assert upstream_saw(registry, "1.1.0") == []
    # A lock file pinning the denied version (written before the rule) gets the reason too.
    (workdir / ".terraform.lock.hcl").write_text(
        f'provider "{REGISTRY_HOST}/acme/foo" {{\n  version = "1.1.0"\n  constraints = "1.1.0"\n  hashes = []\n}}\n'
    )
    code, output = await terraform.init(workdir, config, policed_proxy.ca_file)
    assert code != 0
    events = [json.loads(line) for line in policed_proxy.audit.read_text().splitlines()]
    denials = [e for e in events if e["event"] == "denied"]
    assert {(e["artifact"]["version"], e["decision"], e["rule"], e["reason"]) for e in denials} == {
        ("1.1.0", "withheld", "foo-known-bad", "breaks IAM policies")
    }
    assert all(re.fullmatch(r"[0-9a-f]+", e["request_id"]) for e in denials)


@pytest.fixture
async def cooldown_proxy(in_process_proxy, tmp_path, registry, ca_file):
    """A proxy with a 72h cooldown whose operator baselined foo (1.0.0 and 1.1.0 old, on purpose), before the
    registry API says 1.1.0 was published an hour ago (a publish time still counts)."""
    an_hour_ago = time.gmtime(time.time() - 3600)
    registry.published_at[("acme", "foo", "1.1.0")] = time.strftime("%Y-%m-%dT%H:%M:%SZ", an_hour_ago)
    path = tmp_path / "policy.toml"
    path.write_text('[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n')
    proxy = await in_process_proxy("--policy", str(path))
    code, output = await baseline(registry, ca_file, proxy.data_dir, ("--policy", str(path)), PROVIDER, actor="ops")
    assert code == 0 and "2 versions recorded as old" in output, output
    return proxy


async def test_registry_mode_shows_a_hold_by_the_registry_apis_publish_time(registry, cooldown_proxy, terraform):
    config = host_config(cooldown_proxy)
    code, output = await terraform.init(terraform.workdir("w", provider_tf("~> 1.0")), config, cooldown_proxy.ca_file)
    assert code != 0  # the list did not know the date yet: terraform chose 1.1.0, and is told why it may not
    assert "cooldown: 1.1.0 is younger than 72h (age counted from: the registry API's published_at)" in said(output)
    assert upstream_saw(registry, "/v1/providers/acme/foo/1.1.0") == ["/v1/providers/acme/foo/1.1.0"]
    assert not [path for path in upstream_saw(registry, "1.1.0") if "/files/" in path]  # nothing of it fetched


async def test_mirror_mode_lists_leave_out_a_version_once_its_publish_time_is_known(
    registry, cooldown_proxy, terraform
):
    config = mirror_config(cooldown_proxy)
    workdir = terraform.workdir("w", provider_tf("~> 1.0"))
    code, output = await terraform.init(workdir, config, cooldown_proxy.ca_file)
    assert code != 0 and "- Installed" not in output  # 1.1.0 chosen from the list, then refused
    code, output = await terraform.init(workdir, config, cooldown_proxy.ca_file)
    assert code == 0 and f"- Installed {REGISTRY_HOST}/acme/foo v1.0.0" in output, output
    assert upstream_saw(registry, "/v1/providers/acme/foo/1.1.0") == ["/v1/providers/acme/foo/1.1.0"]
    assert not [path for path in upstream_saw(registry, "1.1.0") if "/files/" in path]
