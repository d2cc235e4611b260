"""Client tokens (parsing, hashing, constant-time matching, scopes), archive grants, upstream credentials."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import re

import pytest
from yarl import URL

from proxy.domain.credentials import (
    CredentialsError,
    UpstreamCredentials,
    acting_for,
    env_host,
    from_environment,
    merged,
    on_behalf_of,
    parse_cli_config,
)
from proxy.errors import GrantExpiredError, GrantInvalidError, GrantRevokedError
from proxy.identity.grant_cipher import create_grants
from proxy.identity.issuers import parse_issuers
from proxy.identity.tokens import (
    GRANT_LIFETIME,
    GRANT_STEP,
    AuthConfigError,
    Grants,
    Identity,
    OidcClient,
    Scope,
    bearer_token,
    hash_token,
    new_token,
    parse_tokens,
    token_entry,
    with_grant,
)

CI, READER = "rpt_ci-token", "rpt_reader-token"
TOKENS = (
    token_entry("ci", CI, ["*"], lock=True)
    + "\n"
    + token_entry("reader", READER, ["registry.terraform.io", "*.corp.example"], ["acme", "team-*"])
)


def test_tokens_are_found_by_their_hash_and_carry_their_scope():
    book = parse_tokens(TOKENS)
    assert book.enabled
    ci, reader = book.authenticate(CI), book.authenticate(READER)
    assert (ci.name, ci.lock, ci.metrics) == ("ci", True, False)
    assert ci.may_read("anything.example", "whatever")
    assert reader.name == "reader" and not reader.lock
    assert reader.may_read("registry.terraform.io", "acme")
    assert reader.may_read("git.corp.example", "team-blue")
    assert not reader.may_read("registry.terraform.io", "hashicorp")
    assert not reader.may_read("registry.opentofu.org", "acme")
    assert not reader.may_read("corp.example.evil", "acme")
    assert book.authenticate("rpt_unknown") is None
    assert book.authenticate(CI + " ") is None
    assert book.authenticate(hash_token(CI)) is None  # the stored hash is not a token


def test_the_file_holds_no_token_and_an_empty_file_refuses_everyone():
    assert CI not in TOKENS
    book = parse_tokens("")
    assert book.enabled and book.authenticate(CI) is None


@pytest.mark.parametrize(
    "text, message",
    [
        ("[tokens.a]\nhash = 'sha256:abc'\nhosts = ['*']", "hash"),
        ("[tokens.a]\nhash = 'md5:" + "0" * 64 + "'", "hash"),
        (f"[tokens.a]\nhash = '{hash_token('x')}'\nhosts = 'x'", "hosts"),
        (f"[tokens.a]\nhash = '{hash_token('x')}'\nlock = 'yes'", "lock"),
        (f"[tokens.a]\nhash = '{hash_token('x')}'\nscopes = []", "unknown keys"),
        (f"[tokens.a]\nhash = '{hash_token('x')}'\n[tokens.b]\nhash = '{hash_token('x')}'", "twice"),
        ("tokens = 3", "table"),
        ("[other]\n", "top-level"),
        ("[tokens.a\n", "TOML"),
        (f"[tokens.'a b']\nhash = '{hash_token('x')}'", "token name"),
    ],
)
def test_malformed_files_are_refused_naming_the_problem(text, message):
    with pytest.raises(AuthConfigError, match=message):
        parse_tokens(text)


def test_token_new_makes_an_entry_that_parses_back():
    token = new_token()
    assert token.startswith("rpt_") and len(token) > 40 and token != new_token()
    entry = token_entry("deploy@ci", token, ["registry.terraform.io"], ["acme"], lock=True)
    assert token not in entry
    found = parse_tokens(entry).authenticate(token)
    assert found.name == "deploy@ci" and found.lock and found.namespaces == ("acme",)


@pytest.mark.parametrize(
    "header, token",
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        (None, None),
        ("", None),
    ],
)
def test_bearer_header(header, token):
    assert bearer_token(header) == token


ARCHIVE_PATH = "/mirror/v1/private.example/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"


def two_tokens():
    book = parse_tokens(
        f'[tokens.a]\nhash = "{hash_token("rpt_a")}"\nhosts = ["*"]\n'
        f'[tokens.b]\nhash = "{hash_token("rpt_b")}"\nhosts = ["*"]\n'
    )
    return book.tokens


def test_a_grant_is_for_one_path_one_token_and_its_lifetime():
    grants, now = create_grants(b"k" * 32), 1_000_000.0
    a, b = two_tokens()
    holders = {grants.token_id(a): a, grants.token_id(b): b}
    expires = Grants.expiry(now)
    assert now + GRANT_LIFETIME <= expires < now + GRANT_LIFETIME + GRANT_STEP and expires % GRANT_STEP == 0
    grant = grants.sign(ARCHIVE_PATH, a, expires)
    assert grants.holder(ARCHIVE_PATH, grant, now, holders) is a
    assert grants.holder(ARCHIVE_PATH, grant, expires, holders) is a  # valid through its expiry second
    with pytest.raises(GrantExpiredError):
        grants.holder(ARCHIVE_PATH, grant, expires + 1, holders)
    for other in (
        ARCHIVE_PATH.replace("/foo/", "/big/").replace("-foo_", "-big_"),
        ARCHIVE_PATH.replace("1.0.0", "1.1.0"),
        ARCHIVE_PATH.replace("linux_amd64", "darwin_arm64"),
        ARCHIVE_PATH.replace("private.example", "public.example"),
    ):
        with pytest.raises(GrantInvalidError):
            grants.holder(other, grant, now, holders)
    with pytest.raises(GrantRevokedError):  # its token is not in force (removed from the tokens file)
        grants.holder(ARCHIVE_PATH, grant, now, {grants.token_id(b): b})
    expires_text, token_id, mac = grant.split(".")
    forged = [
        f"{int(expires_text) + GRANT_STEP}.{token_id}.{mac}",  # a longer life
        f"{expires_text}.{grants.token_id(b)}.{mac}",  # another token's
        "garbage",
        f"{expires_text}.{token_id}",
        f"{expires_text}.nothex0000000000.{mac}",
    ]
    for bad in forged:
        with pytest.raises((GrantInvalidError, GrantRevokedError)):
            grants.holder(ARCHIVE_PATH, bad, now, holders)
    other_fleet = create_grants(b"x" * 32)  # another key (another fleet's secret), the same token
    with pytest.raises((GrantInvalidError, GrantRevokedError)):
        other_fleet.holder(ARCHIVE_PATH, grant, now, {other_fleet.token_id(a): a})
    with pytest.raises(GrantInvalidError):
        other_fleet.holder(ARCHIVE_PATH, grant, now, {token_id: a})
    assert grants.token_id(a) != grants.token_id(b) and grants.token_id(a) != create_grants(b"x" * 32).token_id(a)


def oidc_book():
    return parse_issuers(
        '[issuers.github]\nurl = "https://issuer.example"\naudiences = ["a"]\n'
        '[[issuers.github.rules]]\nclaims = { repository_owner = "acme" }\nhosts = ["*"]\nnamespaces = ["acme"]\n'
    )


def test_an_oidc_clients_grant_is_bound_to_its_identity_and_dies_with_its_token():
    grants, now, book = create_grants(b"k" * 32), 1_000_000.0, oidc_book()
    [github] = book.issuers
    claims = {"sub": "repo:acme/infra:ref:refs/heads/main", "repository_owner": "acme"}
    client = github.client(claims["sub"], claims, int(now) + 120)  # its token expires in two minutes
    expires = Grants.expiry(now, client)
    assert expires == int(now) + 120 < Grants.expiry(now)  # never after the token
    grant = grants.sign(ARCHIVE_PATH, client, expires)
    holder = grants.holder(ARCHIVE_PATH, grant, now, {}, book.grant_holder)
    assert holder.identity == client.identity and holder.may_read("private.example", "acme")
    assert grants.holder_id(client) != grants.holder_id(github.client("other", claims, 1))
    with pytest.raises(GrantExpiredError):
        grants.holder(ARCHIVE_PATH, grant, expires + 1, {}, book.grant_holder)
    with pytest.raises(GrantInvalidError):
        grants.holder(ARCHIVE_PATH.replace("1.0.0", "1.1.0"), grant, now, {}, book.grant_holder)
    expires_text, sealed = grant.split(".")
    flipped = sealed[:10] + ("A" if sealed[10] != "A" else "B") + sealed[11:]
    for forged in (
        f"{int(expires_text) + 60}.{sealed}",  # a longer life
        f"{expires_text}.{flipped}",  # one character changed
        f"{expires_text}.{sealed[:-2]}",  # cut short
        f"{expires_text}.{sealed}!",
        f"{expires_text}.{sealed}.{sealed}",
        f"{expires_text}.",
        create_grants(b"x" * 32).sign(ARCHIVE_PATH, client, expires),  # another fleet's
    ):
        with pytest.raises(GrantInvalidError):
            grants.holder(ARCHIVE_PATH, forged, now, {}, book.grant_holder)
    with pytest.raises(GrantRevokedError):  # the issuer removed from the file
        grants.holder(ARCHIVE_PATH, grant, now, {}, parse_issuers("").grant_holder)
    narrowed = parse_issuers(
        '[issuers.github]\nurl = "https://issuer.example"\naudiences = ["a"]\n'
        '[[issuers.github.rules]]\nclaims = { repository_owner = "other" }\nhosts = ["*"]\n'
    )
    with pytest.raises(GrantRevokedError):  # no rule grants its claims anything now
        grants.holder(ARCHIVE_PATH, grant, now, {}, narrowed.grant_holder)
    with pytest.raises(GrantRevokedError):  # a check without issuers
        grants.holder(ARCHIVE_PATH, grant, now, {})


def readable_texts(grant: str) -> str:
    """Everything one can read of a grant: its text, and each of its parts decoded as base64 (either alphabet)."""
    texts = [grant]
    for part in re.split(r"[.?&=]", grant):
        for decode in (base64.urlsafe_b64decode, base64.b64decode):
            with contextlib.suppress(ValueError, binascii.Error):
                texts.append(decode(part + "=" * (-len(part) % 4)).decode("latin-1"))
    return "\n".join(texts)


def test_an_oidc_clients_grant_reveals_nothing_of_its_identity():
    grants, now, book = create_grants(b"k" * 32), 1_000_000.0, oidc_book()
    [github] = book.issuers
    claims = {"sub": "repo:acme/infra:ref:refs/heads/main", "repository_owner": "acme", "ref": "refs/heads/main"}
    client = github.client(claims["sub"], claims, int(now) + 120)
    grant = grants.sign(ARCHIVE_PATH, client, Grants.expiry(now, client))
    shown = readable_texts(grant)
    for text in ("repo:acme", "infra", "acme", "repository_owner", "github", "refs/heads"):
        assert text not in shown, (text, grant)
    assert grants.holder(ARCHIVE_PATH, grant, now, {}, book.grant_holder).identity == client.identity
    # the same client, path and expiry: the same grant (the documents rendered for a client stay the same)
    assert grants.sign(ARCHIVE_PATH, client, Grants.expiry(now, client)) == grant
    assert "acme" not in grants.holder_id(client) and "github" not in grants.holder_id(client)


def test_a_grant_goes_after_a_module_subdirectory():
    assert with_grant("/a/archive.tar.gz//modules/x", "G") == "/a/archive.tar.gz//modules/x?grant=G"
    assert with_grant("1.0.0/linux_amd64/p.zip", "G") == "1.0.0/linux_amd64/p.zip?grant=G"
    assert with_grant("/a?ref=v1", "G") == "/a?grant=G&ref=v1"


# ---- upstream credentials ----------------------------------------------------------------------


def test_tf_token_variables_decode_like_the_clients():
    assert env_host("TF_TOKEN_app_terraform_io") == "app.terraform.io"
    assert env_host("TF_TOKEN_my__registry_example_com") == "my-registry.example.com"
    assert env_host("TF_TOKEN_xn____caf__dma_fr") == "xn--caf-dma.fr"
    assert env_host("TF_TOKEN_café_fr") == "xn--caf-dma.fr"
    assert from_environment(
        {"TF_TOKEN_a_example": "t", "PATH": "/bin", "TF_TOKEN_": "x", "TF_TOKEN_b_example": ""}
    ) == {"a.example": "t"}


def test_credentials_blocks_of_a_cli_config():
    text = """
    credentials "app.terraform.io" {
      token = "abc.def"
    }
    credentials "Café.fr:8443" { token = "x" }
    provider_installation {
      direct {}
    }
    """
    assert parse_cli_config(text) == {"app.terraform.io": "abc.def", "xn--caf-dma.fr:8443": "x"}
    with pytest.raises(CredentialsError, match="token"):
        parse_cli_config('credentials "a.example" { user = "x" }')
    with pytest.raises(CredentialsError, match="HCL"):
        parse_cli_config('credentials "a.example" {')
    assert merged({"a.example": "file"}, {"a.example": "env"}) == {"a.example": "env"}


def test_a_token_goes_only_to_its_own_origin_and_only_for_its_own_host():
    creds = UpstreamCredentials(
        {"private.example": "T", "mapped.example": "M"}, {"mapped.example": URL("https://127.0.0.1:9000")}
    )
    assert creds.private_hosts == {"private.example", "mapped.example"}
    assert creds.token_for(URL("https://private.example/v1/")) is None  # no request acts for it
    with on_behalf_of("private.example"):
        assert creds.token_for(URL("https://private.example/v1/providers/")) == "T"
        assert creds.token_for(URL("https://PRIVATE.example:443/x")) == "T"
        assert creds.token_for(URL("https://private.example:8443/x")) is None
        assert creds.token_for(URL("https://cdn.example/file.zip")) is None
        assert creds.token_for(URL("https://127.0.0.1:9000/x")) is None
    with on_behalf_of("mapped.example"):
        assert creds.token_for(URL("https://127.0.0.1:9000/.well-known/terraform.json")) == "M"
        assert creds.token_for(URL("https://127.0.0.1:9001/x")) is None
        assert creds.token_for(URL("https://private.example/x")) is None
    with on_behalf_of("public.example"):  # a public registry's documents pointing at the private host
        assert creds.token_for(URL("https://private.example/file.zip")) is None
    assert acting_for.get() is None


async def test_tasks_started_for_a_request_act_for_its_host():
    creds = UpstreamCredentials({"private.example": "T"})
    with on_behalf_of("private.example"):
        task = asyncio.create_task(asyncio.sleep(0, creds.token_for(URL("https://private.example/x"))))
    assert await task == "T"


def test_upstream_requests_for_a_private_host_are_counted_under_its_name_only():
    creds = UpstreamCredentials({"private.example": "T"}, {"private.example": URL("https://10.1.2.3:9000")})
    assert creds.counted_as(URL("https://cdn.example/file.zip")) == "cdn.example"
    with on_behalf_of("private.example"):  # its origin and its CDN are never named
        assert creds.counted_as(URL("https://10.1.2.3:9000/v1/")) == "private.example"
        assert creds.counted_as(URL("https://cdn.example/file.zip")) == "private.example"
    with on_behalf_of("public.example"):
        assert creds.counted_as(URL("https://cdn.example/file.zip")) == "cdn.example"


def test_scope_texts_name_each_host_and_namespace_for_the_policys_scopes_globs():
    assert Scope(("registry.terraform.io", "*.corp"), ("acme", "ops-*")).texts() == (
        "registry.terraform.io/acme",
        "registry.terraform.io/ops-*",
        "*.corp/acme",
        "*.corp/ops-*",
    )
    assert Scope(("registry.terraform.io",)).texts() == ("registry.terraform.io/*",)
    oidc = OidcClient(Identity("oidc", "repo:x", "gh"), (Scope(("a",), ("n",)), Scope(("a",), ("n", "m"))), 0)
    assert oidc.scope_texts == ("a/n", "a/m")


def test_token_new_prints_only_what_the_tokens_file_accepts() -> None:
    """The entry's hosts and namespaces are read by the tokens file's parser (`serve` refused a URL later)."""
    entry = token_entry("ci", CI, ["Registry.Terraform.io", "*.corp.example"], ["Acme"])
    (token,) = parse_tokens(entry).tokens
    assert (token.hosts, token.namespaces) == (("registry.terraform.io", "*.corp.example"), ("acme",))
    for hosts, namespaces, flag in (
        (["https://registry.example.com/"], None, "--hosts"),
        (["registry.example.com"], ["acme/net"], "--namespaces"),
    ):
        with pytest.raises(AuthConfigError, match=f"^token new: {flag}: ") as refused:
            token_entry("ci", CI, hosts, namespaces)
        assert "holds characters no" in str(refused.value)
    with pytest.raises(AuthConfigError, match="a hostname or glob, not a URL"):
        token_entry("ci", CI, ["https://registry.example.com/"])
