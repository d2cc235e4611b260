"""The shared metadata store for a fleet of replicas: Redis via redis.asyncio.

Keys are `PREFIX:KEY` (see README, "Redis key schema"); every key has a TTL, the retention
period, renewed whenever the key is written or read (GETEX), so entries in use never expire
and an abandoned prefix drains by itself.
Values are the versioned JSON of `proxy.cache`, so a replica never crashes on a format
it does not know: it treats the entry as a miss.

Redis failure is not an outage: every call that fails marks the store down (logged once
per state change), answers like a miss, and for `retry_interval` seconds no call goes to
Redis at all, so requests are served from disk and upstream at full speed; then the next
call tries again and, if it works, the store is up again. No restart is needed.

`RedisFleetLocks` is the distributed half of single flight: a Redis lock with an owner
token and an expiry, renewed while the owner works; waiters poll a re-check (is the
result there now?) and take over when the lock is released or expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
import structlog
from redis.exceptions import LockError, RedisError

log = structlog.get_logger(__name__)
T = TypeVar("T")

DEFAULT_RETENTION = 90 * 86400.0
FAILURES = (RedisError, OSError, asyncio.TimeoutError)


class RedisStore:
    """MetadataStore on Redis, with a circuit breaker for outages."""

    def __init__(self, url: str, *, prefix: str, password: str | None = None,
                 retention: float = DEFAULT_RETENTION, retry_interval: float = 2.0,
                 ca_file: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        options: dict = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "health_check_interval": 15}
        if password:
            options["password"] = password
        if ca_file and url.startswith("rediss://"):
            options["ssl_ca_certs"] = ca_file
        self.client = aioredis.from_url(url, **options)
        self.prefix = prefix
        self._retention = retention
        self._retry_interval = retry_interval
        self._clock = clock
        self._up = True
        self._retry_at = 0.0
        self._problem: str | None = None

    @property
    def problem(self) -> str | None:
        """The last error while Redis is marked down (None while it works)."""
        return None if self._up else self._problem

    def key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    @property
    def available(self) -> bool:
        """False while the breaker is open (Redis failed recently)."""
        return self._up or self._clock() >= self._retry_at

    async def get(self, key: str) -> bytes | None:
        return await self._call(self.client.getex(self.key(key), ex=self._ttl()), None)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        pipeline = self.client.pipeline(transaction=False)
        for key in keys:
            pipeline.getex(self.key(key), ex=self._ttl())
        return await self._call(pipeline.execute(), [None] * len(keys))

    def _ttl(self) -> int:
        return max(1, int(self._retention))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        seconds = max(1, int(ttl)) if ttl is not None else self._ttl()
        await self._call(self.client.set(self.key(key), value, ex=seconds), None)

    async def delete(self, key: str) -> None:
        await self._call(self.client.delete(self.key(key)), None)

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        """Keys under this store's namespace (SCAN, never KEYS); raises if Redis is unavailable."""
        skip = len(self.prefix) + 1
        async for key in self.client.scan_iter(match=f"{self.prefix}:{prefix}*", count=500):
            name = key.decode() if isinstance(key, bytes) else key
            if not name.startswith(f"{self.prefix}:lock:"):
                yield name[skip:]

    async def ping(self) -> bool:
        # The readiness probe always asks Redis, so it also closes the breaker early.
        try:
            await self.client.ping()
        except FAILURES as exc:
            self._mark_down(exc)
            return False
        self._mark_up()
        return True

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(self, command: Awaitable[T], default: T) -> T:
        if not self.available:
            _discard(command)
            return default
        try:
            result = await command
        except FAILURES as exc:
            self._mark_down(exc)
            return default
        self._mark_up()
        return result

    def _mark_down(self, exc: BaseException) -> None:
        self._retry_at = self._clock() + self._retry_interval
        self._problem = f"Redis: {str(exc) or type(exc).__name__}"
        if self._up:
            self._up = False
            log.warning("redis.down", error=str(exc) or type(exc).__name__,
                        effect="serving from disk and upstream; retrying in the background")

    def _mark_up(self) -> None:
        if not self._up:
            self._up = True
            log.warning("redis.up", effect="shared metadata store in use again")


def _discard(command: Awaitable) -> None:
    if asyncio.iscoroutine(command):
        command.close()


class RedisFleetLocks:
    """Fleet-wide single flight over Redis locks (see module docstring)."""

    def __init__(self, store: RedisStore, *, ttl: float = 15.0, poll: float = 0.2) -> None:
        self._store = store
        self._ttl = ttl
        self._poll = poll

    @contextlib.asynccontextmanager
    async def hold(self, key: str, recheck: Callable[[], Awaitable[T | None]]) -> AsyncIterator[T | None]:
        """Yield an existing result found by `recheck`, or None when the caller must do the work.

        The caller owns the fleet lock while the block runs (or works without it while
        Redis is unavailable: in-process single flight still applies).
        """
        lock = self._store.client.lock(self._store.key(f"lock:{key}"), timeout=self._ttl,
                                       blocking=False, thread_local=False)
        owned, existing = False, None
        while self._store.available:
            try:
                owned = await lock.acquire(token=uuid.uuid4().hex)
            except FAILURES as exc:
                self._store._mark_down(exc)
                break
            existing = await recheck()
            if owned or existing is not None:
                break
            await asyncio.sleep(self._poll)
        renewer = asyncio.create_task(self._renew(lock, key)) if owned and existing is None else None
        try:
            yield existing
        finally:
            if renewer is not None:
                renewer.cancel()
            if owned:
                with contextlib.suppress(LockError, *FAILURES):
                    await lock.release()

    async def _renew(self, lock, key: str) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            try:
                await lock.reacquire()
            except LockError:
                log.warning("fleet_lock.lost", key=key, effect="another replica may fetch the same artifact")
                return
            except FAILURES:
                continue  # Redis blip: keep working, try again at the next interval
