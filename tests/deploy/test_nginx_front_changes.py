"""deploy/nginx.conf's micro-cache after a change of what the proxy decides (real nginx as shipped, a real proxy
behind it, its version lists fresh for the default 10 minutes): a policy enabled by a restart, a policy changed by
SIGHUP, tokens enabled by a restart, a version purged. Within the front's bound after the change takes effect in
the proxy (docs/deployment.md#after-a-change-or-a-purge), every answer through nginx is one the proxy decided after
it: never the answer nginx kept from before, fresh or stale."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable

import pytest

from proxy.identity.tokens import hash_token
from proxy.protocol.cache_control import FRONT_BOUND
from tests.deploy.test_nginx_micro_cache import Answer, fetch
from tests.fakes.nginx import BehindNginx
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, registry_proxy_in_process, wait_for

pytestmark = pytest.mark.process

INDEX = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json"
NEWER = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.1.0.json"
OLDER = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0.json"
# What the measure allows beyond the bound: the time a request through nginx takes on a loaded machine.
SLACK = 1.0
AGAIN = 3  # answers asked once the change shows: each must show it too (no older answer comes back)
DENY_NEWER = f"""
[[rule]]
name = "foo-known-bad"
providers = ["{REGISTRY_HOST}/acme/foo"]
versions = "= 1.1.0"
action = "deny"
reason = "breaks IAM policies"
"""
DENY_ELSEWHERE = f"""
[[rule]]
name = "unvetted"
providers = ["{REGISTRY_HOST}/evilcorp/*"]
action = "deny"
reason = "namespace not approved"
"""
TOKEN = "rpt_front-change-client-0123456789abcdef"


async def warm(setup: BehindNginx, *paths: str) -> dict[str, Answer]:
    """Ask nginx for each of `paths` until it answers from its cache (kept there); the answers it keeps."""
    kept = {}
    for path in paths:
        first = await fetch(setup, path)
        assert first.status == 200, first
        again = await fetch(setup, path)
        assert again.cache_status == "HIT" and again.body == first.body, again
        kept[path] = again
    return kept


async def shown_within_the_bound(
    setup: BehindNginx, path: str, changed_at: float, shows: Callable[[Answer], bool], **headers: str
) -> None:
    """Ask nginx for `path` until its answer `shows` the change; fail on an answer that does not, asked later than
    the front's bound after the change took effect (`changed_at`), and when an older answer comes back after one
    that showed it."""
    while True:
        asked = time.monotonic() - changed_at
        answer = await fetch(setup, path, **headers)
        if shows(answer):
            break
        assert asked <= FRONT_BOUND + SLACK, f"{path} {asked:.1f}s after the change: an answer from before it {answer}"
        await asyncio.sleep(0.05)
    for _ in range(AGAIN):
        answer = await fetch(setup, path, **headers)
        assert shows(answer), f"{path}: an answer from before the change came back {answer}"


def lists_newer(answer: Answer) -> bool:
    return answer.status == 200 and '"1.1.0"' in answer.body


@pytest.mark.parametrize(
    "ttl",
    [
        "10m",  # the default: nginx's copy still fresh after the change, as far as the proxy's TTLs go
        "4s",  # nginx's copy already stale: it must not go on answering it while it asks the proxy again
    ],
)
async def test_a_policy_enabled_by_a_restart_reaches_clients_behind_the_front_within_its_bound(
    behind_nginx, tmp_path, ttl
) -> None:
    setup = await behind_nginx("--ttl-versions", ttl)
    kept = await warm(setup, INDEX, NEWER)
    assert lists_newer(kept[INDEX])
    policy = tmp_path / "policy.toml"
    policy.write_text(DENY_NEWER)
    await setup.proxy.restart("--policy", str(policy))
    changed_at = time.monotonic()
    await shown_within_the_bound(setup, INDEX, changed_at, lambda a: a.status == 200 and not lists_newer(a))
    await shown_within_the_bound(setup, NEWER, changed_at, lambda a: a.status == 403)


async def test_a_policy_changed_by_sighup_reaches_clients_behind_the_front_within_its_bound(
    behind_nginx, tmp_path
) -> None:
    setup = await behind_nginx()
    kept = await warm(setup, INDEX, NEWER)
    policy = tmp_path / "policy.toml"
    policy.write_text(DENY_ELSEWHERE)  # enabled by a restart, changing none of these answers
    await setup.proxy.restart("--policy", str(policy))
    assert lists_newer(await fetch(setup, INDEX)) and (await fetch(setup, NEWER)).body == kept[NEWER].body
    policy.write_text(DENY_NEWER)
    os.kill(setup.proxy.pid, signal.SIGHUP)  # this process: the proxy serves in it
    await wait_for(lambda: setup.proxy.events("policy.reloaded"), 10, "the policy read again")
    changed_at = time.monotonic()
    await shown_within_the_bound(setup, INDEX, changed_at, lambda a: a.status == 200 and not lists_newer(a))
    await shown_within_the_bound(setup, NEWER, changed_at, lambda a: a.status == 403)


async def test_tokens_enabled_by_a_restart_reach_clients_behind_the_front_within_their_bound(
    behind_nginx, tmp_path
) -> None:
    setup = await behind_nginx()
    await warm(setup, INDEX, OLDER)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens.ci]\nhash = "{hash_token(TOKEN)}"\nhosts = ["{REGISTRY_HOST}"]\n')
    await setup.proxy.restart("--auth-tokens", str(tokens))
    changed_at = time.monotonic()
    for path in (INDEX, OLDER):
        await shown_within_the_bound(setup, path, changed_at, lambda a: a.status == 401)
        assert (await fetch(setup, path, Authorization=f"Bearer {TOKEN}")).status == 200


async def test_a_purged_version_reaches_clients_behind_the_front_within_its_bound(
    behind_nginx, registry, signing_key, monkeypatch
) -> None:
    setup = await behind_nginx()
    old = registry.releases[("acme", "foo")]["1.0.0"]
    kept = await warm(setup, OLDER)
    assert old.sha256("linux_amd64") in kept[OLDER].body
    new = registry.add(Release("acme", "foo", "1.0.0", signing_key, padding=4096))  # published again, other bytes
    changed_at = await purged(setup, f"{REGISTRY_HOST}/acme/foo@1.0.0", monkeypatch)
    fresh = new.sha256("linux_amd64")
    await shown_within_the_bound(setup, OLDER, changed_at, lambda a: a.status == 200 and fresh in a.body)


async def test_the_fronts_stale_copy_never_stands_in_for_the_proxys_own_error(
    behind_nginx, registry, monkeypatch
) -> None:
    """A version purged while the upstream is down: the proxy has nothing to answer with (502); nginx passes that
    on rather than the purged copy it kept (it answers stale only when no replica answers at all)."""
    setup = await behind_nginx()
    gone = registry.releases[("acme", "foo")]["1.0.0"].sha256("linux_amd64")
    await warm(setup, OLDER)
    await registry.stop()
    changed_at = await purged(setup, f"{REGISTRY_HOST}/acme/foo@1.0.0", monkeypatch)
    await shown_within_the_bound(setup, OLDER, changed_at, lambda a: gone not in a.body)
    answer = await fetch(setup, OLDER)
    assert answer.status == 502 and answer.cache_status != "STALE", answer


async def purged(setup: BehindNginx, target: str, monkeypatch: pytest.MonkeyPatch) -> float:
    """`registry-proxy purge TARGET` on the proxy's stores (the command's `main`, in this process: its logging keeps
    the set-up capturing the proxy's records, `command_logging`); when it returned, by when every process of the
    proxy has seen the purge."""
    code, output = await registry_proxy_in_process("purge", target, "--data-dir", str(setup.proxy.data_dir))
    assert code == 0 and f"\npurged {target}: " in output, output  # after its progress (stderr)
    return time.monotonic()
