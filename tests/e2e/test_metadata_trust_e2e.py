"""Whoever can write to the fleet's Redis cannot make a real `terraform init` install other bytes.

A real proxy process on a real redis-server, the real `terraform` binary, and an attacker that is a
plain Redis client. It writes what a faulty or hostile neighbour of the fleet could: a value under
a key of another namespace (the remembered 404s), values without the seal, values sealed under
other keys, and garbage. The proxy must ignore every one of them (logging
`security.metadata_poisoned`), fetch again what it needs, and serve only the signed bytes.
"""

from __future__ import annotations

import io
import json
import ssl

import aiohttp
import pytest
import redis

from proxy.cache.sealed import unseal
from proxy.hashes import h1_of_zip, zh_hash
from tests.conftest import PROVIDER
from tests.e2e.test_network_mirror_e2e import locked_hashes, mirror_config, provider_tf
from tests.fakes.redis_server import METADATA_SECRET

pytestmark = pytest.mark.e2e

SECRET = METADATA_SECRET.encode()


@pytest.fixture
def prefix(tmp_path) -> str:
    return f"trust-{tmp_path.name[-12:]}"


@pytest.fixture
def attacker(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def redis_args(redis_server, prefix: str) -> tuple[str, ...]:
    return ("--redis-url", redis_server.url, "--redis-prefix", prefix, "--metadata-secret", METADATA_SECRET)


def h1_dir(data: bytes) -> str:
    return h1_of_zip(io.BytesIO(data))[1]


def installed_files(workdir, version: str) -> list[str]:
    """The files terraform unpacked for the provider `version` (linux_amd64)."""
    folder = workdir / ".terraform" / "providers" / PROVIDER / version / "linux_amd64"
    return sorted(path.name for path in folder.iterdir())


async def test_a_download_answer_planted_among_the_remembered_404s_cannot_downgrade_a_provider(
    proxy_process, registry, redis_server, attacker, prefix, terraform
):
    """Issue 18, item 1: 1.0.0's download answer, unsealed, under `negative:download:…/1.1.0/…`."""
    new = registry.releases[("acme", "foo")]["1.1.0"]
    proxy = await proxy_process(*redis_args(redis_server, prefix))
    first = terraform.workdir("first", provider_tf("1.0.0"))
    code, output = await terraform.init(first, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output

    source = f"download:{PROVIDER}/1.0.0/linux_amd64"
    sealed = attacker.get(f"{prefix}:{source}")
    assert sealed is not None, f"{source} is not in Redis"
    plain, why = unseal(SECRET, source, sealed)
    assert why == "" and b'"status": 200' in plain
    attacker.set(f"{prefix}:negative:download:{PROVIDER}/1.1.0/linux_amd64", plain)

    second = terraform.workdir("second", provider_tf("1.1.0"))
    code, output = await terraform.init(second, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert installed_files(second, "1.1.0") == ["terraform-provider-foo_v1.1.0"], "1.0.0 installed as 1.1.0"
    assert locked_hashes(second) == [h1_dir(new.zips["linux_amd64"])]
    assert await lock_hashes(proxy, "1.1.0") == {
        "h1": h1_dir(new.zips["linux_amd64"]),
        "zh": zh_hash(new.sha256("linux_amd64")),
    }
    poisoned = {event["key"] for event in proxy.events("security.metadata_poisoned")}
    assert f"negative:download:{PROVIDER}/1.1.0/linux_amd64" in poisoned


async def get(proxy, path: str) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path, ssl=context) as response:
        return response.status, await response.read()


async def lock_hashes(proxy, version: str, platform: str = "linux_amd64") -> dict[str, str]:
    """The `h1:` and `zh:` the proxy's lock endpoint gives for one platform of a version."""
    status, body = await get(proxy, f"/lock/v1/{PROVIDER}/{version}?platform={platform}")
    assert status == 200, body
    return json.loads(body)["platforms"][platform]
