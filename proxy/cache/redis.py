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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

import redis.asyncio as aioredis
import structlog
from redis.exceptions import LockError, RedisError

from proxy.cache.breaker import Breaker
from proxy.cache.keys import FLEET_LOCK, NEGATIVE, NEGATIVE_BOOKKEEPING, SERVED
from proxy.cache.sealed import Seal

log = structlog.get_logger(__name__)
T = TypeVar("T")

DEFAULT_RETENTION = 90 * 86400.0
# fleet locks and remembered 404s are never exported
_NOT_LISTED = (FLEET_LOCK.prefix, NEGATIVE.prefix, *NEGATIVE_BOOKKEEPING, SERVED)
FAILURES = (RedisError, OSError, asyncio.TimeoutError)


class RedisStore:
    """MetadataStore on Redis, with a circuit breaker for outages."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        password: str | None = None,
        retention: float = DEFAULT_RETENTION,
        retry_interval: float = 2.0,
        ca_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        options: dict = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0, "health_check_interval": 15}
        if password:
            options["password"] = password
        if ca_file and url.startswith("rediss://"):
            options["ssl_ca_certs"] = ca_file
        self.client = aioredis.from_url(url, **options)
        self.prefix = prefix
        self._retention = retention
        self._breaker = Breaker(retry_interval, clock)

    @property
    def problem(self) -> str | None:
        """The last error while Redis is marked down (None while it works)."""
        return self._breaker.problem

    def key(self, key: str) -> str:
        return f"{self.prefix}:{key}"

    @property
    def available(self) -> bool:
        """False while the breaker is open (Redis failed recently)."""
        return self._breaker.available

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
        """Keys under this store's namespace but for locks and negatives (SCAN, never KEYS); raises if Redis
        is unavailable."""
        skip = len(self.prefix) + 1
        async for key in self.client.scan_iter(match=f"{self.prefix}:{prefix}*", count=500):
            name = key.decode() if isinstance(key, bytes) else key
            if not name[skip:].startswith(_NOT_LISTED):
                yield name[skip:]

    async def note_served(self, times: Mapping[str, float]) -> None:
        """ZADD GT into `PREFIX:served` (a later time wins, whichever replica wrote first); the set
        expires after the retention like every key, renewed by each write."""
        if not times:
            return
        pipeline = self.client.pipeline(transaction=False)
        pipeline.zadd(self.key(SERVED), dict(times), gt=True)
        pipeline.expire(self.key(SERVED), self._ttl())
        await self._call(pipeline.execute(), None)

    async def served_times(self) -> dict[str, float]:
        """The whole `PREFIX:served` set (ZSCAN, never one huge reply); raises if Redis is unavailable."""
        found: dict[str, float] = {}
        async for member, score in self.client.zscan_iter(self.key(SERVED), count=1000):
            found[member.decode() if isinstance(member, bytes) else member] = float(score)
        return found

    async def forget_served(self, sha256s: Iterable[str]) -> None:
        members = list(sha256s)
        if members:
            await self._call(self.client.zrem(self.key(SERVED), *members), None)

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
        if self._breaker.trip(f"Redis: {str(exc) or type(exc).__name__}"):
            log.warning(
                "redis.down",
                error=str(exc) or type(exc).__name__,
                effect="serving from disk and upstream; retrying in the background",
            )

    def _mark_up(self) -> None:
        if self._breaker.reset():
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
        lock = self._store.client.lock(
            self._store.key(FLEET_LOCK.key(key)), timeout=self._ttl, blocking=False, thread_local=False
        )
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


# KEYS: sorted set of negative keys by write time, hash of their sizes, counter of total bytes.
# ARGV: entry key prefix, op ("put" or "discard"), key, value, retention, now, max entries, max bytes.
# Returns {entries, bytes} after the change. Every key it writes expires after the retention.
_NEGATIVES_SCRIPT = """
local zset, sizes, total = KEYS[1], KEYS[2], KEYS[3]
local prefix, op, key, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, now = tonumber(ARGV[5]), tonumber(ARGV[6])
local max_entries, max_bytes = tonumber(ARGV[7]), tonumber(ARGV[8])
local function forget(member)
  redis.call('DEL', prefix .. member)
  redis.call('DECRBY', total, tonumber(redis.call('HGET', sizes, member) or '0'))
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', zset, member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', zset, '-inf', now - retention, 'LIMIT', 0, 512)) do
  forget(member)
end
forget(key)
local size = #key + #value
if op == 'put' and size <= max_bytes then
  local seconds = math.max(1, math.ceil(retention))
  redis.call('SET', prefix .. key, value, 'EX', seconds)
  redis.call('ZADD', zset, now, key)
  redis.call('HSET', sizes, key, size)
  redis.call('INCRBY', total, size)
  for _, name in ipairs(KEYS) do redis.call('EXPIRE', name, seconds) end
end
while redis.call('ZCARD', zset) > max_entries or tonumber(redis.call('GET', total) or '0') > max_bytes do
  local oldest = redis.call('ZRANGE', zset, 0, 0)[1]
  if not oldest then break end
  forget(oldest)
end
return {redis.call('ZCARD', zset), tonumber(redis.call('GET', total) or '0')}
"""


class RedisNegatives:
    """The fleet's remembered 404s (see proxy.cache.negative): `PREFIX:negative:KEY`, each with the short
    retention as its TTL (reads do not renew it), bounded in count and bytes by one atomic script that
    evicts the least recently written first. Every value is sealed with `seal` under its own name,
    `negative:KEY`, like the values of the other namespaces: what a read cannot open is refused (and
    reported by the seal), so an entry written by anyone but the fleet, or moved from another key, is a
    miss. Bookkeeping: `PREFIX:negatives` (sorted set by write time), `PREFIX:negatives:sizes`,
    `PREFIX:negatives:bytes`. Redis down: nothing is remembered (a miss)."""

    def __init__(
        self,
        store: RedisStore,
        seal: Seal,
        max_entries: int,
        max_bytes: int,
        retention: float,
        *,
        report: Callable[[int, int], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._seal = seal
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._retention = retention
        self._report = report
        self._clock = clock
        self._script = store.client.register_script(_NEGATIVES_SCRIPT)
        self._keys = [store.key(name) for name in NEGATIVE_BOOKKEEPING]

    def _entry(self, key: str) -> str:
        return self._store.key(NEGATIVE.key(key))

    async def get(self, key: str) -> bytes | None:
        return self._seal.open(
            NEGATIVE.key(key), await self._store._call(self._store.client.get(self._entry(key)), None)
        )

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        default: list[bytes | None] = [None] * len(keys)
        found = await self._store._call(self._store.client.mget([self._entry(k) for k in keys]), default)
        return [self._seal.open(NEGATIVE.key(key), raw) for key, raw in zip(keys, found, strict=True)]

    async def put(self, key: str, value: bytes) -> None:
        await self._run("put", key, self._seal.close(NEGATIVE.key(key), value))

    async def discard(self, key: str) -> None:
        await self._run("discard", key, b"")

    async def expired(self, now: float | None = None) -> list[tuple[str, int]]:
        """Remembered 404s past the retention that the bookkeeping still counts (their entries expired by
        TTL; the next write drops up to 512 of them), with their sizes; raises if Redis is unavailable."""
        cutoff = (self._clock() if now is None else now) - self._retention
        zset, sizes = self._keys[0], self._keys[1]
        members = await self._store.client.zrangebyscore(zset, "-inf", f"({cutoff}")
        names = [m.decode() if isinstance(m, bytes) else m for m in members]
        found = await self._store.client.hmget(sizes, names) if names else []
        return [(name, int(size or 0)) for name, size in zip(names, found, strict=True)]

    async def _run(self, op: str, key: str, value: bytes) -> None:
        args = [
            self._store.key(NEGATIVE.prefix),
            op,
            key,
            value,
            self._retention,
            self._clock(),
            self._max_entries,
            self._max_bytes,
        ]
        counts = await self._store._call(self._script(keys=self._keys, args=args), None)
        if counts is not None and self._report is not None:
            self._report(int(counts[0]), int(counts[1]))
