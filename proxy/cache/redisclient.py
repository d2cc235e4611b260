"""The Redis client for `--redis-url`, however Redis is run: one server, a master watched by Sentinel, or a
Cluster (`proxy.values.RedisTarget`). Each gives the same commands (redis.asyncio's `Redis`, or its
`RedisCluster`), with the same timeouts and TLS, so `proxy.cache.redis` does not care which it has.

- One server: redis-py reads the URL itself, as it always did (a password in `--redis-password` wins).
- Sentinel: every new connection asks the sentinels where the master of `SERVICE` is now, and a
  connection still open to a master that was demoted fails its next write (READONLY) and is dropped,
  so the proxy follows a failover. The sentinels have their own password (`--redis-sentinel-password`).
- Cluster: the client learns the slot map from the nodes given (any will do) and follows its changes
  (MOVED, ASK, a node lost: the map is read again and the command tried once more).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import from_url as redis_from_url
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as ConnectionClosedError

from proxy.config import RedisTarget

TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
HEALTH_CHECK_INTERVAL = 15
CLUSTER_CONNECTIONS_PER_NODE = 2**31  # unbounded, as a single server's pool: a burst is not an outage


def stale_connection_retry() -> Retry:
    """A command whose pooled connection turns out closed is sent once more, on a new connection.

    After Redis restarts, every connection in the pool is dead and fails the first time it is used;
    without this each of them, one after the other as the pool rotated, marked Redis down again for
    the retry interval (`/readyz` flapped for half a minute). Redis really down refuses the new
    connection at once, so an outage still counts at the first command. Timeouts are not tried again:
    a Redis that does not answer would only be waited for twice. On Sentinel the new connection asks
    the sentinels for the master first, so a command that met a demoted master goes to the new one."""
    return Retry(NoBackoff(), 1, supported_errors=(ConnectionClosedError,))


class RedisConnection:
    """The client for a `RedisTarget` (`client`: redis.asyncio's `Redis` or `RedisCluster`) and what it
    needs besides (the sentinels), closed together by `close()`."""

    def __init__(
        self,
        target: RedisTarget,
        *,
        password: str | None = None,
        sentinel_password: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.target = target
        self._sentinel: Sentinel | None = None
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
            self._sentinel = Sentinel(
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

    async def close(self) -> None:
        await self.client.aclose()
        if self._sentinel is not None:
            await self._sentinel.aclose()
