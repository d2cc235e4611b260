"""The Cache-Control of metadata answers through the real application: public answers fresh for no longer than
the proxy's own TTLs nor the front's bound, `private` once a policy judges the client, 404s for --ttl-negative,
other errors `no-store`, and the routes that are not metadata left alone."""

from __future__ import annotations

import re

import pytest

from proxy.identity.tokens import GRANT_PARAM, hash_token
from proxy.protocol.cache_control import FRONT_MAX_AGE, FRONT_STALE
from proxy.web.app_keys import SETTINGS
from tests.conftest import serve_proxy
from tests.fakes.process import REGISTRY_HOST

pytestmark = pytest.mark.one_metadata_store

MIRROR = f"/mirror/v1/{REGISTRY_HOST}/acme/foo"
REGISTRY = f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo"
METADATA = (
    f"{MIRROR}/index.json",
    f"{MIRROR}/1.0.0.json",
    f"{REGISTRY}/versions",
    f"{REGISTRY}/1.0.0/download/linux/amd64",
    "/.well-known/terraform.json",
)


def max_age(cache_control: str) -> int:
    found = re.search(r"\bmax-age=(\d+)\b", cache_control)
    assert found, cache_control
    return int(found.group(1))


async def test_metadata_is_public_and_fresh_no_longer_than_the_proxys_ttls(proxy) -> None:
    for path in METADATA:
        for _ in range(2):  # cold, then warm (the in-memory shortcut notes its freshness too)
            status, headers, _ = await proxy.get(path)
            assert status == 200, path
            control = headers["Cache-Control"]
            assert control.startswith("public, ") and headers["Vary"] == "Authorization", (path, control)
            assert 0 < max_age(control) <= FRONT_MAX_AGE, (path, control)  # the front's bound, under the TTLs
            assert f"stale-while-revalidate={FRONT_STALE}, stale-if-error={FRONT_STALE}" in control


async def test_a_304_says_the_same(proxy) -> None:
    _, headers, _ = await proxy.get(f"{MIRROR}/index.json")
    status, again, _ = await proxy.get(f"{MIRROR}/index.json", headers={"If-None-Match": headers["ETag"]})
    assert status == 304 and again["Cache-Control"].startswith("public, max-age=")


async def test_errors_are_kept_only_as_the_proxy_keeps_them(proxy) -> None:
    negative = proxy.app[SETTINGS].freshness.negative
    status, headers, _ = await proxy.get(f"/mirror/v1/{REGISTRY_HOST}/acme/nope/index.json")
    assert status == 404 and headers["Cache-Control"].startswith("public, max-age=")
    assert max_age(headers["Cache-Control"]) < negative
    status, headers, _ = await proxy.get(f"{MIRROR}/not-a-version.json")
    assert status == 400 and headers["Cache-Control"] == "no-store"


async def test_other_routes_are_left_alone(proxy) -> None:
    status, headers, _ = await proxy.get(f"{REGISTRY}/1.0.0/download/linux/amd64/SHA256SUMS")
    assert status == 200 and "Cache-Control" not in headers and "Vary" not in headers
    _, headers, _ = await proxy.get("/healthz")
    assert "Cache-Control" not in headers


async def test_a_policy_makes_every_metadata_answer_private(make_settings, client_ssl, tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[[rule]]\nname = "all"\nproviders = ["*/*/*"]\naction = "allow"\n\n[default]\naction = "allow"\n'
    )
    async with serve_proxy(make_settings(policy_file=policy), client_ssl) as policed:
        for path in METADATA:
            status, headers, _ = await policed.get(path)
            assert status == 200 and headers["Cache-Control"].startswith("private, "), (path, headers)


async def test_a_token_or_a_grant_makes_the_answer_private(make_settings, client_ssl, tmp_path) -> None:
    """With access control on, an answer to a token (or to a request that carries a grant) is `private`, so a
    shared cache never hands it to another client; a refusal is never stored at all."""
    token = "rpt_cache_control_token_01"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens.ci]\nhash = "{hash_token(token)}"\nhosts = ["*"]\n')
    async with serve_proxy(make_settings(auth_tokens=tokens), client_ssl) as guarded:
        for path in METADATA[:-1]:  # discovery is open to everyone
            status, headers, _ = await guarded.get(path, headers={"Authorization": f"Bearer {token}"})
            assert status == 200 and headers["Cache-Control"].startswith("private, "), (path, headers)
            assert headers["Vary"] == "Authorization"
            status, headers, _ = await guarded.get(path)
            assert status == 401 and headers["Cache-Control"] == "no-store", (path, headers)
        status, headers, _ = await guarded.get(f"{MIRROR}/index.json?{GRANT_PARAM}=forged")
        assert status == 401 and headers["Cache-Control"] == "no-store", headers
