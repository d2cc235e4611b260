"""The Sentinel and Cluster URL forms without TLS, the password given apart (`--redis-password`), what a
wrong password does (Redis counts as down with the reason, nothing crashes), and what TLS costs a burst.

(The session's Sentinel and Cluster setups, which the contract suites and the failover tests use, run with
TLS and the passwords in the URL.)
"""

from __future__ import annotations

import asyncio
import ssl
import uuid

import pytest

from proxy.metadata_store import CacheEntry
from proxy.metadata_store.redis import RedisFleetLocks, RedisNegatives, RedisStore
from proxy.metadata_store.sealed import Seal, SealedStore
from tests.fakes.redis_server import ClusterSetup, RedisServer, SentinelSetup, Tls

SECRET = b"setups-secret-0123456789"


@pytest.fixture(scope="module")
def plain_sentinel(tmp_path_factory) -> SentinelSetup:
    setup = SentinelSetup(
        tmp_path_factory.mktemp("plain-sentinel"),
        service="plain",
        password=uuid.uuid4().hex,
        sentinel_password=uuid.uuid4().hex,
    )
    setup.start()
    yield setup
    setup.stop()


@pytest.fixture(scope="module")
def plain_cluster(tmp_path_factory) -> ClusterSetup:
    setup = ClusterSetup(tmp_path_factory.mktemp("plain-cluster"), password=uuid.uuid4().hex)
    setup.start()
    yield setup
    setup.stop()


def without_password(setup) -> str:
    url = setup.url.replace(f":{setup.password}@", "")
    assert url.startswith(("redis+sentinel://", "redis+cluster://")) and setup.password not in url
    return url


async def nothing() -> None:
    return None


@pytest.mark.parametrize("name", ["plain_sentinel", "plain_cluster"])
async def test_a_store_without_tls_and_with_the_password_given_apart(request, name):
    setup = request.getfixturevalue(name)
    store = RedisStore(
        without_password(setup),
        prefix=f"plain-{uuid.uuid4().hex[:8]}",
        password=setup.password,
        **setup.store_options(),
    )
    seal = Seal(SECRET, store="redis")
    sealed = SealedStore(store, seal)
    await sealed.set("versions:h/acme/foo", b"document")
    assert await sealed.get("versions:h/acme/foo") == b"document"
    negatives = RedisNegatives(store, seal, 10, 1 << 20, 3600)
    gone = CacheEntry(404, b"", "https://h/v1/providers/acme/nope/versions", 1.0).encode()
    await negatives.put("versions:h/acme/nope", gone)
    assert await negatives.get("versions:h/acme/nope") == gone
    async with RedisFleetLocks(store).hold("archive:h/acme/foo", nothing) as existing:
        assert existing is None
    assert await store.ping() and store.problem is None
    await store.close()


@pytest.mark.parametrize(
    ("name", "wrong", "reason"),
    [
        ("plain_sentinel", {"sentinel_password": "wrong"}, ": invalid username-password pair"),
        ("plain_sentinel", {"password": "wrong"}, "invalid username-password pair"),
        ("plain_cluster", {"password": "wrong"}, "invalid username-password pair"),
    ],
)
async def test_a_wrong_password_is_redis_down_with_the_reason_in_words(request, name, wrong, reason):
    setup = request.getfixturevalue(name)
    options = {**setup.store_options(), **wrong}
    store = RedisStore(without_password(setup), prefix="wrong", **options)
    assert await store.get("versions:h/acme/foo") is None
    assert not await store.ping()
    assert reason in (store.problem or "") and len(store.problem) < 300, store.problem
    await store.close()


async def test_a_wrong_master_name_is_redis_down_with_the_reason_in_words(plain_sentinel):
    url = without_password(plain_sentinel).replace("/plain", "/mymaster")
    store = RedisStore(url, prefix="wrong", password=plain_sentinel.password, **plain_sentinel.store_options())
    assert not await store.ping()
    sentinel = f"127.0.0.1:{plain_sentinel.sentinel_port}"
    assert store.problem == f"Redis: no master 'mymaster' at the sentinels: {sentinel}: no master named 'mymaster'"
    await store.close()


@pytest.fixture
def tls_server(tmp_path, server_cert_files, ca_file) -> RedisServer:
    server = RedisServer(tmp_path / "tls-redis", password=uuid.uuid4().hex, tls=Tls(*server_cert_files, ca_file))
    server.start()
    yield server
    server.stop()


def connected_clients(setup) -> int:
    servers = setup.nodes if isinstance(setup, ClusterSetup) else [setup] if isinstance(setup, RedisServer) else []
    servers = servers or [setup.master()]
    return sum(server.info("clients")["connected_clients"] for server in servers)


@pytest.mark.process
@pytest.mark.parametrize("name", ["tls_server", "redis_sentinel", "redis_cluster"])
async def test_a_burst_of_new_tls_connections_makes_no_new_tls_context(request, monkeypatch, name):
    """redis-py makes an SSLContext per connection, loading the system's CA store each time (some 40 ms of
    the event loop per connection: a burst of them ran into the connect timeout and counted as Redis
    failing). The store's client makes one, and its connections share it."""
    setup = request.getfixturevalue(name)
    made: list[ssl.SSLContext] = []
    original = ssl.create_default_context

    def counted(*args, **kwargs) -> ssl.SSLContext:
        made.append(original(*args, **kwargs))
        return made[-1]

    before = connected_clients(setup)
    monkeypatch.setattr(ssl, "create_default_context", counted)
    store = setup.open_store(prefix=f"tls-{uuid.uuid4().hex[:8]}")
    await asyncio.gather(*(store.get(f"versions:h/acme/p{n}") for n in range(48)))
    monkeypatch.undo()
    assert len(made) == 1, f"{len(made)} TLS contexts made"
    assert connected_clients(setup) - before >= 16, "the burst should have opened many connections"
    assert await store.ping() and store.problem is None
    await store.close()
