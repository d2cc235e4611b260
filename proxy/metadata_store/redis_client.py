"""The Redis client for `--redis-url`, however Redis is run: one server, a master watched by Sentinel, or a
Cluster (`proxy.settings.config.RedisTarget`). Each gives the same commands (redis.asyncio's `Redis`, or its
`RedisCluster`), with the same timeouts and TLS, so `proxy.metadata_store.redis` does not care which it has.

- One server: redis-py reads the URL itself, as it always did (a password in `--redis-password` wins).
- Sentinel: every new connection asks the sentinels where the master of `SERVICE` is now, and a
  connection still open to a master that was demoted fails its next write (READONLY) and is dropped,
  so the proxy follows a failover. Waiting for those alone would leave it writing to a demoted master
  until the sentinels reconfigure it, seconds during which its writes are lost; so a watcher also
  listens to the sentinels' `+switch-master` announcements and drops every connection to the old
  master at once. The sentinels have their own password (`--redis-sentinel-password`).
- Cluster: the client learns the slot map from the nodes given (any will do) and follows its changes
  (MOVED, ASK, a node lost: the map is read again and the command tried once more).

Pools are unbounded: `proxy.metadata_store.redis.RedisStore` bounds the commands it has under way instead, the
same way for the three (redis-py's pools refuse a command past their size, and a refusal counted as
Redis failing). Over TLS every connection of a client shares one SSLContext (see `TlsConnection`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping
from typing import Any

import structlog
from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelManagedSSLConnection
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as ConnectionClosedError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.settings.config import RedisTarget

log = structlog.get_logger(__name__)

TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
HEALTH_CHECK_INTERVAL = 15
UNBOUNDED = 2**31  # connections a pool may open (redis-py 8's default, 100, refuses the 101st command)
WATCH_RETRY = 1.0  # seconds between rounds of attempts to listen to a sentinel
WATCH_READ = 5.0  # seconds one read of announcements waits (a sentinel gone silent: TCP keepalive, under a minute)


def stale_connection_retry() -> Retry:
    """A command whose pooled connection turns out closed is sent once more, on a new connection.

    After Redis restarts, every connection in the pool is dead and fails the first time it is used;
    without this each of them, one after the other as the pool rotated, marked Redis down again for
    the retry interval (`/readyz` flapped for half a minute). Redis really down refuses the new
    connection at once, so an outage still counts at the first command. Timeouts are not tried again:
    a Redis that does not answer would only be waited for twice. On Sentinel the new connection asks
    the sentinels for the master first, so a command that met a demoted master goes to the new one."""
    return Retry(NoBackoff(), 1, supported_errors=(ConnectionClosedError,))


class _SharedTlsContext:
    """A redis-py TLS connection that uses its client's one SSLContext. redis-py makes one per connection,
    which loads the system's CA store every time: some 40 ms of CPU on the event loop for each new
    connection, so that a burst of them (a pool growing, every connection remade after a failover) held
    the loop for seconds and ran into the connect timeout."""

    def __init__(self, *args: Any, tls_context: ssl.SSLContext, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ssl_context.context = tls_context  # what RedisSSLContext.get() hands out once it has made one


class TlsConnection(_SharedTlsContext, SSLConnection):
    """A TLS connection to a server, a sentinel or a cluster node, on the client's SSLContext."""


class SentinelTlsConnection(_SharedTlsContext, SentinelManagedSSLConnection):
    """A TLS connection to the master the sentinels name, on the client's SSLContext."""


def tls_context(options: Mapping[str, Any]) -> ssl.SSLContext:
    """The SSLContext redis-py makes for each connection with these `ssl_*` options (as a `rediss://` URL's
    query gives them: `ssl_ca_certs`, `ssl_certfile`...), made once, by redis-py's own code."""
    return SSLConnection(**options).ssl_context.get()


class Sentinels(Sentinel):
    """redis-py's Sentinel client, but for the error when no sentinel names a master: which sentinel answered
    what, in words (for `/readyz` and the log), where redis-py prints each sentinel client's whole repr."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[str] = []
        for number, sentinel in enumerate(self.sentinels):
            kwargs = sentinel.connection_pool.connection_kwargs
            address = f"{kwargs.get('host')}:{kwargs.get('port')}"
            try:
                masters = await sentinel.sentinel_masters()
            except (ConnectionClosedError, RedisTimeoutError) as exc:
                errors.append(f"{address}: {exc or type(exc).__name__}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[number] = sentinel, self.sentinels[0]  # ask it first next time
                return state["ip"], state["port"]
            errors.append(f"{address}: " + ("the master is down" if state else f"no master named {service_name!r}"))
        raise MasterNotFoundError(f"no master {service_name!r} at the sentinels: {'; '.join(errors)}")


def _options(**more: Any) -> dict[str, Any]:
    """What every connection pool of every setup is opened with."""
    return {
        **TIMEOUTS,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
        "retry": stale_connection_retry(),
        "max_connections": UNBOUNDED,
        **more,
    }


def server_client(target: RedisTarget, password: str | None, ca: dict[str, Any]) -> Redis:
    """One server: the URL as redis-py's `from_url` reads it (a `rediss://` query's `ssl_*` options included)."""
    options = parse_url(target.url)
    if password:
        options["password"] = password
    if target.tls:
        given = {name: value for name, value in options.items() if name.startswith("ssl_")}
        options.update(connection_class=TlsConnection, tls_context=tls_context({**given, **ca}))
    return Redis.from_pool(ConnectionPool(**_options(**options)))


def sentinel_client(
    target: RedisTarget, credentials: dict[str, Any], sentinel_password: str | None, ca: dict[str, Any]
) -> tuple[Sentinels, Redis]:
    """The sentinels, and a client of the master they name."""
    sentinels = Sentinels(target.nodes, sentinel_kwargs=_options(password=sentinel_password))
    tls: dict[str, Any] = {}
    if target.tls:
        tls = {"tls_context": tls_context(ca)}
        sentinels.sentinels = [
            Redis.from_pool(
                ConnectionPool(
                    **_options(host=host, port=port, password=sentinel_password, connection_class=TlsConnection, **tls)
                )
            )
            for host, port in target.nodes
        ]
        tls["connection_class"] = SentinelTlsConnection
    return sentinels, sentinels.master_for(target.service, **_options(db=target.db, **credentials, **tls))


def cluster_client(target: RedisTarget, credentials: dict[str, Any], ca: dict[str, Any]) -> RedisCluster:
    """A cluster client, starting from the nodes given; it retries itself (after a node is lost: the slot
    map read again, the command tried once more)."""
    options = _options(**credentials)
    del options["retry"]
    cluster = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        retry=Retry(NoBackoff(), 1),
        ssl=target.tls,
        **options,
    )
    if target.tls:
        # Nodes the cluster reveals are made from `connection_kwargs`; those given here are made already and
        # open their connections when first used (redis-py's maintenance notifications set them up the same).
        tls = {"tls_context": tls_context(ca)}
        cluster.connection_kwargs.update(connection_class=TlsConnection, **tls)
        for node in cluster.nodes_manager.startup_nodes.values():
            node.connection_class = TlsConnection
            node.connection_kwargs.update(tls)
    return cluster


class RedisConnection:
    """The client for a `RedisTarget` (`client`: redis.asyncio's `Redis` or `RedisCluster`) and what it
    needs besides (the sentinels and their watcher), closed together by `close()`."""

    def __init__(
        self,
        target: RedisTarget,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.target = target
        self._sentinel: Sentinels | None = None
        self._watcher: asyncio.Task | None = None
        ca = {"ssl_ca_certs": ca_file} if ca_file else {}
        credentials = {"username": target.username, "password": password or target.password}
        self.client: Any
        if target.kind == "server":
            self.client = server_client(target, password, ca)
        elif target.kind == "sentinel":
            self._sentinel, self.client = sentinel_client(target, credentials, sentinel_password, ca)
        else:
            self.client = cluster_client(target, credentials, ca)
        self._unready = target.cluster
        self._readying = asyncio.Lock()

    async def ready(self) -> None:
        """Before the first command: a cluster client learns the slot map, once. redis-py's does it on its
        first commands, and with many at once some of them failed on a connection closed under them
        (AttributeError on its `_writer`; a later refresh of the map has no such race)."""
        if self._unready:
            async with self._readying:
                if self._unready:
                    await self.client.initialize()
                    self._unready = False

    def follow_failovers(self) -> None:
        """On Sentinel, start listening to the sentinels' `+switch-master` (see module docstring); a no-op
        elsewhere, or when already listening. Needs a running event loop."""
        if self._sentinel is not None and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._follow_switches())

    async def _follow_switches(self) -> None:
        """Listen on one sentinel after the other, for as long as the client lives."""
        assert self._sentinel is not None
        while True:
            for sentinel in list(self._sentinel.sentinels):
                try:
                    await self._listen(sentinel)
                except (RedisError, OSError, TimeoutError):
                    pass  # that sentinel is unreachable: the next one
                except Exception:  # never let the watcher die: the client still follows by itself, later
                    log.exception("redis.sentinel_watch_failed")
            await asyncio.sleep(WATCH_RETRY)

    async def _listen(self, sentinel: Redis) -> None:
        service = self.target.service
        pubsub = sentinel.pubsub()
        try:
            await pubsub.subscribe("+switch-master")
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=WATCH_READ)
                if message is None:
                    continue
                data = message["data"]
                words = (data.decode() if isinstance(data, bytes) else str(data)).split()
                if words[:1] == [service]:  # SERVICE OLD-IP OLD-PORT NEW-IP NEW-PORT
                    log.warning("redis.master_switched", service=service, master=":".join(words[3:5]))
                    await self.client.connection_pool.disconnect()  # each connection asks for the master again
        finally:
            with contextlib.suppress(RedisError, OSError, TimeoutError):
                await pubsub.aclose()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self.client.aclose()
        if self._sentinel is not None:
            await self._sentinel.aclose()
