"""The Redis client for `--redis-url`, however Redis is run: one server, a master watched by Sentinel, or a
Cluster (`proxy.config.RedisTarget`). Each gives the same commands (redis.asyncio's `Redis`, or its
`RedisCluster`), with the same timeouts and TLS, so `proxy.cache.redis` does not care which it has.

- One server: redis-py reads the URL itself, as it always did (a password in `--redis-password` wins).
- Sentinel: every new connection asks the sentinels where the master of `SERVICE` is now, and a
  connection still open to a master that was demoted fails its next write (READONLY) and is dropped,
  so the proxy follows a failover. Waiting for those alone would leave it writing to a demoted master
  until the sentinels reconfigure it, seconds during which its writes are lost; so a watcher also
  listens to the sentinels' `+switch-master` announcements and drops every connection to the old
  master at once. The sentinels have their own password (`--redis-sentinel-password`).
- Cluster: the client learns the slot map from the nodes given (any will do) and follows its changes
  (MOVED, ASK, a node lost: the map is read again and the command tried once more).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.asyncio import from_url as redis_from_url
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as ConnectionClosedError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy.config import RedisTarget

log = structlog.get_logger(__name__)

TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
HEALTH_CHECK_INTERVAL = 15
CLUSTER_CONNECTIONS_PER_NODE = 2**31  # unbounded, as a single server's pool: a burst is not an outage
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
        tls: dict[str, Any] = {"ssl_ca_certs": ca_file} if target.tls and ca_file else {}
        credentials: dict[str, Any] = {
            "username": target.username,
            "password": password or target.password,
        }
        if target.kind == "server":
            given = {"password": password} if password else {}
            self.client: Any = redis_from_url(
                target.url,
                **TIMEOUTS,
                health_check_interval=HEALTH_CHECK_INTERVAL,
                retry=stale_connection_retry(),
                **given,
                **tls,
            )
        elif target.kind == "sentinel":
            tls = {"ssl": True, **tls} if target.tls else {}
            self._sentinel = Sentinels(
                target.nodes,
                sentinel_kwargs={
                    **TIMEOUTS,
                    "health_check_interval": HEALTH_CHECK_INTERVAL,
                    "retry": stale_connection_retry(),
                    "password": sentinel_password,
                    **tls,
                },
            )
            self.client = self._sentinel.master_for(
                target.service,
                db=target.db,
                **TIMEOUTS,
                health_check_interval=HEALTH_CHECK_INTERVAL,
                retry=stale_connection_retry(),
                **credentials,
                **tls,
            )
        else:
            self.client = RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
                **TIMEOUTS,
                health_check_interval=HEALTH_CHECK_INTERVAL,
                retry=Retry(NoBackoff(), 1),  # after a node is lost: the slot map read again, one more try
                max_connections=CLUSTER_CONNECTIONS_PER_NODE,
                ssl=target.tls,
                **credentials,
                **tls,
            )

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
