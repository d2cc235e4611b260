"""The policy engine: parsing (the issue's example as written, clear errors) and decisions."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.domain.addresses import Version
from proxy.governance.policy import (
    MODULE,
    PROVIDER,
    WITHHELD_WARNING,
    Decision,
    Filtered,
    PolicyError,
    Subject,
    describe,
    parse_policy,
)

# The example of issue 20, as written.
EXAMPLE = """
mode = "enforce"                 # or "warn": decide and record, deny nothing

[[rule]]
name = "unvetted-namespace"
providers = ["registry.terraform.io/evilcorp/*"]
action = "deny"
reason = "namespace not approved (SEC-123)"

[[rule]]
name = "aws-known-bad"
providers = ["registry.terraform.io/hashicorp/aws"]
versions = "= 5.31.0"            # Terraform version-constraint syntax
action = "deny"
reason = "breaks IAM policies"

[[rule]]
name = "cooldown"
providers = ["*/*/*"]
modules = ["*/*/*/*"]
min-age = "72h"                  # versions younger than this are held back

[[rule]]
name = "platforms"
providers = ["*/*/*"]
platforms = ["linux_amd64", "linux_arm64", "darwin_arm64"]   # others are never fetched

[default]
action = "allow"
"""
HOUR = 3600.0
NOW = 1_800_000_000.0
OLD = NOW - 100 * HOUR


def provider(address: str, version: str | None = None, platform: str | None = None) -> Subject:
    return Subject(PROVIDER, address, Version.parse(version) if version else None, platform)


@pytest.fixture
def policy():
    return parse_policy(EXAMPLE, "policy.toml")


def test_the_example_denies_a_namespace_whatever_the_version(policy):
    decision = policy.decide(provider("registry.terraform.io/evilcorp/thing", "1.0.0"), published=OLD, now=NOW)
    assert (decision.denied, decision.rule, decision.reason) == (
        True,
        "unvetted-namespace",
        "namespace not approved (SEC-123)",
    )
    # Known from the address alone: nothing about it needs fetching.
    assert policy.decide_address(provider("registry.terraform.io/evilcorp/thing")).rule == "unvetted-namespace"


def test_the_example_denies_one_version_only(policy):
    bad = policy.decide(provider("registry.terraform.io/hashicorp/aws", "5.31.0"), published=OLD, now=NOW)
    good = policy.decide(provider("registry.terraform.io/hashicorp/aws", "5.30.0"), published=OLD, now=NOW)
    assert (bad.denied, bad.rule, bad.reason) == (True, "aws-known-bad", "breaks IAM policies")
    assert (good.denied, good.rule) == (False, "default")
    assert policy.decide_address(provider("registry.terraform.io/hashicorp/aws")) is None  # depends on the version


def test_the_example_holds_young_versions_back_until_they_are_old_enough(policy):
    subject = provider("registry.terraform.io/hashicorp/aws", "5.40.0")
    young = policy.decide(subject, published=NOW - 71 * HOUR, now=NOW)
    assert (young.denied, young.rule, young.until) == (True, "cooldown", NOW + HOUR)
    assert "72h" in young.reason and "available from" in young.reason
    assert not policy.decide(subject, published=NOW - 72 * HOUR, now=NOW).denied
    assert policy.needs_age(subject)
    module = Subject(MODULE, "registry.terraform.io/acme/net/aws", Version.parse("1.0.0"))
    assert policy.decide(module, published=NOW, now=NOW).rule == "cooldown"


def test_the_example_refuses_other_platforms_and_lists_ignore_platforms(policy):
    address = "registry.terraform.io/hashicorp/aws"
    refused = policy.decide(provider(address, "5.30.0", "windows_amd64"), published=OLD, now=NOW)
    assert (refused.denied, refused.rule) == (True, "platforms")
    assert not policy.decide(provider(address, "5.30.0", "linux_arm64"), published=OLD, now=NOW).denied
    assert not policy.decide(provider(address, "5.30.0"), published=OLD, now=NOW).denied


def test_warn_mode_decides_the_same_and_denies_nothing():
    warn = parse_policy(EXAMPLE.replace('mode = "enforce"', 'mode = "warn"'))
    decision = warn.decide(provider("registry.terraform.io/evilcorp/thing", "1.0.0"), published=OLD, now=NOW)
    assert (decision.allowed, decision.denied, decision.outcome, decision.rule) == (
        False,
        False,
        "would-deny",
        "unvetted-namespace",
    )


def test_an_allow_rule_first_exempts_from_later_rules_and_clients_limit_rules():
    policy = parse_policy(
        """
        [[rule]]
        name = "trusted"
        providers = ["*/acme/*"]
        clients = ["release-*"]
        action = "allow"
        [[rule]]
        name = "cooldown"
        providers = ["*/*/*"]
        min-age = "1d"
        [default]
        action = "deny"
        reason = "not vetted"
        """
    )
    subject = provider("example.com/acme/foo", "1.0.0")
    assert policy.decide(subject, "release-bot", published=NOW, now=NOW).rule == "trusted"
    assert policy.decide(subject, "ci", published=NOW, now=NOW).rule == "cooldown"
    assert not policy.needs_age(subject, "release-bot")
    last = policy.decide(subject, "ci", published=OLD, now=NOW)
    assert (last.denied, last.rule, last.reason) == (True, "default", "not vetted")


def test_scopes_limit_a_rule_to_clients_whose_scope_texts_match_and_key_the_memo():
    rule = '[[rule]]\nname = "acme-teams-only"\nproviders = ["*/acme/*"]\nscopes = ["example.com/acme*"]\n'
    policy = parse_policy(rule + 'action = "allow"\n[default]\naction = "deny"\n')
    subject = provider("example.com/acme/foo", "1.0.0")
    assert policy.decide(subject, "ci", scopes=("example.com/acme-infra",)).rule == "acme-teams-only"
    assert policy.decide(subject, "ci", scopes=("EXAMPLE.com/*",)).denied  # every namespace is not `acme*`
    assert policy.decide(subject, "ci").denied  # anonymous: no scope
    assert policy.decide_address(subject, "ci", ("other.org/acme",)).rule == "default"
    assert policy.names_scopes and not policy.names_clients
    assert policy.client_key("ci", ("a/b",)) == ("", ("a/b",))
    assert parse_policy('[[rule]]\nproviders = ["*/*/*"]\naction = "deny"\n').client_key("ci", ("a/b",)) == ("", ())
    assert list(describe(policy))[1] == "1. acme-teams-only: allow (some clients)"


def test_a_version_constraint_selects_pre_releases_by_order():
    policy = parse_policy('[[rule]]\nname = "old"\nproviders = ["*/*/*"]\nversions = "< 2.0.0"\naction = "deny"\n')
    assert policy.decide(provider("h/n/t", "2.0.0-beta1")).denied
    assert not policy.decide(provider("h/n/t", "2.0.0")).denied


def test_aliases_of_keys_mean_the_same():
    policy = parse_policy('[[rule]]\nname = "c"\nprovider = ["*/*/*"]\nmin_age = "1h"\nunknown_age = "allow"\n')
    assert policy.rules[0].min_age == HOUR and policy.rules[0].unknown_age == "allow"


def test_unknown_age_defaults_to_hold_and_describe_shows_it():
    policy = parse_policy('[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n')
    assert policy.rules[0].unknown_age == "hold"
    assert list(describe(policy))[1] == "1. cooldown: deny (min-age 72h, unknown-age hold)"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (
            '[[rule]]\nname = "r"\nproviders = ["*/*/*"]\naction = "deny"\ncolour = "red"\n',
            ("rule 'r' (#1)", "'colour'"),
        ),
        ('[[rule]]\nname = "r"\nproviders = ["*/*"]\naction = "deny"\n', ("rule 'r' (#1)", "'providers'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/[a/*"]\naction = "deny"\n', ("rule 'r' (#1)", "'providers'")),
        ('[[rule]]\nname = "r"\nmodules = ["*/*/*"]\naction = "deny"\n', ("rule 'r' (#1)", "'modules'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nversions = "~> 5.x"\naction = "deny"\n', ("'versions'",)),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nmin-age = "3 days"\n', ("rule 'r' (#1)", "'min-age'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nplatforms = ["linux"]\n', ("'platforms'",)),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\n', ("rule 'r' (#1)", "'action'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nmin-age = "1h"\naction = "allow"\n', ("'action'",)),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nmin-age = "1h"\nunknown-age = "old"\n', ("'unknown-age'",)),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\naction = "deny"\nunknown-age = "hold"\n', ("'unknown-age'",)),
        ('[[rule]]\nname = "r"\naction = "deny"\n', ("rule 'r' (#1)", "'providers' or 'modules'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nscopes = ["acme"]\naction = "deny"\n', ("rule 'r'", "'scopes'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nscopes = ["h/[a"]\naction = "deny"\n', ("rule 'r'", "'scopes'")),
        ('[[rule]]\nname = "r"\nproviders = ["*/*/*"]\nscopes = []\naction = "deny"\n', ("rule 'r'", "'scopes'")),
        ('mode = "loud"\n', ("'mode'",)),
        ('[default]\naction = "maybe"\n', ("[default]", "'action'")),
        ('[defaults]\naction = "deny"\n', ("'defaults'",)),
        ("[[rule]\n", ("not valid TOML",)),
    ],
)
def test_bad_policy_files_give_one_line_naming_file_rule_and_key(text, names):
    with pytest.raises(PolicyError) as raised:
        parse_policy(text, "/etc/registry-proxy/policy.toml")
    message = str(raised.value)
    assert message.startswith("/etc/registry-proxy/policy.toml: ")
    assert "\n" not in message
    for name in names:
        assert name in message


def test_rule_names_are_unique():
    text = '[[rule]]\nname = "r"\nproviders = ["*/*/*"]\naction = "deny"\n' * 2
    with pytest.raises(PolicyError, match="another rule has this name"):
        parse_policy(text)


def test_describe_lists_the_rules_in_order(policy):
    lines = list(describe(policy))
    assert lines[1].startswith("1. unvetted-namespace: deny") and lines[-1] == "default: allow"


def test_a_withheld_versions_warning_reads_back_with_its_rule_and_reason():
    held = Decision(False, "cool-down.v2", "younger than 72h: released at 2030-01-01T00:00:00Z", until=1.0)
    filtered = Filtered(frozenset(), ((Version.parse("1.2.0"), held),), 1.0)
    [warning] = filtered.warnings("registry.terraform.io/acme/foo")
    found = WITHHELD_WARNING.match(warning)
    assert found is not None
    assert found.group("address", "version", "rule") == ("registry.terraform.io/acme/foo", "1.2.0", "cool-down.v2")
    assert found["reason"] == held.reason
    assert WITHHELD_WARNING.match("the upstream's own warning: 1.2.0 is deprecated") is None


def test_the_example_policy_of_docs_policy_md_parses_as_it_says() -> None:
    """The first policy in docs/policy.md is what a reader copies: it parses, with each key it shows in effect."""
    text = (Path(__file__).parents[2] / "docs" / "policy.md").read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    policy = parse_policy(example, "docs/policy.md")
    assert [rule.name for rule in policy.rules] == ["unvetted-namespace", "aws-known-bad", "cooldown", "platforms"]
    cooldown = policy.rules[2]
    assert cooldown.min_age == 72 * 3600 and cooldown.unknown_age == "hold"
    assert policy.keys.key_change == "warn" and policy.keys.default_pins
    assert [pin.name for pin in policy.keys.pins] == ["acme-releases"]
