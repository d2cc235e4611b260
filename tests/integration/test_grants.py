"""Grants (the signed URLs of archives, SHA256SUMS and module packages in the documents an authorised client
gets) against `serve`: a grant opens exactly the URL it was made for and expires (in process), and dies with its
token (on SIGHUP, in every worker of a real proxy process).
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import time

import aiohttp
import pytest

from proxy.identity.grant_cipher import create_grants
from proxy.identity.tokens import GRANT_LIFETIME, GRANT_PARAM, Grants, grant_key, hash_token, parse_tokens, with_grant
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, wait_for
from tests.fakes.redis_server import METADATA_SECRET

FIRST, SECOND = "rpt_grant_first_aaaa", "rpt_grant_second_bbbb"
MIRROR = f"/mirror/v1/{REGISTRY_HOST}/acme"
REGISTRY = f"/registry/{REGISTRY_HOST}/providers/v1/acme"


def entry(name: str, token: str, hosts: str = '["*"]') -> str:
    return f'[tokens.{name}]\nhash = "{hash_token(token)}"\nhosts = {hosts}\n'


def archive(type_: str, version: str, platform: str = "linux_amd64") -> str:
    return f"{MIRROR}/{type_}/{version}/{platform}/terraform-provider-{type_}_{version}_{platform}.zip"


async def get(proxy, path: str, token: str | None = None) -> tuple[int, dict]:
    """One request on a fresh connection (so the kernel spreads them over the workers); the JSON body of an
    error, `{}` for another answer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(proxy.url + path, ssl=context, headers=headers) as response,
    ):
        body = await response.read()
        return response.status, json.loads(body) if response.content_type == "application/json" else {}


async def granted_archive(proxy, token: str, type_: str = "foo", version: str = "1.0.0") -> str:
    """The archive URL (with its grant) of the network mirror's version document, as `token` gets it."""
    status, document = await get(proxy, f"{MIRROR}/{type_}/{version}.json", token)
    assert status == 200, document
    return f"{MIRROR}/{type_}/" + document["archives"]["linux_amd64"]["url"]


def grant_of(url: str) -> str:
    return url.partition(f"?{GRANT_PARAM}=")[2]


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.toml"
    path.write_text(entry("first", FIRST) + entry("second", SECOND))
    return path


async def test_a_grant_opens_only_the_url_it_was_made_for(in_process_proxy, registry, signing_key, tokens):
    registry.add(Release("acme", "big", "1.0.0", signing_key))
    proxy = await in_process_proxy("--auth-tokens", str(tokens))
    url = await granted_archive(proxy, FIRST)
    assert (await get(proxy, url))[0] == 200
    grant = grant_of(url)
    # another provider of the same host and namespace, another version, another platform
    for other in (archive("big", "1.0.0"), archive("foo", "1.1.0"), archive("foo", "1.0.0", "darwin_arm64")):
        status, body = await get(proxy, with_grant(other, grant))
        assert (status, body["code"]) == (401, "grant_invalid"), other
    # the registry protocol: each of the three URLs carries a grant of its own
    status, _ = await get(proxy, f"{REGISTRY}/big/1.0.0/download/linux/amd64", FIRST)  # big's documents exist
    assert status == 200
    status, document = await get(proxy, f"{REGISTRY}/foo/1.0.0/download/linux/amd64", FIRST)
    sums, signature = document["shasums_url"], document["shasums_signature_url"]
    assert (await get(proxy, sums))[0] == 200 and (await get(proxy, signature))[0] == 200
    for other in (
        with_grant(sums.partition("?")[0].replace("/foo/", "/big/"), grant_of(sums)),
        with_grant(signature.partition("?")[0], grant_of(sums)),
        with_grant(document["download_url"].partition("?")[0], grant_of(sums)),
    ):
        status, body = await get(proxy, other)
        assert (status, body["code"]) == (401, "grant_invalid"), other


async def test_a_removed_tokens_grants_are_refused_at_once_in_every_worker(proxy_process, tokens):
    workers = 2
    proxy = await proxy_process("--auth-tokens", str(tokens), "--workers", str(workers))
    await wait_for(lambda: len(proxy.events("worker.started")) == workers, 20, "the workers")
    serving = {record["pid"] for record in proxy.events("worker.started")}
    first, second = await granted_archive(proxy, FIRST), await granted_archive(proxy, SECOND, version="1.1.0")
    assert (await get(proxy, first))[0] == 200 and (await get(proxy, second))[0] == 200

    tokens.write_text(entry("second", SECOND))  # the first token removed
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("auth.reloaded")} == serving, 20, "every worker reloaded")
    for _ in range(8):  # fresh connections: every worker refuses it
        status, body = await get(proxy, first)
        assert (status, body["code"]) == (401, "grant_revoked")
        assert (await get(proxy, second))[0] == 200  # the other token's grants hold

    tokens.write_text(entry("second", SECOND, '["other.example"]'))  # still there, but narrowed
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: len(proxy.events("auth.reloaded")) == 2 * workers, 20, "every worker reloaded again")
    for _ in range(4):
        status, body = await get(proxy, second)
        assert (status, body["code"]) == (403, "token_scope")


async def test_an_expired_grant_is_refused(in_process_proxy, tokens):
    proxy = await in_process_proxy("--auth-tokens", str(tokens), "--metadata-secret", METADATA_SECRET)
    url = await granted_archive(proxy, FIRST)
    path = url.partition("?")[0]
    # the proxy's own signer: the same key (from the same metadata secret) and the same token
    grants = create_grants(grant_key(METADATA_SECRET.encode()))
    [first, _] = parse_tokens(tokens.read_text()).tokens
    now = time.time()
    assert (await get(proxy, with_grant(path, grants.sign(path, first, Grants.expiry(now)))))[0] == 200
    status, body = await get(proxy, with_grant(path, grants.sign(path, first, int(now) - 1)))
    assert (status, body["code"]) == (401, "grant_expired")
    # and the proxy's own grant expires within its lifetime and a minute
    expires = int(grant_of(url).partition(".")[0])
    assert now + GRANT_LIFETIME - 5 <= expires <= now + GRANT_LIFETIME + 65


async def test_a_grant_made_with_the_secret_accepted_during_a_rotation_is_honoured(in_process_proxy, tokens):
    """Step 2 of a rotation (docs/operations.md): a replica writing with the new secret, the old accepted, honours
    the grants made by a replica still writing with the old one; without the old one accepted it refuses them."""
    new_secret = "n" * 32
    rotating = await in_process_proxy(
        "--auth-tokens", str(tokens), "--metadata-secret", new_secret, "--metadata-secret-accepted", METADATA_SECRET
    )
    url = await granted_archive(rotating, FIRST)
    path = url.partition("?")[0]
    [first, _] = parse_tokens(tokens.read_text()).tokens
    expires = Grants.expiry(time.time())
    old_grant = create_grants(grant_key(METADATA_SECRET.encode())).sign(path, first, expires)
    assert old_grant != grant_of(url)  # the replica makes its grants with the new secret
    assert (await get(rotating, with_grant(path, old_grant)))[0] == 200
    forged = create_grants(grant_key(b"f" * 32)).sign(path, first, expires)  # neither secret's
    status, body = await get(rotating, with_grant(path, forged))
    assert (status, body["code"]) == (401, "grant_revoked")
    await rotating.stop()
    dropped = await in_process_proxy("--auth-tokens", str(tokens), "--metadata-secret", new_secret)  # step 4
    status, body = await get(dropped, with_grant(path, old_grant))
    assert (status, body["code"]) == (401, "grant_revoked")
