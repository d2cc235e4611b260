"""The OIDC issuers file: parsing (every mistake named by issuer and key), and rules judging claims."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.identity.issuers import DEFAULT_ALGORITHMS, IssuersConfigError, claim_value, parse_issuers

GITHUB = """
[issuers.github]
url = "https://token.actions.githubusercontent.com"
audiences = ["https://proxy.example.com"]
leeway = "45s"

[[issuers.github.rules]]
name = "acme"
claims = { repository_owner = "acme" }
hosts = ["registry.terraform.io"]
namespaces = ["acme", "hashicorp"]

[[issuers.github.rules]]
name = "infra-main"
claims = { sub = "repo:acme/infra:ref:refs/heads/main" }
hosts = ["*"]
lock = true
"""

KUBERNETES = """
[issuers.cluster]
url = "https://kubernetes.default.svc.cluster.local"
jwks_url = "https://10.0.0.1:6443/openid/v1/jwks"
audiences = "https://proxy.example.com"
algorithms = ["RS256", "ES256"]

[[issuers.cluster.rules]]
claims = { "kubernetes.io/namespace" = "ci", "kubernetes.io/serviceaccount/name" = ["terraform", "tofu-*"] }
hosts = ["*"]
"""


def github_claims(**overrides):
    claims = {
        "iss": "https://token.actions.githubusercontent.com",
        "sub": "repo:acme/infra:ref:refs/heads/main",
        "repository_owner": "acme",
        "exp": 2_000_000_000,
    }
    return {**claims, **overrides}


def test_a_github_issuer_and_its_rules():
    book = parse_issuers(GITHUB)
    [github] = book.issuers
    assert book.enabled and book.by_url(github.url) is github and book.by_url(github.url + "/") is None
    assert github.audiences == ("https://proxy.example.com",) and github.leeway == 45
    assert github.algorithms == DEFAULT_ALGORITHMS and github.jwks_url is None
    assert github.discovery_url == "https://token.actions.githubusercontent.com/.well-known/openid-configuration"

    main = github.client("repo:acme/infra:ref:refs/heads/main", github_claims(), 2_000_000_000)
    assert main.identity.rules == ("acme", "infra-main") and main.expires == 2_000_000_000
    assert main.identity.claims == {"repository_owner": "acme", "sub": "repo:acme/infra:ref:refs/heads/main"}
    assert main.may_read("registry.example", "anything") and main.may_lock("registry.example", "x")
    assert main.identity.fields()["subject"] == "repo:acme/infra:ref:refs/heads/main"

    branch = github.client(
        "repo:acme/infra:ref:refs/heads/dev", github_claims(sub="repo:acme/infra:ref:refs/heads/dev"), 1
    )
    assert branch.identity.rules == ("acme",) and branch.identity.claims == {"repository_owner": "acme"}
    assert branch.may_read("registry.terraform.io", "acme") and branch.may_read("registry.terraform.io", "hashicorp")
    assert not branch.may_read("registry.terraform.io", "evil") and not branch.may_read("other.example", "acme")
    assert not branch.may_lock("registry.terraform.io", "acme") and not branch.metrics

    stranger = github.client("repo:evil/x:ref:refs/heads/main", github_claims(repository_owner="Acme", sub="x"), 1)
    assert stranger.scopes == () and not stranger.may_read("registry.terraform.io", "acme")  # case-sensitive


def test_kubernetes_nested_claims_and_lists():
    [cluster] = parse_issuers(KUBERNETES).issuers
    assert cluster.jwks_url == "https://10.0.0.1:6443/openid/v1/jwks" and cluster.algorithms == ("RS256", "ES256")
    claims = {
        "sub": "system:serviceaccount:ci:tofu-runner",
        "kubernetes.io": {"namespace": "ci", "serviceaccount": {"name": "tofu-runner"}},
    }
    client = cluster.client(claims["sub"], claims, 1)
    assert client.identity.rules == ("1",)
    assert client.identity.claims == {
        "kubernetes.io/namespace": "ci",
        "kubernetes.io/serviceaccount/name": "tofu-runner",
    }
    assert cluster.client("s", {**claims, "kubernetes.io": {"namespace": "prod"}}, 1).scopes == ()
    assert claim_value({"a/b": 1, "a": {"b": 2}}, "a/b") == 1  # a claim named with a slash wins over the path
    assert claim_value({"a": {"b": 2}}, "a/b") == 2 and claim_value({"a": 3}, "a/b") is None


def test_list_claims_match_on_an_item_and_only_matching_items_are_recorded():
    text = GITHUB.replace('claims = { repository_owner = "acme" }', 'claims = { groups = ["team-*"] }')
    [github] = parse_issuers(text).issuers
    client = github.client("s", github_claims(groups=["staff", "team-infra", 7], sub="s"), 1)
    assert client.identity.rules == ("acme",) and client.identity.claims == {"groups": ["team-infra"]}
    assert github.client("s", github_claims(groups="staff", sub="s"), 1).identity.rules == ()
    assert github.client("s", github_claims(groups={"team-x": True}, sub="s"), 1).identity.rules == ()


def test_a_grant_is_judged_again_by_the_rules_in_force():
    book = parse_issuers(GITHUB)
    client = book.grant_holder("github", "someone", {"repository_owner": "acme"}, 5)
    assert client is not None and client.may_read("registry.terraform.io", "acme") and client.expires == 5
    assert book.grant_holder("gitlab", "someone", {"repository_owner": "acme"}, 5) is None  # no such issuer now
    assert book.grant_holder("github", "someone", {"repository_owner": "other"}, 5) is None  # no rule grants it
    assert book.grant_holder("github", 3, {"repository_owner": "acme"}, 5) is None
    assert parse_issuers("").grant_holder("github", "s", {"repository_owner": "acme"}, 5) is None


def issuer(body: str, rules: str = '[[issuers.ci.rules]]\nclaims = { sub = "x" }\nhosts = ["*"]\n') -> str:
    return f'[issuers.ci]\nurl = "https://issuer.example"\naudiences = ["a"]\n{body}\n{rules}'


@pytest.mark.parametrize(
    "text, message",
    [
        ("[issuers.ci\n", "not valid TOML"),
        ("[other]\n", "unknown top-level keys"),
        ("issuers = 1", "must be a table"),
        ("[issuers.'c i']\n", "issuer name"),
        (issuer("colour = 'blue'"), "issuer 'ci': unknown keys ['colour']"),
        (
            '[issuers.ci]\nurl = "http://issuer.example"\naudiences = ["a"]',
            "issuer 'ci': `url` must be an https:// URL",
        ),
        ('[issuers.ci]\nurl = "https://u:p@issuer.example"\naudiences = ["a"]', "issuer 'ci': `url`"),
        ('[issuers.ci]\nurl = "https://issuer.example"', "issuer 'ci': `audiences` must list"),
        ('[issuers.ci]\nurl = "https://issuer.example"\naudiences = []', "issuer 'ci': `audiences`"),
        (issuer("jwks_url = 'http://x/keys'"), "issuer 'ci': `jwks_url`"),
        (issuer("algorithms = ['none']"), "issuer 'ci': `algorithms`: 'none' is never accepted"),
        (issuer("algorithms = ['HS256']"), "issuer 'ci': `algorithms`: 'HS256' is never accepted"),
        (issuer("algorithms = ['RS1']"), "issuer 'ci': `algorithms`: 'RS1' is not one of"),
        (issuer("algorithms = []"), "issuer 'ci': `algorithms` must list"),
        (issuer("leeway = '1h'"), "issuer 'ci': `leeway` must be a duration from 0s to 5m"),
        (issuer("leeway = 'soon'"), "issuer 'ci': `leeway`"),
        (issuer("leeway = -1"), "issuer 'ci': `leeway`"),
        (issuer("", "rules = 3"), "issuer 'ci': `rules` must be"),
        (issuer("", "[[issuers.ci.rules]]\nhosts = ['*']"), "issuer 'ci', rule '1': `claims` must name"),
        (issuer("", "[[issuers.ci.rules]]\nclaims = {}\n"), "issuer 'ci', rule '1': `claims` must name"),
        (
            issuer("", "[[issuers.ci.rules]]\nclaims = { sub = '*', aud = ['*'] }"),
            "issuer 'ci', rule '1': `claims` match anything",
        ),
        (
            issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'repo:[acme' }"),
            "rule '1': claim 'sub': 'repo:[acme' opens a `[`",
        ),
        (issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'a[!]' }"), "claim 'sub': 'a[!]' has an empty `[]`"),
        (issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 3 }"), "claim 'sub': give a glob"),
        (issuer("", "[[issuers.ci.rules]]\nclaims = { sub = '' }"), "claim 'sub': '' is not a glob"),
        (issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'x' }\nadmin = true"), "rule '1': unknown keys ['admin']"),
        (
            issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'x' }\nlock = 'yes'"),
            "rule '1': `lock` must be true or false",
        ),
        (issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'x' }\nhosts = 'x'"), "rule '1': `hosts` must be a list"),
        (
            issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'x' }\nhosts = ['*']\nnamespaces = ['acme/*']"),
            "rule '1': `namespaces`: 'acme/*' holds characters no namespace has (a namespace alone",
        ),
        (
            issuer("", "[[issuers.ci.rules]]\nclaims = { sub = 'x' }\nhosts = ['reg[istry']"),
            "`hosts`: 'reg[istry' opens",
        ),
        (issuer("", "[[issuers.ci.rules]]\nname = 'a b'\nclaims = { sub = 'x' }"), "rule 1: `name` must be"),
        (
            issuer(
                "",
                "[[issuers.ci.rules]]\nname = 'r'\nclaims = { sub = 'x' }\n"
                "[[issuers.ci.rules]]\nname = 'r'\nclaims = { sub = 'y' }",
            ),
            "issuer 'ci': two rules are named 'r'",
        ),
        (
            issuer("") + '[issuers.other]\nurl = "https://issuer.example"\naudiences = ["b"]',
            "`url` https://issuer.example is given to another issuer",
        ),
    ],
)
def test_every_mistake_is_named_by_issuer_and_key(text, message):
    with pytest.raises(IssuersConfigError, match=re.escape(message)):
        parse_issuers(text)


def test_an_empty_file_trusts_no_issuer():
    book = parse_issuers("")
    assert book.enabled and book.issuers == () and book.by_url("https://issuer.example") is None


def test_the_examples_of_the_docs_parse():
    text = (Path(__file__).parents[2] / "docs" / "oidc.md").read_text()
    examples = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(examples) >= 3
    for example in examples:
        assert parse_issuers(example).issuers
