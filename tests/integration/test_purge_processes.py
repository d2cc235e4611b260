"""A purge reaches every process: two replicas of two workers each, sharing Redis and a data dir, all holding a
version in memory; the upstream publishes that version again with other bytes; after one `DELETE` on one
replica (and after `registry-proxy purge` from the command line), every worker of every replica answers with
the new release, fetched from the upstream again, never with what it remembered."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import uuid

import aiohttp

from proxy.identity.tokens import hash_token
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, REPO_ROOT, wait_for
from tests.fakes.redis_server import METADATA_SECRET

ADMIN = "rpt_purge_admin_token_0001"
VERSION_DOC = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0.json"
ATTEMPTS = 200  # requests on fresh connections until each worker has answered at least once


def zh(release: Release) -> str:
    return f"zh:{release.sha256('linux_amd64')}"


async def every_worker_answers(proxy, expected: str) -> None:
    """Ask `proxy` for the version document on fresh connections until each of its workers has answered; every
    answer lists `expected`."""
    # the second worker may still be starting when the first answers: wait for both to have said so
    await wait_for(lambda: len(proxy.events("worker.started")) >= 2, 20, f"both workers of {proxy.url} to start")
    workers = {record["pid"] for record in proxy.events("worker.started")}
    assert len(workers) == 2, workers
    before = len(proxy.events("request"))
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        for _ in range(ATTEMPTS):
            async with session.get(proxy.url + VERSION_DOC, ssl=context) as response:
                assert response.status == 200
                body = await response.json()
            assert expected in body["archives"]["linux_amd64"]["hashes"], body
            answered = {r["pid"] for r in proxy.events("request")[before:] if r["path"] == VERSION_DOC}
            if answered >= workers:
                return
    raise AssertionError(f"not every worker of {proxy.url} answered in {ATTEMPTS} requests: {answered} of {workers}")


async def start_fleet(proxy_process, redis_server, tmp_path) -> list:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[tokens.ops]\nhash = "{hash_token(ADMIN)}"\nhosts = ["*"]\nadmin = true\n')
    redis = ["--redis-url", redis_server.url, "--redis-prefix", f"purge-{uuid.uuid4().hex[:10]}"]
    common = [*redis, "--metadata-secret", METADATA_SECRET, "--auth-tokens", str(tokens), "--workers", "2"]
    shared = tmp_path / "shared"
    return [await proxy_process(*common, data_dir=shared), await proxy_process(*common, data_dir=shared)]


async def test_a_purge_over_http_then_the_purge_command_reach_every_worker_of_every_replica(
    proxy_process, registry, signing_key, redis_server, tmp_path
) -> None:
    """One fleet for both ways to purge: over HTTP on one replica, then (the version published once more)
    from the command line."""
    replicas = await start_fleet(proxy_process, redis_server, tmp_path)
    old = registry.releases[("acme", "foo")]["1.0.0"]
    for proxy in replicas:
        await every_worker_answers(proxy, zh(old))  # every process holds 1.0.0 in memory now

    new = registry.add(Release("acme", "foo", "1.0.0", signing_key, padding=4096))  # published again
    assert zh(new) != zh(old)
    await purge_over_http(replicas[0])
    for proxy in replicas:
        await every_worker_answers(proxy, zh(new))
    purged = [record for proxy in replicas for record in proxy.events("catalog.purged")]
    assert [(record["who"], record["what"]) for record in purged] == [("token:ops", f"{REGISTRY_HOST}/acme/foo@1.0.0")]

    newer = registry.add(Release("acme", "foo", "1.0.0", signing_key, padding=8192))  # and again
    assert zh(newer) not in (zh(old), zh(new))
    await purge_command(replicas[0])
    for proxy in replicas:
        await every_worker_answers(proxy, zh(newer))


async def purge_over_http(proxy) -> None:
    """`DELETE` the version on `proxy` as the admin token."""
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with (
        aiohttp.ClientSession() as session,
        session.delete(
            f"{proxy.url}/api/v1/catalog/{REGISTRY_HOST}/acme/foo@1.0.0",
            headers={"Authorization": f"Bearer {ADMIN}"},
            ssl=context,
        ) as response,
    ):
        report = await response.json()
    assert response.status == 200, report
    assert report["by"] == "token:ops" and f"download:{REGISTRY_HOST}/acme/foo/1.0.0/linux_amd64" in report["records"]


async def purge_command(proxy) -> None:
    """`registry-proxy purge` of the version, on the stores of `proxy` (a process of its own, as operators run it)."""
    argv = [*proxy.args[proxy.args.index("serve") + 1 :]]
    store_options = _store_options(argv)
    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "proxy", "purge", f"{REGISTRY_HOST}/acme/foo@1.0.0", *store_options],
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = (part.decode() for part in await asyncio.wait_for(process.communicate(), 120))
    assert process.returncode == 0, stderr
    assert stdout.startswith(f"purged {REGISTRY_HOST}/acme/foo@1.0.0: "), stdout
    logged = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    purged = [record for record in logged if record.get("event") == "catalog.purged"]
    assert len(purged) == 1 and purged[0]["who"].startswith("cli:"), stderr


def _store_options(serve_argv: list[str]) -> list[str]:
    """The options of a `serve` command line that say where its stores are (what `purge` needs of it)."""
    wanted = {"--data-dir", "--redis-url", "--redis-prefix", "--metadata-secret"}
    return [
        part
        for index, part in enumerate(serve_argv)
        if part in wanted or (index > 0 and serve_argv[index - 1] in wanted)
    ]
