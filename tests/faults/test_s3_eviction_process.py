"""`serve --archive-store s3://… --max-store-size` in a real process: the least recently served object
leaves the bucket (not the one stored last), and the next request fetches and verifies it again."""

from __future__ import annotations

import hashlib
import time

from tests.conftest import REGISTRY_HOST
from tests.fakes.packages import Release
from tests.faults.test_eviction_process import metric

PREFIX = "archives/"
DAY = 86400


def paths(name: str) -> tuple[str, str]:
    """The mirror's archive URL of acme/NAME 1.0.0 linux_amd64, and the fake registry's download path."""
    filename = f"terraform-provider-{name}_1.0.0_linux_amd64.zip"
    return (
        f"/mirror/v1/{REGISTRY_HOST}/acme/{name}/1.0.0/linux_amd64/{filename}",
        f"/files/acme/{name}/1.0.0/{filename}",
    )


async def test_the_least_recently_served_object_leaves_the_bucket_and_comes_back(
    proxy_process, connect, registry, signing_key, s3_server, s3_bucket
):
    for name in ("alpha", "beta"):
        registry.add(Release("acme", name, "1.0.0", signing_key, platforms=("linux_amd64",), noise=64 * 1024))
    alpha, alpha_upstream = paths("alpha")
    beta, beta_upstream = paths("beta")
    # a grace that nothing outlasts before the test ages the objects; served times are written at most every
    # grace/2 per archive; two archives exceed the cap
    proc = await proxy_process(
        *s3_server.flags(s3_bucket),
        "--unsafe-short-timings",
        "--max-store-size",
        "100KiB",
        "--eviction-grace",
        "4s",
        "--eviction-interval",
        "200ms",
    )
    client = await connect(proc)

    status, _, alpha_body = await client.get(alpha)  # followed as it downloads: a serve too
    assert status == 200
    status, _, beta_body = await client.get(beta)  # stored last, over the cap: both within the grace
    assert status == 200
    alpha_key = PREFIX + hashlib.sha256(alpha_body).hexdigest()
    beta_key = PREFIX + hashlib.sha256(beta_body).hexdigest()
    assert s3_server.keys(s3_bucket) == sorted([alpha_key, beta_key])
    for key in (alpha_key, beta_key):  # both stored a day ago: only when each was last served counts
        s3_server.age(s3_bucket, key, DAY)

    deadline = time.monotonic() + 30
    while beta_key in s3_server.keys(s3_bucket):  # alpha, served on from the bucket, stays the more recent
        assert time.monotonic() < deadline, "beta was never evicted from the bucket"
        status, _, again = await client.get(alpha)
        assert (status, again) == (200, alpha_body)
    assert s3_server.keys(s3_bucket) == [alpha_key]
    assert [e["sha256"] for e in proc.events("store.evicted")] == [beta_key.removeprefix(PREFIX)]

    status, _, fetched = await client.get(beta)  # its record is still there: a fresh, verified fetch
    assert (status, fetched) == (200, beta_body)
    assert registry.count(beta_upstream) == 2 and registry.count(alpha_upstream) == 1
    assert beta_key in s3_server.keys(s3_bucket)
    _, _, text = await client.get("/metrics")
    assert metric(text.decode(), "registry_proxy_store_evictions_total") == 1
    assert metric(text.decode(), "registry_proxy_store_evicted_bytes_total") == len(beta_body)
