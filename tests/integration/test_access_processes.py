"""Access control with real processes: SIGHUP reloads the tokens in every worker (and restarts
nothing), and a second replica sharing Redis serves nothing private to the wrong client."""

from __future__ import annotations

import json
import os
import signal
import ssl

import aiohttp
import pytest

from proxy.identity.tokens import hash_token
from tests.fakes.process import REGISTRY_HOST, wait_for
from tests.fakes.redis_server import METADATA_SECRET
from tests.integration.test_access import (  # noqa: F401 - fixtures
    ALL,
    ARCHIVE,
    PRIVATE,
    PRIVATE_MIRROR,
    PUBLIC,
    TOKENS,
    UPSTREAM_TOKEN,
    cdn,
    private,
)

FIRST, SECOND = "rpt_first_token_aaaa", "rpt_second_token_bbbb"
INDEX = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/index.json"


def entry(name: str, token: str) -> str:
    return f'[tokens.{name}]\nhash = "{hash_token(token)}"\nhosts = ["*"]\n'


async def status_of(proxy, path: str, token: str | None = None) -> tuple[int, bytes]:
    """One request on a fresh connection (so the kernel spreads them over the workers)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(proxy.url + path, ssl=context, headers=headers) as response,
    ):
        return response.status, await response.read()


@pytest.mark.parametrize("workers", [1, 2])
async def test_sighup_reloads_the_tokens_in_every_worker_without_restarting_them(proxy_process, tmp_path, workers):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(entry("first", FIRST))
    proxy = await proxy_process("--auth-tokens", str(tokens), "--workers", str(workers))
    if workers > 1:
        await wait_for(lambda: len(proxy.events("worker.started")) == workers, 20, "the workers")
    serving = {record["pid"] for record in proxy.events("worker.started")} or {proxy.process.pid}
    assert (await status_of(proxy, INDEX, FIRST))[0] == 200
    assert (await status_of(proxy, INDEX, SECOND))[0] == 401

    tokens.write_text(entry("second", SECOND))
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("auth.reloaded")} == serving, 20, "every worker reloaded")
    for _ in range(8):
        assert (await status_of(proxy, INDEX, SECOND))[0] == 200
        assert (await status_of(proxy, INDEX, FIRST))[0] == 401

    tokens.write_text("[tokens.broken\n")
    os.kill(proxy.process.pid, signal.SIGHUP)
    await wait_for(lambda: {r["pid"] for r in proxy.events("auth.reload_failed")} == serving, 20, "all refused it")
    assert (await status_of(proxy, INDEX, SECOND))[0] == 200  # the tokens in force stay

    assert proxy.process.returncode is None
    assert ({record["pid"] for record in proxy.events("worker.started")} or {proxy.process.pid}) == serving
    assert not proxy.events("worker.stopped")  # nothing was restarted
    log = proxy.log_path.read_text()
    assert FIRST not in log and SECOND not in log


@pytest.fixture
def fleet_args(tmp_path, redis_server, private, cdn):  # noqa: F811
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    credentials = tmp_path / "upstream.tfrc"
    credentials.write_text(f'credentials "{PRIVATE}" {{\n  token = "{UPSTREAM_TOKEN}"\n}}\n')
    shared = [
        "--redis-url",
        redis_server.url,
        "--redis-prefix",
        f"auth-{os.getpid()}-{tmp_path.name}",
        "--metadata-secret",
        METADATA_SECRET,
        "--upstream-map",
        f"{PRIVATE}={private.url}",
        "--allow-private-host",
        f"localhost:{cdn.port}",
        "--upstream-credentials",
        str(credentials),
    ]
    return shared, ["--auth-tokens", str(tokens)]


async def test_a_second_replica_sharing_redis_serves_nothing_private_to_the_wrong_client(
    proxy_process,
    fleet_args,
    tmp_path,
    private,  # noqa: F811
):
    shared, with_tokens = fleet_args
    secret_bytes = private.releases[("acme", "foo")]["1.0.0"].zips["linux_amd64"]
    first = await proxy_process(*shared, *with_tokens, data_dir=tmp_path / "one")
    status, body = await status_of(first, f"{PRIVATE_MIRROR}/1.0.0.json", ALL)
    url = json.loads(body)["archives"]["linux_amd64"]["url"]
    assert status == 200 and (await status_of(first, f"{PRIVATE_MIRROR}/{url}"))[1] == secret_bytes

    second = await proxy_process(*shared, *with_tokens, data_dir=tmp_path / "two")
    upstream_before = len(private.requests)
    for path in (f"{PRIVATE_MIRROR}/index.json", f"{PRIVATE_MIRROR}/1.0.0.json", ARCHIVE):
        for token, expected in ((None, "token_required"), (PUBLIC, "token_scope"), ("rpt_guess", "token_invalid")):
            status, body = await status_of(second, path, token)
            assert json.loads(body)["code"] == expected and status in (401, 403) and secret_bytes not in body
    assert len(private.requests) == upstream_before  # refused before the cache or the upstream is asked
    status, body = await status_of(second, f"{PRIVATE_MIRROR}/1.0.0.json", ALL)  # from the shared cache
    assert status == 200 and len(private.requests) == upstream_before
    assert (await status_of(second, f"{PRIVATE_MIRROR}/{url}"))[1] == secret_bytes  # grants hold fleet-wide

    # a replica without client tokens (but with the upstream credentials) refuses the private host to all
    third = await proxy_process(*shared, data_dir=tmp_path / "three")
    assert len(third.events("auth.private_hosts_refused")) == 1
    for path in (f"{PRIVATE_MIRROR}/1.0.0.json", ARCHIVE, f"{PRIVATE_MIRROR}/{url}"):
        status, body = await status_of(third, path, ALL)
        assert status == 403 and secret_bytes not in body
    for replica in (first, second, third):
        log = replica.log_path.read_text()
        assert UPSTREAM_TOKEN not in log and ALL not in log and PUBLIC not in log
