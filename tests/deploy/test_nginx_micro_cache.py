"""deploy/nginx.conf's micro-cache in front of a real proxy process (real nginx, real tokens): nginx keeps warm
metadata only as long as the proxy's Cache-Control says (its TTLs), serves it stale when the proxy is down,
keeps 404s only for --ttl-negative and other errors never, and never gives one client what a token opened."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import pytest

from proxy.identity.tokens import hash_token
from proxy.protocol.cache_control import FRONT_BOUND
from tests.fakes.nginx import BehindNginx
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, wait_for

pytestmark = pytest.mark.process

INDEX = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json"
VERSION = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0.json"
TTL = 3  # --ttl-versions of these tests: nginx's max-age is what remains of it, in whole seconds
# The warm list's: its max-age (3, the front's bound, under a second less than what remains) leaves a loaded machine
# the time to ask twice within it; with 3 the max-age is 1 and the second answer can come after it.
WARM_TTL = 6
POLL = 0.05  # seconds between the answers `until` asks for, as tests/deploy/test_nginx_front_changes.py asks
TOKEN_A, TOKEN_B = "rpt_front-client-a-0123456789abcdef", "rpt_front-client-b-0123456789abcdef"


@dataclass
class Answer:
    status: int
    cache_control: str
    cache_status: str  # nginx's $upstream_cache_status: MISS, HIT, STALE, UPDATING, BYPASS, EXPIRED
    body: str


async def fetch(setup: BehindNginx, path: str, **headers: str) -> Answer:
    """GET `path` through nginx."""
    url = f"https://localhost:{setup.nginx.port}{path}"
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=setup.tls) as response:
        return Answer(
            response.status,
            response.headers.get("Cache-Control", ""),
            response.headers.get("X-Cache-Status", ""),
            (await response.read()).decode(errors="replace"),
        )


def served_by_proxy(setup: BehindNginx, path: str) -> int:
    """How many requests for `path` reached the proxy (its access log)."""
    return sum(1 for record in setup.proxy.events("request") if record["path"] == path)


async def logged_by_proxy(setup: BehindNginx, path: str, count: int) -> int:
    """How many requests for `path` reached the proxy, once at least `count` are in its access log (the proxy writes
    its access-log lines a moment after the answers)."""
    await wait_for(lambda: served_by_proxy(setup, path) >= count, 10, f"{count} requests for {path} logged")
    return served_by_proxy(setup, path)


async def until(setup: BehindNginx, path: str, done, timeout: float, **headers: str) -> list[tuple[float, Answer]]:
    """GET `path` through nginx every POLL seconds until `done(answer)`; every answer with when it came. (Asked
    back to back, a new TLS connection each time, for the seconds a TTL or the front's bound takes to run out,
    the asking cost more CPU than all else in this file; twenty answers a second still show every phase.)"""
    seen: list[tuple[float, Answer]] = []
    deadline = time.monotonic() + timeout
    while True:
        answer = await fetch(setup, path, **headers)
        seen.append((time.monotonic(), answer))
        if done(answer):
            return seen
        assert time.monotonic() < deadline, f"no such answer within {timeout}s: {seen[-1]}"
        await asyncio.sleep(POLL)


async def test_warm_metadata_is_answered_by_nginx_within_the_ttl_and_by_the_proxy_after_it(
    behind_nginx, registry, signing_key
) -> None:
    setup = await behind_nginx("--ttl-versions", f"{WARM_TTL}s")
    asked = time.monotonic()
    first = await fetch(setup, INDEX)
    fetched = time.monotonic()  # the proxy fetched the list before it answered: its TTL runs out before this + TTL
    assert first.status == 200 and first.cache_status == "MISS"
    assert first.cache_control.startswith("public, max-age=")
    max_age = int(first.cache_control.split("max-age=")[1].split(",")[0])
    assert 0 < max_age <= WARM_TTL
    assert "stale-while-revalidate=" in first.cache_control and "stale-if-error=" in first.cache_control
    second = await fetch(setup, INDEX)
    took = time.monotonic() - asked
    # nginx keeps the list at least max-age seconds from when it got it: a hit, unless asking twice took that long
    # (a loaded machine), when it may be the old list while nginx asks the proxy again.
    expected = ("HIT",) if took < max_age else ("HIT", "STALE", "UPDATING")
    assert second.cache_status in expected and second.body == first.body, (took, second)
    assert await logged_by_proxy(setup, INDEX, 1) == 1 or second.cache_status != "HIT"

    registry.add(Release("acme", "foo", "1.2.0", signing_key))  # the upstream moves on
    seen = await until(setup, INDEX, lambda a: "1.2.0" in a.body, timeout=WARM_TTL + 10)
    for when, answer in seen:
        if "1.2.0" not in answer.body and when - fetched >= WARM_TTL:
            # The old list after the proxy's TTL only while nginx is asking the proxy again (stale-while-revalidate,
            # in the background): never as a cache hit.
            assert answer.cache_status in ("STALE", "UPDATING"), (when - fetched, answer)
    assert await logged_by_proxy(setup, INDEX, 2) >= 2
    assert all(answer.status == 200 for _, answer in seen)


async def test_nothing_a_token_opened_reaches_another_client(behind_nginx, tmp_path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[tokens.a]\nhash = "{hash_token(TOKEN_A)}"\nhosts = ["{REGISTRY_HOST}"]\n'
        f'[tokens.b]\nhash = "{hash_token(TOKEN_B)}"\nhosts = ["{REGISTRY_HOST}"]\n'
    )
    setup = await behind_nginx("--auth-tokens", str(tokens))
    for path in (INDEX, VERSION):
        a = await fetch(setup, path, Authorization=f"Bearer {TOKEN_A}")
        assert a.status == 200 and a.cache_control.startswith("private,"), a
        again = await fetch(setup, path, Authorization=f"Bearer {TOKEN_A}")
        b = await fetch(setup, path, Authorization=f"Bearer {TOKEN_B}")
        anonymous = await fetch(setup, path)
        assert again.status == b.status == 200
        assert anonymous.status == 401 and anonymous.cache_control == "no-store", anonymous
        assert "HIT" not in {a.cache_status, again.cache_status, b.cache_status, anonymous.cache_status}
        assert await logged_by_proxy(setup, path, 4) == 4  # every one of them answered by the proxy itself
    # Grants: B's download URLs are not A's (were A's answer kept, B would get URLs signed for A).
    a, b = [await fetch(setup, VERSION, Authorization=f"Bearer {t}") for t in (TOKEN_A, TOKEN_B)]
    assert a.body != b.body


async def test_errors_are_kept_only_as_the_proxy_keeps_them(behind_nginx) -> None:
    setup = await behind_nginx("--ttl-negative", f"{TTL}s")
    missing = f"/mirror/v1/{REGISTRY_HOST}/acme/nope/index.json"
    first = await fetch(setup, missing)
    fetched = time.monotonic()
    assert first.status == 404 and first.cache_control.startswith("public, max-age="), first
    assert int(first.cache_control.split("max-age=")[1]) <= TTL
    seen = await until(setup, missing, lambda a: a.cache_status != "HIT", timeout=TTL + 10)
    assert all(a.status == 404 for _, a in seen)
    assert all(when - fetched < TTL for when, a in seen if a.cache_status == "HIT")
    # The first, and (nginx answering the expired 404 while it asks again) one after the 404's TTL.
    await wait_for(lambda: served_by_proxy(setup, missing) == 2, 10, "the 404 asked for again")

    malformed = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/not-a-version.json"
    for _ in range(3):
        answer = await fetch(setup, malformed)
        assert answer.status == 400 and answer.cache_control == "no-store" and answer.cache_status != "HIT"
    assert await logged_by_proxy(setup, malformed, 3) == 3


async def test_with_the_proxy_down_the_kept_copy_is_answered_no_longer_than_the_fronts_bound(behind_nginx) -> None:
    """nginx answers its copy while no replica answers only within the answer's stale-if-error, then its own 502: a
    front never stands in for the replicas with answers older than its bound (they may be from before a change)."""
    setup = await behind_nginx()  # the default 10-minute --ttl-versions: the front's bound decides, not the TTL
    first = await fetch(setup, INDEX)
    kept_at = time.monotonic()
    assert first.status == 200 and first.cache_status == "MISS"
    await setup.proxy.stop()
    seen = await until(setup, INDEX, lambda a: a.status == 502, timeout=FRONT_BOUND + 10)
    for when, answer in seen[:-1]:  # before nginx gave up: the kept copy (a hit, then stale on the error)
        assert (answer.status, answer.body) == (200, first.body) and answer.cache_status in ("HIT", "STALE"), answer
        assert when - kept_at <= FRONT_BOUND + 1, (when - kept_at, answer)  # a second for a loaded machine
    assert seen[-1][0] - kept_at <= FRONT_BOUND + 1, seen[-1]


async def test_archives_are_not_buffered_into_the_micro_cache(behind_nginx, registry) -> None:
    """The archives' location streams (no proxy_cache): only metadata is kept."""
    setup = await behind_nginx()
    archive = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
    answers = [await fetch(setup, archive) for _ in range(2)]
    assert [(a.status, a.cache_status) for a in answers] == [(200, ""), (200, "")]
    await wait_for(lambda: served_by_proxy(setup, archive) == 2, 10, "both downloads logged by the proxy")
