"""`serve --max-store-size` in a real process: the flags reach the evictor, an archive over the cap goes
once its grace has passed, the next request fetches it again, and /metrics counts it."""

from __future__ import annotations

import re

from tests.conftest import REGISTRY_HOST
from tests.fakes.packages import Release
from tests.fakes.process import wait_for

ARCHIVE = f"/mirror/v1/{REGISTRY_HOST}/acme/big/1.0.0/linux_amd64/terraform-provider-big_1.0.0_linux_amd64.zip"
UPSTREAM = "/files/acme/big/1.0.0/terraform-provider-big_1.0.0_linux_amd64.zip"


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match is not None, f"{name} missing from /metrics"
    return float(match.group(1))


async def test_an_archive_over_the_cap_is_evicted_after_its_grace_and_fetched_again(
    in_process_proxy, connect, registry, signing_key
):
    registry.add(Release("acme", "big", "1.0.0", signing_key, platforms=("linux_amd64",), noise=64 * 1024))
    proc = await in_process_proxy(
        "--unsafe-short-timings", "--max-store-size", "1KiB", "--eviction-grace", "1s", "--eviction-interval", "200ms"
    )
    client = await connect(proc)
    objects = proc.data_dir / "archives" / "sha256"

    status, _, body = await client.get(ARCHIVE)
    assert status == 200 and registry.count(UPSTREAM) == 1
    await wait_for(lambda: not any(p.is_file() for p in objects.rglob("*")), 20, "the archive evicted")

    status, _, again = await client.get(ARCHIVE)  # its record is still there: a fresh, verified fetch
    assert status == 200 and again == body
    assert registry.count(UPSTREAM) == 2
    _, _, text = await client.get("/metrics")
    assert metric(text.decode(), "registry_proxy_store_evictions_total") >= 1
    assert metric(text.decode(), "registry_proxy_store_evicted_bytes_total") >= len(body)
    assert [e["sha256"] for e in proc.events("store.evicted")][:1] == [
        e["sha256"] for e in proc.events("archive.stored")
    ][:1]
