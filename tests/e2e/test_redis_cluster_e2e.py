"""The real `terraform init` through two proxy processes sharing a Redis Cluster (three masters, TLS, a password).

Every kind of key the proxy keeps lands on the cluster: documents and verified records spread over its
nodes, fleet locks, served times, and the remembered 404s with their bookkeeping, whose script uses them
together (one hash slot: `{PREFIX}:...`). Neither proxy may ever count Redis down: a CROSSSLOT refusal,
a MOVED it did not follow or a slot it could not reach would show as `redis.down`.
"""

from __future__ import annotations

import shutil
import ssl
import uuid

import aiohttp
import pytest

from proxy.metadata_store.keys import NEGATIVE, RedisNames
from tests.e2e.test_network_mirror_e2e import MAIN_TF, locked_hashes, mirror_config
from tests.fakes.redis_server import METADATA_SECRET

pytestmark = pytest.mark.e2e

UNKNOWN = "/mirror/v1/registry.example.test/acme/nothing-here/index.json"


async def get(proxy, path: str) -> int:
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path, ssl=context) as response:
        return response.status


async def test_init_through_a_proxy_on_a_cluster_then_offline_through_another(
    proxy_process, redis_cluster, registry, terraform, tmp_path
):
    prefix = f"cluster-{uuid.uuid4().hex[:8]}"
    args = (*redis_cluster.proxy_args(), "--redis-prefix", prefix, "--metadata-secret", METADATA_SECRET)
    shared = tmp_path / "shared-data"
    a = await proxy_process(*args, "--workers", "2", data_dir=shared)
    b = await proxy_process(*args, data_dir=shared)

    first = terraform.workdir("a", MAIN_TF)
    code, output = await terraform.init(first, mirror_config(a), a.ca_file)
    assert code == 0, output
    assert await get(a, UNKNOWN) == 404  # remembered by the fleet, on the cluster

    with redis_cluster.client() as cluster:
        names = RedisNames(prefix, cluster=True)
        stored = [key.decode() for key in cluster.scan_iter(match=f"{prefix}:*")]
        assert any(key.startswith(f"{prefix}:archive:") for key in stored), stored
        assert any(key.startswith(f"{prefix}:sums:") for key in stored), stored
        negatives = [key.decode() for key in cluster.scan_iter(match=names.name(NEGATIVE.key("*")))]
        assert len(negatives) == 1 and negatives[0].startswith(f"{{{prefix}}}:negative:"), negatives
        nodes = {cluster.get_node_from_key(key).name for key in stored}
        assert len(nodes) > 1, "the proxy's keys should spread over the cluster's nodes"

    await registry.stop()
    second = terraform.workdir("b", MAIN_TF)
    shutil.copy(first / ".terraform.lock.hcl", second / ".terraform.lock.hcl")
    code, output = await terraform.init(second, mirror_config(b), b.ca_file)
    assert code == 0, output
    assert locked_hashes(second) == locked_hashes(first)
    assert await get(b, UNKNOWN) == 404  # the upstream is gone: the fleet's remembered 404 answers
    for proxy in (a, b):
        assert proxy.events("redis.down") == [], proxy.events("redis.down")
