"""Hostile JSON from an upstream, against a real proxy process (issue 18, item 4).

Faults reproduced: a document nested 200,000 levels deep (`[` x 200,000, 400 KB) raised
`RecursionError`: a 500 with a traceback, and every retry fetched the document from the upstream
again. A 7.8 MB version list was parsed twice on the event loop, so the worker stalled for about a
second (`/healthz` took 1.04 s meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.fakes.registry import Fault, ModuleRelease

BOMB = b"[" * 200_000
HOST = "registry.example.test"
MIRROR = f"/mirror/v1/{HOST}/acme"
PROVIDERS = f"/registry/{HOST}/providers/v1/acme"
MODULES = f"/registry/{HOST}/modules/v1/acme"

# (what the client asks the proxy for, the upstream document that is a bomb)
BOMBED = {
    "mirror index": (f"{MIRROR}/foo/index.json", "/v1/providers/acme/foo/versions"),
    "registry versions": (f"{PROVIDERS}/foo/versions", "/v1/providers/acme/foo/versions"),
    "mirror version": (f"{MIRROR}/foo/1.0.0.json", "/v1/providers/acme/foo/1.0.0/download/linux/amd64"),
    "registry download": (
        f"{PROVIDERS}/foo/1.0.0/download/linux/amd64",
        "/v1/providers/acme/foo/1.0.0/download/linux/amd64",
    ),
    "discovery": (f"{MIRROR}/foo/index.json", "/.well-known/terraform.json"),
    "module versions": (f"{MODULES}/net/aws/versions", "/v1/modules/acme/net/aws/versions"),
    "module download": (f"{MODULES}/net/aws/1.0.0/download", "/v1/modules/acme/net/aws/1.0.0/download"),
}


@pytest.fixture
def one_platform(registry, signing_key):
    """foo 1.0.0 for one platform only, so its `:version.json` needs that platform's download document."""
    from tests.fakes.packages import Release

    registry.add(Release("acme", "foo", "1.0.0", signing_key, platforms=("linux_amd64",)))
    registry.add_module(ModuleRelease("acme", "net", "aws", "1.0.0", "{base}/static/net.tar.gz"))


@pytest.mark.parametrize("case", sorted(BOMBED))
async def test_deeply_nested_upstream_json_is_a_json_502_remembered_for_a_while(
    case, one_platform, proxy_process, connect, registry
):
    asked, bombed = BOMBED[case]
    registry.faults[bombed] = Fault(body=BOMB)
    proc = await proxy_process()
    client = await connect(proc)

    for attempt in (1, 2, 3):
        status, headers, body = await client.get(asked)
        assert status == 502, (attempt, status, body[:300])
        assert headers["Content-Type"].startswith("application/json")
        errors = json.loads(body)["errors"]
        assert any("nested deeper than" in e for e in errors), errors
    # retries within --ttl-negative are answered from the proxy's memory of the malformed answer
    assert registry.count(bombed) == 1
    assert not proc.events("request.crashed")
    assert any(e.get("event") == "upstream.malformed" for e in proc.events())


async def test_a_big_version_list_does_not_stall_the_worker(registry, proxy_process, connect):
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
    proc = await proxy_process()
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
    assert slowest < whole / 4, f"/healthz took {slowest:.3f}s while the {whole:.3f}s request parsed the list"
