"""OIDC with real proxy processes (two workers): expired and wrong-audience tokens refused, a rotated key
picked up by every worker and a new key while the issuer is down refused cleanly (the key refresh interval
scaled to a second), the workers share the keys one of them fetched (and keep them with the issuer down),
SIGHUP reloads the issuers file in every worker (a broken one keeps the rules in force), and a broken file
stops start-up with one line naming the file, the issuer and the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time

import aiohttp
import pytest

from tests.fakes.process import REGISTRY_HOST, wait_for
from tests.integration.test_cli_errors import run_cli
from tests.integration.test_oidc import issuer, issuers_file, issuers_toml  # noqa: F401 - fixtures

INDEX = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json"
WORKERS = 2
# seconds between the requests of a loop waiting out the workers' refresh second (asked back to back, they
# cost more CPU than the rest of the test)
POLL = 0.05


async def get(proxy, path: str, token: str) -> tuple[int, dict]:
    """One request on a fresh connection (so the kernel spreads them over the workers)."""
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(proxy.url + path, ssl=context, headers={"Authorization": f"Bearer {token}"}) as response,
    ):
        body = await response.read()
        return response.status, json.loads(body) if response.content_type == "application/json" else {}


async def start(proxy_process, issuer, issuers_file, *flags: str):  # noqa: F811
    proxy = await proxy_process(
        "--oidc-issuers", str(issuers_file), "--allow-private-host", issuer.allow, "--workers", str(WORKERS), *flags
    )
    await wait_for(lambda: len(proxy.events("worker.started")) == WORKERS, 20, "the workers")
    return proxy, {record["pid"] for record in proxy.events("worker.started")}


async def test_the_workers_share_the_keys_one_fetched_and_keep_them_with_the_issuer_down(
    proxy_process,
    issuer,  # noqa: F811
    issuers_file,  # noqa: F811
):
    proxy, serving = await start(proxy_process, issuer, issuers_file)
    assert (await get(proxy, INDEX, issuer.mint()))[0] == 200
    await issuer.stop()

    def holding() -> set[int]:
        return {r["pid"] for r in proxy.events("oidc.keys_fetched") + proxy.events("oidc.keys_shared")}

    for _ in range(60):  # fresh connections until every worker has answered a token
        if holding() == serving:
            break
        assert (await get(proxy, INDEX, issuer.mint("ES256")))[0] == 200
    assert holding() == serving
    assert len(proxy.events("oidc.keys_fetched")) == 1 and issuer.count("/keys") == 1


def holding(proxy, kid: str) -> set[int]:
    """The workers (pids) that hold the key `kid`, fetched themselves or read from the store."""
    events = proxy.events("oidc.keys_fetched") + proxy.events("oidc.keys_shared")
    return {record["pid"] for record in events if kid in record["key_ids"]}


async def test_expired_and_wrong_audience_refused_a_rotated_key_reaches_every_worker_a_new_key_while_down_503(
    proxy_process,
    issuer,  # noqa: F811
    issuers_file,  # noqa: F811
):
    proxy, serving = await start(
        proxy_process, issuer, issuers_file, "--unsafe-short-timings", "--oidc-keys-refresh", "1s"
    )
    assert (await get(proxy, INDEX, issuer.mint()))[0] == 200
    now = int(time.time())
    status, body = await get(proxy, INDEX, issuer.mint(exp=now - 60, iat=now - 600, nbf=now - 600))
    assert (status, body["code"]) == (401, "oidc_token_expired")
    status, body = await get(proxy, INDEX, issuer.mint(aud="https://other.example"))
    assert (status, body["code"]) == (401, "oidc_wrong_audience")
    reasons = [record["reason"] for record in proxy.events("auth.refused")]
    assert reasons == ["oidc expired", "oidc wrong_audience"]

    new = issuer.rotate()
    deadline = time.monotonic() + 20
    while holding(proxy, new) != serving:  # fresh connections, new tokens: each worker fetches or reads the store
        assert time.monotonic() < deadline, f"the workers holding {new}: {holding(proxy, new)} of {serving}"
        status, body = await get(proxy, INDEX, issuer.mint())
        assert status == 200 or (status, body["code"]) == (401, "oidc_key_unknown")  # within the refresh second
        await asyncio.sleep(POLL)
    for _ in range(4):
        assert (await get(proxy, INDEX, issuer.mint()))[0] == 200
    assert issuer.count("/keys") >= 2

    await issuer.stop()
    fetched = issuer.count("/keys")
    newer = issuer.rotate("ES256")
    deadline = time.monotonic() + 20
    while True:  # once the refresh second since a worker's last fetch is over, it tries the issuer: down
        started = time.monotonic()
        status, body = await get(proxy, INDEX, issuer.mint("ES256"))
        if status == 503:
            break
        assert (status, body["code"]) == (401, "oidc_key_unknown"), body  # within the second: the keys held
        assert time.monotonic() < deadline, "no worker tried the issuer for the new key"
        await asyncio.sleep(POLL)
    assert body["code"] == "oidc_issuer_unavailable"
    assert time.monotonic() - started < 8  # refused, not left waiting
    assert (await get(proxy, INDEX, issuer.mint()))[0] == 200  # the RS256 key held still works
    await issuer.start()  # back on the same port: the new key is fetched (within the refresh second)
    deadline = time.monotonic() + 20
    while (await get(proxy, INDEX, issuer.mint("ES256")))[0] != 200:
        assert time.monotonic() < deadline, f"{newer} was never picked up once the issuer was back"
        await asyncio.sleep(POLL)
    assert issuer.count("/keys") > fetched
    assert proxy.process.returncode is None


async def test_sighup_reloads_the_issuers_in_every_worker_and_a_broken_file_keeps_them(
    proxy_process,
    issuer,  # noqa: F811
    issuers_file,  # noqa: F811
):
    proxy, serving = await start(proxy_process, issuer, issuers_file)
    assert (await get(proxy, INDEX, issuer.mint()))[0] == 200

    issuers_file.write_text(issuers_toml(issuer, owner="someone-else"))
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("oidc.reloaded")} == serving, 20, "every worker reloaded")
    for _ in range(6):
        status, body = await get(proxy, INDEX, issuer.mint())
        assert (status, body["code"]) == (403, "token_scope")

    issuers_file.write_text('[issuers.ci]\nurl = "http://not-https.example"\n')
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("oidc.reload_failed")} == serving, 20, "all refused it")
    [failed, *_] = proxy.events("oidc.reload_failed")
    assert "issuer 'ci': `url` must be an https:// URL" in failed["error"]
    for _ in range(4):  # the rules in force stay
        assert (await get(proxy, INDEX, issuer.mint()))[1]["code"] == "token_scope"
    assert proxy.process.returncode is None and not proxy.events("worker.stopped")


@pytest.mark.process
def test_a_broken_issuers_file_stops_start_up_in_one_line(tmp_path):
    bad = tmp_path / "issuers.toml"
    bad.write_text(
        '[issuers.github]\nurl = "https://token.actions.githubusercontent.com"\naudiences = ["a"]\n'
        '[[issuers.github.rules]]\nname = "acme"\nclaims = { repository_owner = "acme" }\nnamespaces = ["acme/*"]\n'
    )
    result = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--oidc-issuers", str(bad), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line == (
        f"registry-proxy: error: --oidc-issuers {bad}: issuer 'github', rule 'acme': `namespaces`: 'acme/*' holds "
        "characters no namespace has (a namespace alone: `acme` covers acme/*)"
    )
