"""A cold request's upstream fetches overlap where the protocol allows it (the fake registry's request log
shows the order; no timing is asserted): the version list is fetched at its usual place while discovery
says where it is, and used only if discovery names that place."""

from __future__ import annotations

import asyncio

from tests.conftest import PROVIDER, REGISTRY_HOST
from tests.fakes.registry import Fault

WAIT = 10  # seconds for an awaited condition: only a broken proxy takes that long
INDEX = f"/mirror/v1/{PROVIDER}/index.json"
DISCOVERY = "/.well-known/terraform.json"
VERSIONS = "/v1/providers/acme/foo/versions"


async def until(condition) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():  # noqa: ASYNC110 - the fake registry's log has no event to wait on
            await asyncio.sleep(0.01)


async def test_the_version_list_is_fetched_while_discovery_is_answered(proxy, registry):
    gate = registry.gates[DISCOVERY] = asyncio.Event()
    index = asyncio.create_task(proxy.json(INDEX))
    await until(lambda: registry.count(VERSIONS) == 1)  # asked for while discovery is held
    assert registry.completed_count(DISCOVERY) == 0
    gate.set()
    status, body = await asyncio.wait_for(index, WAIT)
    assert status == 200 and set(body["versions"]) == {"1.0.0", "1.1.0"}
    assert (registry.count(DISCOVERY), registry.count(VERSIONS)) == (1, 1)  # the early answer was the answer

    other = f"/mirror/v1/{REGISTRY_HOST}/acme/other/index.json"  # discovery is cached now: nothing early
    assert (await proxy.json(other))[0] == 404
    assert registry.count("/v1/providers/acme/other/versions") == 1


async def test_an_early_answer_at_another_place_than_discovery_names_is_not_used(proxy, registry):
    registry.faults[DISCOVERY] = Fault(body=b'{"providers.v1": "/moved/providers/"}')
    registry.faults[VERSIONS] = Fault(body=b'{"versions": [{"version": "6.6.6", "platforms": []}]}')
    registry.faults["/moved/providers/acme/foo/versions"] = Fault(
        body=b'{"versions": [{"version": "2.0.0", "platforms": [{"os": "linux", "arch": "amd64"}]}]}'
    )
    status, body = await proxy.json(INDEX)
    assert status == 200 and body == {"versions": {"2.0.0": {}}}
    assert registry.count("/moved/providers/acme/foo/versions") == 1


async def test_a_failed_early_fetch_is_the_fetch_and_is_not_made_twice(proxy, registry):
    registry.faults[VERSIONS] = Fault(status=503, body=b"down")
    status, body = await proxy.json(INDEX)
    assert (status, body["code"]) == (502, "upstream_status")
    assert registry.count(VERSIONS) == 2  # the early fetch and its one retry; not fetched once more


async def test_a_download_document_starts_the_release_sums_the_client_asks_for_next(proxy, registry):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    sums = f"/files/acme/foo/1.0.0/{release.shasums_name}"
    download = f"/registry/{REGISTRY_HOST}/providers/v1/acme/foo/1.0.0/download/linux/amd64"
    status, document = await proxy.json(download)
    assert status == 200 and document["shasums_url"].endswith("/SHA256SUMS")
    await until(lambda: registry.count(sums) == 1 and registry.count(sums + ".sig") == 1)  # not asked for yet
    status, _, body = await proxy.get(download + "/SHA256SUMS")
    assert (status, body) == (200, release.shasums)
    status, _, body = await proxy.get(download + "/SHA256SUMS.sig")
    assert (status, body) == (200, release.signature)
    assert (registry.count(sums), registry.count(sums + ".sig")) == (1, 1)

    for _ in range(3):  # warm: nothing more is started or fetched
        assert (await proxy.json(download))[0] == 200
    assert (registry.count(sums), registry.count(sums + ".sig")) == (1, 1)
