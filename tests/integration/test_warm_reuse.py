"""Warm answers reused whole (`proxy.web.warm_answers`) against the real application: each test first shows that the
answer is being reused, then that a revoked token, a purge, a policy reload or a new archive in this process is
seen by the very next request all the same."""

from __future__ import annotations

import json
import time

import pytest

from proxy.identity.tokens import GRANT_STEP, hash_token
from proxy.web.access import ACCESS
from proxy.web.app_keys import GATEKEEPER, WARM_ANSWERS
from tests.conftest import RunningProxy, serve_proxy
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST

pytestmark = pytest.mark.one_metadata_store

MIRROR = f"/mirror/v1/{REGISTRY_HOST}/acme/foo"
INDEX, VERSION_DOC = f"{MIRROR}/index.json", f"{MIRROR}/1.0.0.json"
ARCHIVE = f"{MIRROR}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
ADMIN, READER = "rpt_warm_admin_000001", "rpt_warm_reader_00002"
ADMIN_TOKEN = f'[tokens.admin]\nhash = "{hash_token(ADMIN)}"\nhosts = ["*"]\nadmin = true\n'
READER_TOKEN = f'[tokens.reader]\nhash = "{hash_token(READER)}"\nhosts = ["{REGISTRY_HOST}"]\n'


def auth(token: str) -> dict:
    return {"headers": {"Authorization": f"Bearer {token}"}}


async def reused_twice(proxy: RunningProxy, path: str, **kwargs) -> bytes:
    """Ask for `path` three times; the last two answers are the first, reused whole. The body.

    A token's answers carry grants whose expiry moves on at each whole minute (GRANT_STEP): a round that
    straddles one (a loaded machine) is asked again, once."""
    warm = proxy.app[WARM_ANSWERS]
    for _ in range(2):
        minute = int(time.time()) // GRANT_STEP
        bodies = []
        for _ in range(3):
            status, _, body = await proxy.get(path, **kwargs)
            assert status == 200, body
            bodies.append(body)
        before = warm.reused
        await proxy.get(path, **kwargs)
        if int(time.time()) // GRANT_STEP == minute:
            break
    assert warm.reused == before + 1 and len(set(bodies)) == 1
    return bodies[0]


async def test_a_revoked_token_is_refused_at_once_though_its_answer_was_being_reused(
    make_settings, client_ssl, tmp_path
):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(ADMIN_TOKEN + READER_TOKEN)
    async with serve_proxy(make_settings(auth_tokens=tokens), client_ssl) as proxy:
        await reused_twice(proxy, VERSION_DOC, **auth(READER))
        tokens.write_text(ADMIN_TOKEN)  # the reader's token revoked, and the file read again (SIGHUP)
        proxy.app[ACCESS].reload()
        status, _, body = await proxy.get(VERSION_DOC, **auth(READER))
        assert status == 401 and json.loads(body)["code"] == "token_invalid"
        assert (await proxy.get(VERSION_DOC, **auth(ADMIN)))[0] == 200


async def test_a_purged_version_is_fetched_anew_by_the_next_request(make_settings, client_ssl, tmp_path, registry):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(ADMIN_TOKEN)
    async with serve_proxy(make_settings(auth_tokens=tokens), client_ssl) as proxy:
        old = json.loads(await reused_twice(proxy, VERSION_DOC, **auth(ADMIN)))
        new = registry.add(Release("acme", "foo", "1.0.0", registry.releases[("acme", "foo")]["1.0.0"].key, padding=99))
        async with proxy.session.delete(
            f"{proxy.url}/api/v1/catalog/{REGISTRY_HOST}/acme/foo@1.0.0", **auth(ADMIN)
        ) as response:
            assert response.status == 200, await response.text()
        status, _, body = await proxy.get(VERSION_DOC, **auth(ADMIN))
        hashes = json.loads(body)["archives"]["linux_amd64"]["hashes"]
        assert (
            status == 200 and hashes == [f"zh:{new.sha256('linux_amd64')}"] != old["archives"]["linux_amd64"]["hashes"]
        )


async def test_a_policy_reload_is_seen_by_the_next_request(make_settings, client_ssl, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('mode = "enforce"\n')
    async with serve_proxy(make_settings(policy_file=policy), client_ssl) as proxy:
        assert "1.1.0" in json.loads(await reused_twice(proxy, INDEX))["versions"]
        await reused_twice(proxy, f"{MIRROR}/1.1.0.json")
        policy.write_text(
            f'[[rule]]\nname = "bad"\nproviders = ["{REGISTRY_HOST}/acme/foo"]\nversions = "= 1.1.0"\n'
            'action = "deny"\nreason = "breaks IAM policies"\n'
        )
        proxy.app[GATEKEEPER].reload()  # what SIGHUP does in every worker
        status, _, body = await proxy.get(INDEX)
        assert status == 200 and set(json.loads(body)["versions"]) == {"1.0.0"}
        status, _, body = await proxy.get(f"{MIRROR}/1.1.0.json")
        assert status == 403 and json.loads(body)["rule"] == "bad"


async def test_an_archive_stored_by_this_process_shows_its_h1_hashes_at_once(make_settings, client_ssl):
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        before = json.loads(await reused_twice(proxy, VERSION_DOC))
        assert not [h for h in before["archives"]["linux_amd64"]["hashes"] if h.startswith("h1:")]
        assert (await proxy.get(ARCHIVE))[0] == 200
        status, _, body = await proxy.get(VERSION_DOC)
        assert status == 200 and [
            h for h in json.loads(body)["archives"]["linux_amd64"]["hashes"] if h.startswith("h1:")
        ]


async def test_a_warn_mode_policy_answer_is_never_reused(make_settings, client_ssl, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('mode = "warn"\n[[rule]]\nname = "all"\nproviders = ["*/*/*"]\naction = "deny"\n')
    async with serve_proxy(make_settings(policy_file=policy), client_ssl) as proxy:
        for _ in range(3):
            assert (await proxy.get(VERSION_DOC))[0] == 200
        assert proxy.app[WARM_ANSWERS].reused == 0
