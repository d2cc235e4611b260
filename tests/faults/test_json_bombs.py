"""Hostile JSON from an upstream, against a real proxy process (issue 18, item 4).

Faults reproduced: a document nested 200,000 levels deep (`[` x 200,000, 400 KB) raised
`RecursionError`: a 500 with a traceback, and every retry fetched the document from the upstream
again. A 7.8 MB version list was parsed twice on the event loop, so the worker stalled for about a
second (`/healthz` took 1.04 s meanwhile; docs/performance.md#big-upstream-documents).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.fakes.packages import Release
from tests.fakes.registry import Fault, ModuleRelease

BOMB = b"[" * 200_000
HOST = "registry.example.test"
MIRROR = f"/mirror/v1/{HOST}/acme"
PROVIDERS = f"/registry/{HOST}/providers/v1/acme"
MODULES = f"/registry/{HOST}/modules/v1/acme"

# the upstream document that is a bomb: what clients ask the proxy for that needs it
BOMBED = {
    "/v1/providers/acme/vbomb/versions": [f"{MIRROR}/vbomb/index.json", f"{PROVIDERS}/vbomb/versions"],
    "/v1/providers/acme/dbomb/1.0.0/download/linux/amd64": [
        f"{MIRROR}/dbomb/1.0.0.json",
        f"{PROVIDERS}/dbomb/1.0.0/download/linux/amd64",
    ],
    "/v1/modules/acme/mv/aws/versions": [f"{MODULES}/mv/aws/versions"],
    "/v1/modules/acme/md/aws/1.0.0/download": [f"{MODULES}/md/aws/1.0.0/download"],
}
DISCOVERY = "/.well-known/terraform.json"


@pytest.fixture
def bombed(registry, signing_key) -> None:
    """A provider and a module for each kind of upstream document, each of them a bomb (one platform: a
    version's `:version.json` needs that platform's download document)."""
    for name in ("vbomb", "dbomb"):
        registry.add(Release("acme", name, "1.0.0", signing_key, platforms=("linux_amd64",)))
    for name in ("mv", "md"):
        registry.add_module(ModuleRelease("acme", name, "aws", "1.0.0", "{base}/static/net.tar.gz"))
    for path in (*BOMBED, DISCOVERY):
        registry.faults[path] = Fault(body=BOMB)


async def assert_remembered_502(client, asked: list[str], registry, bombed: str) -> None:
    for path in asked * 2:
        status, headers, body = await client.get(path)
        assert status == 502, (path, status, body[:300])
        assert headers["Content-Type"].startswith("application/json")
        errors = json.loads(body)["errors"]
        assert any("nested deeper than 64 levels" in e for e in errors), (path, errors)
    # retries within --ttl-negative are answered from the proxy's memory of the malformed answer
    assert registry.count(bombed) == 1, bombed


async def test_deeply_nested_upstream_json_is_a_json_502_remembered_for_a_while(
    bombed, in_process_proxy, connect, registry
):
    """Version lists, download documents and module answers (discovery, below, fails them all)."""
    del registry.faults[DISCOVERY]
    proc = await in_process_proxy()
    client = await connect(proc)
    for path, asked in BOMBED.items():
        await assert_remembered_502(client, asked, registry, path)
    assert not proc.events("request.crashed")
    assert len(proc.events("upstream.malformed")) == len(BOMBED)


async def test_a_deeply_nested_discovery_document_is_a_json_502_remembered_for_a_while(
    bombed, in_process_proxy, connect, registry
):
    proc = await in_process_proxy()
    client = await connect(proc)
    await assert_remembered_502(client, [f"{MIRROR}/foo/index.json", f"{MODULES}/mv/aws/versions"], registry, DISCOVERY)
    assert not proc.events("request.crashed")


async def test_a_big_version_list_does_not_stall_the_worker(registry, in_process_proxy, connect):
    """A 7.8 MB version list (the size limit is 8 MiB): while the proxy parses it, `/healthz` answers at
    once. Compared with the time of the whole request (same run, same load): before, the worker was
    blocked for most of it."""
    platforms = [{"os": o, "arch": a} for o in ("linux", "darwin", "windows", "freebsd") for a in ("amd64", "arm64")]
    versions = [
        {"version": f"{i // 1000}.{i // 10 % 100}.{i % 10}", "protocols": ["5.0"], "platforms": platforms * 3}
        for i in range(8_600)
    ]
    document = json.dumps({"versions": versions}).encode()
    assert 7_000_000 < len(document) < 8 * 2**20
    registry.faults["/v1/providers/acme/huge/versions"] = Fault(body=document)
    proc = await in_process_proxy()
    client = await connect(proc, timeout=120)
    assert (await client.get(f"{MIRROR}/foo/index.json"))[0] == 200  # discovery cached: only the list is left

    started = time.perf_counter()
    request = asyncio.ensure_future(client.get(f"{MIRROR}/huge/index.json"))
    slowest = 0.0
    while not request.done():
        asked = time.perf_counter()
        status, _, _ = await client.get("/healthz")
        assert status == 200
        slowest = max(slowest, time.perf_counter() - asked)
    whole = time.perf_counter() - started
    status, _, body = await request
    assert status == 200, body[:300]
    assert len(json.loads(body)["versions"]) == 8_600
    # A blocked worker answers nothing for most of the request; one parse step holding the GIL (the list is
    # parsed in a thread of this process) may delay a probe, the more so on a loaded machine.
    assert slowest < whole / 2, f"/healthz took {slowest:.3f}s while the {whole:.3f}s request parsed the list"
