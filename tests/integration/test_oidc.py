"""OIDC workload tokens through the real application, against a fake issuer over HTTPS (test CA) that mints
real RS256, ES256 and EdDSA tokens: sign-in, every refusal with its reason, scopes, grants, key rotation,
an issuer that goes down, the SSRF guard, static tokens alongside.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from proxy.identity.grant_cipher import create_grants
from proxy.identity.issuers import parse_issuers
from proxy.identity.oidc import FETCH_DEADLINE
from proxy.identity.tokens import GRANT_PARAM, grant_key, hash_token, with_grant
from proxy.web.access import ACCESS
from proxy.web.app_keys import METRICS
from tests.conftest import serve_proxy
from tests.fakes.oidc import AUDIENCE, SUBJECT, FakeIssuer
from tests.fakes.process import REGISTRY_HOST
from tests.fakes.redis_server import METADATA_SECRET
from tests.unit.test_tokens_and_grants import readable_texts

MIRROR = f"/mirror/v1/{REGISTRY_HOST}/acme/foo"
INDEX = f"{MIRROR}/index.json"
STATIC = "rpt_static_ci_token_0001"
DISCOVERY = "/.well-known/openid-configuration"


def issuers_toml(issuer: FakeIssuer, name: str = "ci", owner: str = "acme") -> str:
    return f"""
[issuers.{name}]
url = "{issuer.url}"
audiences = ["{AUDIENCE}"]
algorithms = ["RS256", "ES256", "EdDSA"]
leeway = "10s"

[[issuers.{name}.rules]]
name = "owner"
claims = {{ repository_owner = "{owner}" }}
hosts = ["{REGISTRY_HOST}"]
namespaces = ["{owner}"]

[[issuers.{name}.rules]]
name = "main"
claims = {{ repository_owner = "{owner}", ref = "refs/heads/main" }}
hosts = ["{REGISTRY_HOST}"]
namespaces = ["{owner}"]
lock = true
"""


def bearer(token: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {token}"}}


class Clock:
    """The key cache's clock, moved on by the test (the refresh interval is a minute)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
async def issuer(upstream_ssl) -> FakeIssuer:
    fake = FakeIssuer(upstream_ssl)
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
def issuers_file(tmp_path, issuer) -> Path:
    path = tmp_path / "issuers.toml"
    path.write_text(issuers_toml(issuer))
    return path


@pytest.fixture
def oidc_settings(make_local_settings, issuer, issuers_file):
    def make(**overrides):
        values = {"oidc_issuers": issuers_file, "allowed_private_hosts": frozenset({issuer.allow}), **overrides}
        return make_local_settings(**values)

    return make


def events(logs: list[dict], name: str) -> list[dict]:
    return [line for line in logs if line.get("event") == name]


async def test_a_ci_job_signs_in_with_its_oidc_token_and_downloads_through_its_grants(
    oidc_settings, client_ssl, issuer, registry
):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        with capture_logs() as logs:
            for alg in ("RS256", "ES256", "EdDSA"):
                status, _, body = await proxy.get(INDEX, **bearer(issuer.mint(alg)))
                assert status == 200, body
            token = issuer.mint()
            status, _, body = await proxy.get(f"{MIRROR}/1.0.0.json", **bearer(token))
            url = json.loads(body)["archives"]["linux_amd64"]["url"]
            assert status == 200 and "?grant=" in url
            status, _, data = await proxy.get(f"{MIRROR}/{url}")  # the clients send no token for archives
            assert (status, data) == (200, release.zips["linux_amd64"])
            status, _, body = await proxy.get(f"/lock/v1/{REGISTRY_HOST}/acme/foo/1.0.0", **bearer(token))
            assert status == 200, body  # the rule for main grants lock
        sample = proxy.app[METRICS].registry.get_sample_value
        assert sample("registry_proxy_oidc_tokens_total", {"issuer": "ci", "outcome": "accepted"}) == 5
        for rule in ("owner", "main"):  # the rules that granted access, by name (never a token or a subject)
            assert sample("registry_proxy_oidc_rule_matches_total", {"issuer": "ci", "rule": rule}) == 5
        assert sample("registry_proxy_oidc_key_fetches_total", {"issuer": "ci", "outcome": "ok"}) == 1
    # the keys were fetched once, for all three algorithms and every request
    assert (issuer.count(DISCOVERY), issuer.count("/keys")) == (1, 1)
    requests = events(logs, "request")
    assert len(requests) == 6
    for line in requests:
        client = line["client"]
        assert (client["kind"], client["subject"], client["issuer"]) == ("oidc", SUBJECT, "ci")
        assert client["claims"] == {"repository_owner": "acme", "ref": "refs/heads/main"}
        assert client["rules"] == ["owner", "main"]
    assert token not in str(logs) and token.split(".")[2] not in str(logs)


async def test_every_refused_token_gets_401_with_its_reason_in_the_answer_and_the_log(
    oidc_settings, client_ssl, issuer
):
    now = int(time.time())
    cases = [  # what, the token, the code of its 401, the reason in the log
        ("expired", issuer.mint(exp=now - 60, iat=now - 600, nbf=now - 600), "oidc_token_expired", "expired"),
        ("not yet valid", issuer.mint(nbf=now + 600, iat=now), "oidc_token_not_yet_valid", "not_yet_valid"),
        ("wrong audience", issuer.mint(aud="https://other.example"), "oidc_wrong_audience", "wrong_audience"),
        ("wrong issuer", issuer.mint(iss="https://evil.example"), "oidc_issuer_unknown", "unknown_issuer"),
        ("alg none", issuer.unsigned(), "oidc_algorithm_refused", "algorithm_refused"),
        (
            "HS256 keyed with the public key",
            issuer.hmac_with_public_key(),
            "oidc_algorithm_refused",
            "algorithm_refused",
        ),
        ("unknown kid", issuer.mint(kid="made-up-key"), "oidc_key_unknown", "unknown_key"),
        (
            "tampered payload",
            issuer.tampered(repository_owner="acme", sub="admin"),
            "oidc_signature_invalid",
            "bad_signature",
        ),
        ("no subject", issuer.mint(sub=None), "oidc_claims_invalid", "missing_claim"),
        ("not a JWT", "eyJhbGciOiJSUzI1NiJ9.bm90LWpzb24.c2ln", "oidc_token_malformed", "malformed"),
    ]
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200  # the keys are held
        for what, token, code, reason in cases:
            with capture_logs() as logs:
                status, headers, body = await proxy.get(INDEX, **bearer(token))
            document = json.loads(body)
            assert (status, document["code"]) == (401, code), (what, document)
            assert headers["WWW-Authenticate"] == 'Bearer realm="registry-proxy", error="invalid_token"'
            [refused] = events(logs, "auth.refused")
            assert (refused["reason"], refused["detail"] != "") == (f"oidc {reason}", True), (what, refused)
            assert token not in str(logs)
        sample = proxy.app[METRICS].registry.get_sample_value
        counted = {
            reason: sample("registry_proxy_oidc_tokens_total", {"issuer": "ci", "outcome": reason})
            for reason in ("expired", "wrong_audience", "unknown_key", "bad_signature")
        }
        assert counted == {"expired": 1, "wrong_audience": 1, "unknown_key": 1, "bad_signature": 1}
        assert sample("registry_proxy_oidc_tokens_total", {"issuer": "-", "outcome": "unknown_issuer"}) == 1
    # none of them made the proxy fetch the keys again (the unknown kid: they were fetched within the minute)
    assert issuer.count("/keys") == 1


async def test_a_valid_token_whose_claims_grant_nothing_there_gets_403(oidc_settings, client_ssl, issuer):
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        with capture_logs() as logs:
            status, _, body = await proxy.get(INDEX, **bearer(issuer.mint(repository_owner="someone-else")))
        assert (status, json.loads(body)["code"]) == (403, "token_scope")
        [refused] = events(logs, "auth.refused")
        assert refused["client"]["subject"] == SUBJECT and refused["client"]["rules"] == []
        token = issuer.mint()  # acme's, on main: acme's namespace, not hashicorp's
        status, _, body = await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/hashicorp/foo/index.json", **bearer(token))
        assert (status, json.loads(body)["code"]) == (403, "token_scope")
        branch = issuer.mint(ref="refs/heads/feature")  # the owner rule only: no lock
        assert (await proxy.get(INDEX, **bearer(branch)))[0] == 200
        status, _, body = await proxy.get(f"/lock/v1/{REGISTRY_HOST}/acme/foo/1.0.0", **bearer(branch))
        assert (status, json.loads(body)["code"]) == (403, "token_scope")


async def test_static_tokens_keep_working_alongside(oidc_settings, client_ssl, issuer, tmp_path):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens.ci]\nhash = "{hash_token(STATIC)}"\nhosts = ["*"]\n')
    async with serve_proxy(oidc_settings(auth_tokens=tokens), client_ssl) as proxy:
        assert (await proxy.get(INDEX, **bearer(STATIC)))[0] == 200
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200
        status, _, body = await proxy.get(INDEX, **bearer("rpt_unknown"))
        assert (status, json.loads(body)["code"]) == (401, "token_invalid")
        status, _, body = await proxy.get(INDEX)
        assert (status, json.loads(body)["code"]) == (401, "token_required")
    assert issuer.count("/keys") == 1  # a static token never reaches the issuer


async def test_a_rotated_key_is_picked_up_and_the_withdrawn_one_refused(oidc_settings, client_ssl, issuer):
    clock = Clock()
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        proxy.app[ACCESS].oidc.keys.clock = issuer.clock = clock
        old = issuer.mint()
        assert (await proxy.get(INDEX, **bearer(old)))[0] == 200
        issuer.rotate()
        clock.offset += 61  # the last fetch is more than a minute old
        new = issuer.mint()
        assert (await proxy.get(INDEX, **bearer(new)))[0] == 200
        assert issuer.count("/keys") == 2
        status, _, body = await proxy.get(INDEX, **bearer(old))  # signed by the withdrawn key
        assert (status, json.loads(body)["code"]) == (401, "oidc_key_unknown")
        assert issuer.count("/keys") == 2  # and no fetch for it within the minute


async def test_an_issuer_that_goes_down_leaves_its_keys_working_and_a_new_key_is_refused_cleanly(
    oidc_settings, client_ssl, issuer
):
    clock = Clock()
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        proxy.app[ACCESS].oidc.keys.clock = issuer.clock = clock
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200
        await issuer.stop()
        clock.offset += 20 * 60  # the keys are old enough to be fetched again (in the background): it fails
        for alg in ("RS256", "ES256"):
            assert (await proxy.get(INDEX, **bearer(issuer.mint(alg))))[0] == 200
        await proxy.app[ACCESS].oidc.keys.settled()  # the background fetch failed; the keys held stay
        issuer.rotate("ES256")
        clock.offset += 61
        started = time.monotonic()
        with capture_logs() as logs:
            status, headers, body = await proxy.get(INDEX, **bearer(issuer.mint("ES256")))
            again = await proxy.get(INDEX, **bearer(issuer.mint("ES256")))
        assert (status, json.loads(body)["code"]) == (503, "oidc_issuer_unavailable"), body
        assert "es256-2" in json.loads(body)["errors"][0] and headers["Retry-After"] == "60"
        assert (again[0], json.loads(again[2])["code"]) == (503, "oidc_issuer_unavailable")
        assert time.monotonic() - started < 8  # refused, not left waiting
        assert len(events(logs, "oidc.keys_fetch_failed")) == 1  # the second one did not try again
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200  # the held RS256 key still works
        await issuer.start()  # back, on the same port
        clock.offset += 61
        assert (await proxy.get(INDEX, **bearer(issuer.mint("ES256"))))[0] == 200


async def test_a_token_is_checked_once_a_minute_and_again_after_its_exp_a_reload_or_new_keys(
    oidc_settings, client_ssl, issuer, issuers_file
):
    clock = Clock()
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        access = proxy.app[ACCESS]
        access.oidc.keys.clock = issuer.clock = clock
        assert (await proxy.get(INDEX, **bearer(issuer.mint("ES256"))))[0] == 200  # the keys fetched
        clock.offset += 30
        token = issuer.mint()
        assert (await proxy.get(INDEX, **bearer(token)))[0] == 200
        issuer.rotate()  # its key withdrawn: the proxy does not know yet
        clock.offset += 31  # a minute after the fetch, half a minute after the token was checked
        assert (await proxy.get(INDEX, **bearer(token)))[0] == 200  # remembered, not checked again
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200  # a new kid: the keys fetched again
        status, _, body = await proxy.get(INDEX, **bearer(token))  # checked again with them: its key is gone
        assert (status, json.loads(body)["code"]) == (401, "oidc_key_unknown")

        token = issuer.mint(exp=int(clock()) + 30)
        assert (await proxy.get(INDEX, **bearer(token)))[0] == 200
        clock.offset += 41  # past its exp and the leeway (10s), within the minute
        status, _, body = await proxy.get(INDEX, **bearer(token))
        assert (status, json.loads(body)["code"]) == (401, "oidc_token_expired")

        token = issuer.mint()
        assert (await proxy.get(INDEX, **bearer(token)))[0] == 200
        issuers_file.write_text(issuers_toml(issuer, owner="someone-else"))
        access.reload()
        assert (await proxy.get(INDEX, **bearer(token)))[0] == 403  # judged by the rules now in force


async def test_keys_outlive_a_restart_with_the_issuer_down(make_settings, issuer, issuers_file, client_ssl):
    settings = make_settings(oidc_issuers=issuers_file, allowed_private_hosts=frozenset({issuer.allow}))
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200
    await issuer.stop()
    async with serve_proxy(settings, client_ssl) as proxy:  # another process of the fleet, or after a restart
        for alg in ("RS256", "EdDSA"):
            assert (await proxy.get(INDEX, **bearer(issuer.mint(alg))))[0] == 200
    assert issuer.count("/keys") == 1


async def test_an_issuer_on_a_private_address_is_fetched_only_when_the_operator_allows_it(
    oidc_settings, client_ssl, issuer
):
    async with serve_proxy(oidc_settings(allowed_private_hosts=frozenset()), client_ssl) as proxy:
        status, _, body = await proxy.get(INDEX, **bearer(issuer.mint()))
        document = json.loads(body)
        assert (status, document["code"]) == (503, "oidc_issuer_unavailable")
        assert "refused to fetch" in document["errors"][0]
    assert issuer.requests == []  # the SSRF guard refused the connection itself


async def test_keys_on_another_host_than_the_issuers_are_not_fetched(oidc_settings, client_ssl, issuer):
    issuer.discovery_overrides["jwks_uri"] = f"https://localhost:{issuer.port}/keys"
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        status, _, body = await proxy.get(INDEX, **bearer(issuer.mint()))
        document = json.loads(body)
        assert (status, document["code"]) == (503, "oidc_issuer_unavailable")
        assert "puts its keys on another host" in document["errors"][0]
    assert issuer.count("/keys") == 0
    issuer.discovery_overrides["issuer"] = "https://evil.example"
    del issuer.discovery_overrides["jwks_uri"]
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        status, _, body = await proxy.get(INDEX, **bearer(issuer.mint()))
        assert status == 503 and "names the issuer 'https://evil.example'" in json.loads(body)["errors"][0]


async def test_a_grant_dies_when_its_issuer_is_removed_and_never_outlives_the_token(
    oidc_settings, client_ssl, issuer, issuers_file, registry
):
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        exp = int(time.time()) + 90
        _, _, body = await proxy.get(f"{MIRROR}/1.0.0.json", **bearer(issuer.mint(exp=exp)))
        url = json.loads(body)["archives"]["linux_amd64"]["url"]
        assert int(url.partition("grant=")[2].partition(".")[0]) == exp  # not ten minutes: the token's exp
        assert (await proxy.get(f"{MIRROR}/{url}"))[0] == 200
        issuers_file.write_text(issuers_toml(issuer, name="other", owner="someone-else"))
        proxy.app[ACCESS].reload()
        status, _, body = await proxy.get(f"{MIRROR}/{url}")
        assert (status, json.loads(body)["code"]) == (401, "grant_revoked")
        status, _, body = await proxy.get(INDEX, **bearer(issuer.mint()))  # its tokens: issuer `other`, no rule
        assert (status, json.loads(body)["code"]) == (403, "token_scope")


async def test_a_reload_of_a_file_that_is_not_text_keeps_the_issuers(oidc_settings, client_ssl, issuer, issuers_file):
    async with serve_proxy(oidc_settings(), client_ssl) as proxy:
        issuers_file.write_bytes(b"\xff\xfe[issuers.x]")
        with capture_logs() as logs:
            proxy.app[ACCESS].reload()
        [failed] = events(logs, "oidc.reload_failed")
        assert "utf-8" in failed["error"] and failed["effect"] == "the previous issuers and rules stay"
        assert (await proxy.get(INDEX, **bearer(issuer.mint())))[0] == 200


@pytest.fixture
def hanging_issuer() -> Iterator[str]:
    """An issuer URL whose port accepts connections (the kernel completes the handshake) and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"


async def test_a_hanging_issuer_gets_a_503_within_the_request_deadline(
    make_local_settings, client_ssl, issuer, tmp_path, hanging_issuer
):
    request_deadline = 2.0  # scaled down from the default 8 s (Terraform gives up at 10 s)
    path = tmp_path / "hanging.toml"
    path.write_text(issuers_toml(issuer).replace(issuer.url, hanging_issuer))
    port = hanging_issuer.rpartition(":")[2]
    settings = make_local_settings(
        oidc_issuers=path,
        allowed_private_hosts=frozenset({f"127.0.0.1:{port}"}),
        request_deadline=request_deadline,
        stale_deadline=min(2.0, request_deadline),
    )
    token = issuer.mint(iss=hanging_issuer, kid="never-seen")
    async with serve_proxy(settings, client_ssl) as proxy:
        with capture_logs() as logs:
            started = time.monotonic()
            status, _, body = await proxy.get(INDEX, **bearer(token))
            took = time.monotonic() - started
            await proxy.app[ACCESS].oidc.keys.settled()
    assert (status, json.loads(body)["code"]) == (503, "oidc_issuer_unavailable"), body
    # the discovery document and the key set share one deadline: the request's (a margin for a loaded machine)
    assert took < request_deadline + 1.5, took
    assert f"within the {request_deadline:g}s request deadline" in json.loads(body)["errors"][0]
    # and the fetch itself gave up at that deadline too (not the upstream timeout's 30 s), logged at warning
    [failed] = events(logs, "oidc.keys_fetch_failed")
    assert failed["log_level"] == "warning" and f"did not answer within {request_deadline:g}s" in failed["error"]
    # with the defaults the bound is 8 s, before Terraform's client gives up (10 s)
    assert min(make_local_settings().limits.request_deadline, FETCH_DEADLINE) == 8.0


async def test_an_oidc_grant_is_opaque_and_opens_its_url_on_every_replica(
    oidc_settings, client_ssl, issuer, issuers_file, tmp_path, registry
):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    replicas = [oidc_settings(data_dir=tmp_path / name, metadata_secret=METADATA_SECRET) for name in ("a", "b")]
    token = issuer.mint()
    async with serve_proxy(replicas[0], client_ssl) as first, serve_proxy(replicas[1], client_ssl) as second:
        status, _, body = await first.get(f"{MIRROR}/1.0.0.json", **bearer(token))
        assert status == 200, body
        url = json.loads(body)["archives"]["linux_amd64"]["url"]
        grant = url.partition(f"?{GRANT_PARAM}=")[2]
        shown = readable_texts(grant)  # what anyone who sees the URL (a CI log) reads of it
        for text in (SUBJECT, "infra", "refs/heads", "repository_owner", '"acme"'):
            assert text not in shown, (text, grant)
        for replica in (second, first):  # any replica of the fleet (the same secret) opens it
            status, _, data = await replica.get(f"{MIRROR}/{url}")
            assert (status, data) == (200, release.zips["linux_amd64"])
        expires, _, sealed = grant.partition(".")
        path = f"{MIRROR}/{url.partition('?')[0]}"
        for forged in (
            f"{expires}.{sealed[:20]}{'A' if sealed[20] != 'A' else 'B'}{sealed[21:]}",  # one character changed
            f"{int(expires) + 600}.{sealed}",  # a longer life
        ):
            status, _, body = await second.get(with_grant(path, forged))
            assert (status, json.loads(body)["code"]) == (401, "grant_invalid"), body
        other = path.replace("linux_amd64", "darwin_arm64")  # another URL
        status, _, body = await second.get(with_grant(other, grant))
        assert (status, json.loads(body)["code"]) == (401, "grant_invalid"), body
        # a grant the fleet made (its key, from the same secret) that has expired
        [ci] = parse_issuers(issuers_file.read_text()).issuers
        client = ci.client(SUBJECT, {"repository_owner": "acme", "ref": "refs/heads/main"}, int(time.time()) + 60)
        made = create_grants(grant_key(METADATA_SECRET.encode()))
        status, _, body = await second.get(with_grant(path, made.sign(path, client, int(time.time()) - 1)))
        assert (status, json.loads(body)["code"]) == (401, "grant_expired"), body
        status, _, _ = await second.get(with_grant(path, made.sign(path, client, int(time.time()) + 60)))
        assert status == 200
