"""The shared metadata store for a fleet of replicas: Redis via redis.asyncio.

Keys are `PREFIX:KEY` (see docs/operations.md, "Redis key schema"); every key has a TTL, the retention
period, renewed whenever the key is written or read (GETEX), so entries in use never expire
and an abandoned prefix drains by itself; but for the records a security decision depends on (`keys.KEPT`:
first-seen times, baselines, a provider's signing keys), which are written without one and read with GETEX
PERSIST: an expired or evicted one would make ages unknown (held back by default) or a known key unknown.
Values are the versioned JSON of `proxy.metadata_store`, sealed (`proxy.metadata_store.sealed`), so a replica never
crashes on a format it does not know, nor uses a value it cannot authenticate: either is a miss.

Redis failure is not an outage: every call that fails (after one more try on a new connection
when its pooled one was closed, e.g. by a Redis restart) marks the store down (logged once per
state change), answers like a miss, and for `retry_interval` seconds no call goes to Redis at
all, so requests are served from disk and upstream at full speed; then the next call tries
again and, if it works, the store is up again. No restart is needed.

A key of this store's namespace that holds what the proxy never writes there (another Redis type,
or text where a counter belongs: Redis answers WRONGTYPE or "not an integer") is poison, not an
outage: it is refused like a value that fails its seal (`refuse`, logged as
`security.metadata_poisoned`), deleted so the next write starts it afresh, and read as a miss.

`RedisFleetLocks` is the distributed half of single flight: a Redis lock with an owner
token and a short lease (`--fleet-lock-ttl`, 2 s), renewed while the owner works; waiters
poll a re-check (is the result there now?) and take over when the lock is released or its
lease runs out: within about a lease of the owner's death.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from proxy.metadata_store import Refuse
from proxy.metadata_store.breaker import Breaker
from proxy.metadata_store.keys import FLEET_LOCK, FLEET_SECRET, NEGATIVE, NEGATIVE_BOOKKEEPING, SERVED, RedisNames, kept
from proxy.metadata_store.redis_client import RedisConnection
from proxy.metadata_store.sealed import Seal
from proxy.settings.config import parse_redis_target

log = structlog.get_logger(__name__)
T = TypeVar("T")

DEFAULT_RETENTION = 90 * 86400.0
# Commands a store has under way at once; more wait for one to finish. So a burst of requests opens at most
# this many connections (each pool would open more, or refuse: redis-py 8's refuses its 101st, which
# counted as Redis failing), the same on one server, Sentinel and Cluster.
IN_FLIGHT = 64
# fleet locks, remembered 404s and the fleet's secret marker are never exported
_NOT_LISTED = (FLEET_LOCK.prefix, NEGATIVE.prefix, *NEGATIVE_BOOKKEEPING, SERVED, FLEET_SECRET)
_NOT_SEALED = (FLEET_LOCK.prefix, *NEGATIVE_BOOKKEEPING, SERVED)
_UNANSWERED = object()
# RedisClusterException: a Redis Cluster none of whose nodes answers, or whose slots are not all served
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
FAILURES = (RedisError, RedisClusterException, OSError, asyncio.TimeoutError)
DURABILITY = ("maxmemory", "maxmemory-policy", "save", "appendonly")  # `RedisStore.durability`
_POISON = ("WRONGTYPE", "value is not an integer", "value is not a valid float")  # Redis's words for them


def _raised_by_a_library(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc` lies outside this package (in redis-py or asyncio)."""
    trace = exc.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return trace is not None and not trace.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR)


def is_poison(exc: BaseException) -> bool:
    """Whether Redis refused a command because a key holds what the proxy never writes there."""
    return isinstance(exc, ResponseError) and any(words in str(exc) for words in _POISON)  # a pipeline prefixes them


class RedisStore:
    """MetadataStore on Redis (one server, Sentinel or Cluster: `url`, see `proxy.metadata_store.redis_client`), with a
    circuit breaker for outages."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        password: str | None = None,
        sentinel_password: str | None = None,
        ca_file: str | None = None,
        retention: float = DEFAULT_RETENTION,
        retry_interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        refuse: Refuse | None = None,
    ) -> None:
        target = parse_redis_target(url)
        self._connection = RedisConnection(
            target, password=password, sentinel_password=sentinel_password, ca_file=ca_file
        )
        self.client = self._connection.client
        self.names = RedisNames(prefix, cluster=target.cluster)
        self.prefix = prefix
        self._retention = retention
        self._breaker = Breaker(retry_interval, clock)
        self._refuse = refuse
        self._slots = asyncio.Semaphore(IN_FLIGHT)
        self._swap = self.client.register_script(_SWAP)

    @property
    def problem(self) -> str | None:
        """The last error while Redis is marked down (None while it works)."""
        return self._breaker.problem

    async def limited(self, command: Awaitable[T]) -> T:
        """`command`'s result, once the client is ready and fewer than IN_FLIGHT of this store's commands are
        under way."""
        try:
            await self._connection.ready()
        except BaseException:
            _discard(command)
            raise
        async with self._slots:
            try:
                return await command
            except AttributeError as exc:
                if not _raised_by_a_library(exc):
                    raise
                # redis-py over TLS: a connection closed while a command is written to it raises
                # AttributeError from asyncio's SSL transport (seen on a loaded Cluster); that is Redis failing
                raise RedisConnectionError(f"Redis connection lost: {exc}") from exc

    def key(self, key: str) -> str:
        """The Redis name of `key` (`PREFIX:KEY`; see `RedisNames` for a Cluster's)."""
        return self.names.name(key)

    def follow_failovers(self) -> None:
        """On Sentinel, follow a new master as soon as the sentinels announce it
        (`proxy.metadata_store.redis_client`)."""
        self._connection.follow_failovers()

    @property
    def available(self) -> bool:
        """False while the breaker is open (Redis failed recently)."""
        return self._breaker.available

    async def get(self, key: str) -> bytes | None:
        if kept(key):
            return await self._call(self.client.getex(self.key(key), persist=True), None, keys=(key,))
        return await self._call(self.client.getex(self.key(key), ex=self._ttl()), None, keys=(key,))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return await self.read_many(keys, self._read_renewing)

    def _read_renewing(self, pipeline: Any, name: str) -> object:
        """GETEX renewing the retention, or removing any TTL from a kept record's name."""
        if kept(self.names.key(name)):
            return pipeline.getex(name, persist=True)
        return pipeline.getex(name, ex=self._ttl())

    async def read_many(self, keys: list[str], read: Callable[[Any, str], object]) -> list[bytes | None]:
        """The values under `keys`, read in one pipeline by `read(pipeline, prefixed name)`; a key that is
        poison is refused and deleted (a miss), as in `_call`."""
        if not keys:
            return []
        pipeline = self.client.pipeline(transaction=False)
        for key in keys:
            read(pipeline, self.key(key))
        found = await self._call(pipeline.execute(raise_on_error=False), [None] * len(keys))
        failed = next((value for value in found if isinstance(value, Exception) and not is_poison(value)), None)
        if failed is not None:
            self._mark_down(failed)
            return [None] * len(keys)
        for key, value in zip(keys, found, strict=True):
            if isinstance(value, Exception):
                await self._poisoned((key,), value)
        return [None if isinstance(value, Exception) else value for value in found]

    def _ttl(self) -> int:
        return max(1, int(self._retention))

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        if kept(key):  # a record a policy depends on never expires, whatever the caller asks
            await self._call(self.client.set(self.key(key), value), None)
            return
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

    async def sealed_keys(self) -> AsyncIterator[str]:
        """Every key whose value the seal wrote, remembered 404s included, the marker aside (for `rotate-secret`;
        SCAN, never KEYS); raises if Redis is unavailable."""
        seen: set[str] = set()
        for pattern in dict.fromkeys((self.key("*"), self.key(NEGATIVE.key("*")))):
            async for name in self.client.scan_iter(match=pattern, count=500):
                key = self.names.key(name.decode() if isinstance(name, bytes) else name)
                if key not in seen and key != FLEET_SECRET and not key.startswith(_NOT_SEALED):
                    seen.add(key)
                    yield key

    async def get_kept(self, key: str) -> bytes | None:
        """The value under `key`, its expiry (or none) left as it is."""
        return await self._call(self.client.get(self.key(key)), None, keys=(key,))

    async def add(self, key: str, value: bytes) -> bool | None:
        """Write `value` under `key`, never to expire, unless a value is there (SET NX): whether it was written,
        None when Redis did not answer."""
        written = await self._call(self.client.set(self.key(key), value, nx=True), _UNANSWERED, keys=(key,))
        return None if written is _UNANSWERED else bool(written)

    async def swap(self, key: str, old: bytes, new: bytes) -> bool | None:
        """Replace `old` by `new` under `key`, keeping its expiry, only if `old` is still there (one script):
        whether it was replaced, None when Redis did not answer."""
        swapped = await self._call(self._swap(keys=[self.key(key)], args=[old, new]), _UNANSWERED, keys=(key,))
        return None if swapped is _UNANSWERED else bool(swapped)

    async def note_served(self, times: Mapping[str, float]) -> None:
        """ZADD GT into `PREFIX:served` (a later time wins, whichever replica wrote first); the set
        expires after the retention like every key, renewed by each write."""
        if not times:
            return
        pipeline = self.client.pipeline(transaction=False)
        pipeline.zadd(self.key(SERVED), dict(times), gt=True)
        pipeline.expire(self.key(SERVED), self._ttl())
        await self._call(pipeline.execute(), None, keys=(SERVED,))

    async def served_times(self) -> dict[str, float]:
        """The whole `PREFIX:served` set (ZSCAN, never one huge reply); raises if Redis is unavailable."""
        found: dict[str, float] = {}
        async for member, score in self.client.zscan_iter(self.key(SERVED), count=1000):
            found[member.decode() if isinstance(member, bytes) else member] = float(score)
        return found

    async def forget_served(self, sha256s: Iterable[str]) -> None:
        members = list(sha256s)
        if members:
            await self._call(self.client.zrem(self.key(SERVED), *members), None, keys=(SERVED,))

    async def ping(self) -> bool:
        # The readiness probe always asks Redis, so it also closes the breaker early.
        try:
            await self.limited(self.client.ping())
        except FAILURES as exc:
            self._mark_down(exc)
            return False
        self._mark_up()
        return True

    async def close(self) -> None:
        await self._connection.close()

    async def durability(self) -> dict[str, str] | None:
        """What decides whether this Redis keeps what it is given: `maxmemory`, `maxmemory-policy`, `save`,
        `appendonly` (CONFIG GET); None when they cannot be read (CONFIG refused or renamed: a managed Redis)."""
        found: dict[str, str] = {}
        try:
            await self._connection.ready()
            for name in DURABILITY:
                answer = await self.client.config_get(name)
                value = answer.get(name) if isinstance(answer, dict) else None
                if value is None:
                    return None
                found[name] = value.decode() if isinstance(value, bytes) else str(value)
        except (*FAILURES, AttributeError) as exc:
            log.info("redis.config_unreadable", error=str(exc))
            return None
        return found

    async def _call(self, command: Awaitable[T], default: T, *, keys: Iterable[str] = ()) -> T:
        """`command`'s result, or `default` while Redis fails (the breaker) or when one of `keys` is poison."""
        if not self.available:
            _discard(command)
            return default
        try:
            result = await self.limited(command)
        except FAILURES as exc:
            if not is_poison(exc):
                self._mark_down(exc)
                return default
            self._mark_up()  # Redis answered
            await self._poisoned(keys, exc)
            return default
        self._mark_up()
        return result

    def refused(self, key: str, why: str) -> None:
        """Report `key` as holding what the proxy never writes there (`why`), through `refuse`."""
        if self._refuse is not None:
            self._refuse(key, why, "wrong_type")

    async def _poisoned(self, keys: Iterable[str], exc: BaseException) -> None:
        """Refuse and delete `keys`, one of which made Redis answer `exc` (see module docstring)."""
        names = list(keys)
        for key in names:
            self.refused(key, f"holds what the proxy never writes there (Redis: {exc})")
        if names:
            await self._call(self.client.delete(*(self.key(key) for key in names)), None)

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


# KEYS[1]: a fleet lock. ARGV: the taker's token, the lease in ms. Returns {1} when taken; else {0, the lock's
# remaining ms before this call}, having cut a lock that would outlive a lease (no expiry: never written
# by a proxy; longer: a holder that set a longer lease) down to one lease: a lock lives only while renewed.
_LEASE_TAKE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end
local left = redis.call('PTTL', KEYS[1])
if left == -1 or left > tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return {0, left}
"""
# KEYS[1]: a fleet lock. ARGV: the holder's token, the lease in ms. 1 when renewed, 0 when no longer held.
_LEASE_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS[1]: a fleet lock. ARGV[1]: the holder's token. Deleted only if still held with it.
_LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS[1]: a sealed value. ARGV: the value expected there, its replacement (same expiry). 1 when replaced.
_SWAP = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL') return 1 end
return 0
"""
RENEWALS_PER_LEASE = 4  # a holder survives three renewals lost in a row (a Redis blip, a busy event loop)


class RedisFleetLocks:
    """Fleet-wide single flight over Redis leases (see module docstring).

    A lock is `PREFIX:lock:KEY` holding its holder's random token, set for one `lease` and renewed every
    quarter of it while the holder works. A holder that dies (kill -9, a lost host) stops renewing, so
    its lock is gone at most one lease later and a waiter, polling every `poll` seconds, takes over. A
    lock that would outlive a lease without renewal (no expiry: planted; or set with a longer lease) is
    cut down to one by the next waiter, so no key anyone writes can make waiters wait longer.
    """

    def __init__(self, store: RedisStore, *, ttl: float = 2.0, poll: float = 0.2) -> None:
        self._store = store
        self._lease_ms = max(1, int(ttl * 1000))
        self._poll = poll
        client = store.client
        self._take = client.register_script(_LEASE_TAKE)
        self._renew_script = client.register_script(_LEASE_RENEW)
        self._release = client.register_script(_LEASE_RELEASE)

    @contextlib.asynccontextmanager
    async def hold(self, key: str, recheck: Callable[[], Awaitable[T | None]]) -> AsyncIterator[T | None]:
        """Yield an existing result found by `recheck`, or None when the caller must do the work.

        The caller owns the fleet lock while the block runs (or works without it while
        Redis is unavailable: in-process single flight still applies).
        """
        name, token = FLEET_LOCK.key(key), uuid.uuid4().hex
        lock = self._store.key(name)
        owned, existing = False, None
        while self._store.available:
            try:
                taken = await self._store.limited(self._take(keys=[lock], args=[token, self._lease_ms]))
            except FAILURES as exc:
                self._store._mark_down(exc)
                break
            owned = taken[0] == 1
            if not owned and taken[1] == -1:
                self._store.refused(name, "a fleet lock without expiry (a proxy always sets one): cut to one lease")
            existing = await recheck()
            if owned or existing is not None:
                break
            await asyncio.sleep(self._poll)
        renewer = asyncio.create_task(self._renew(lock, token, key)) if owned and existing is None else None
        try:
            yield existing
        finally:
            if renewer is not None:
                renewer.cancel()
            if owned:
                with contextlib.suppress(*FAILURES):
                    await self._store.limited(self._release(keys=[lock], args=[token]))

    async def _renew(self, lock: str, token: str, key: str) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 1000 / RENEWALS_PER_LEASE)
            try:
                renewed = await self._store.limited(self._renew_script(keys=[lock], args=[token, self._lease_ms]))
            except FAILURES:
                continue  # Redis blip: keep working, try again at the next interval
            if not renewed:
                log.warning("fleet_lock.lost", key=key, effect="another replica may fetch the same artifact")
                return


# KEYS: sorted set of negative keys by write time, hash of their sizes, counter of total bytes.
# ARGV: entry key prefix, op ("put" or "discard"), key, value, retention, now, max entries, max bytes.
# Returns {entries, bytes, names of bookkeeping keys found poisoned}. Every key it writes expires after the
# retention. A bookkeeping key holding another type (or a counter that is not a number) was not written by
# the proxy: the bookkeeping starts afresh (the entries it no longer counts expire by their TTL).
_NEGATIVES_SCRIPT = """
local zset, sizes, total = KEYS[1], KEYS[2], KEYS[3]
local prefix, op, key, value = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local retention, now = tonumber(ARGV[5]), tonumber(ARGV[6])
local max_entries, max_bytes = tonumber(ARGV[7]), tonumber(ARGV[8])
local poisoned = {}
for name, kind in pairs({[zset] = 'zset', [sizes] = 'hash', [total] = 'string'}) do
  local found = redis.call('TYPE', name)['ok']
  if found ~= 'none' and (found ~= kind or (kind == 'string' and not tonumber(redis.call('GET', name)))) then
    table.insert(poisoned, name)
  end
end
if #poisoned > 0 then redis.call('DEL', zset, sizes, total) end
local function forget(member)
  redis.call('DEL', prefix .. member)
  redis.call('DECRBY', total, tonumber(redis.call('HGET', sizes, member)) or 0)
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
while redis.call('ZCARD', zset) > max_entries or (tonumber(redis.call('GET', total)) or 0) > max_bytes do
  local oldest = redis.call('ZRANGE', zset, 0, 0)[1]
  if not oldest then break end
  forget(oldest)
end
return {redis.call('ZCARD', zset), tonumber(redis.call('GET', total)) or 0, unpack(poisoned)}
"""


class RedisNegatives:
    """The fleet's remembered 404s (see proxy.metadata_store.negative): `PREFIX:negative:KEY`, each with the short
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
        usable: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._store = store
        self._seal = seal
        self._usable = (
            usable  # False: the fleet's marker does not open with the seal's secrets (nothing read or written)
        )
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._retention = retention
        self._report = report
        self._clock = clock
        self._script = store.client.register_script(_NEGATIVES_SCRIPT)
        self._keys = [store.key(name) for name in NEGATIVE_BOOKKEEPING]

    def _entry(self, key: str) -> str:
        return self._store.key(NEGATIVE.key(key))

    async def _unusable(self) -> bool:
        return self._usable is not None and not await self._usable()

    async def get(self, key: str) -> bytes | None:
        if await self._unusable():
            return None
        name = NEGATIVE.key(key)
        return self._seal.open(
            name, await self._store._call(self._store.client.get(self._entry(key)), None, keys=(name,))
        )

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if await self._unusable():
            return [None] * len(keys)
        names = [NEGATIVE.key(key) for key in keys]
        found = await self._store.read_many(names, lambda pipeline, name: pipeline.get(name))
        return [self._seal.open(name, raw) for name, raw in zip(names, found, strict=True)]

    async def put(self, key: str, value: bytes) -> None:
        if not await self._unusable():
            await self._run("put", key, self._seal.close(NEGATIVE.key(key), value))

    async def discard(self, key: str) -> None:
        await self._run("discard", key, b"")

    async def expired(self, now: float | None = None) -> list[tuple[str, int]]:
        """Remembered 404s past the retention that the bookkeeping still counts (their entries expired by
        TTL; the next write drops up to 512 of them), with their sizes; raises if Redis is unavailable."""
        cutoff = (self._clock() if now is None else now) - self._retention
        zset, sizes = self._keys[0], self._keys[1]
        members = await self._store.limited(self._store.client.zrangebyscore(zset, "-inf", f"({cutoff}"))
        names = [m.decode() if isinstance(m, bytes) else m for m in members]
        found = await self._store.limited(self._store.client.hmget(sizes, names)) if names else []
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
        if counts is None:
            return
        for name in counts[2:]:
            self._seal.refuse(
                self._store.names.key(name.decode() if isinstance(name, bytes) else name),
                "holds what the proxy never writes there: the bookkeeping of remembered 404s started afresh",
                "wrong_type",
            )
        if self._report is not None:
            self._report(int(counts[0]), int(counts[1]))


def durability_risks(config: Mapping[str, str] | None) -> list[str]:
    """How a Redis so configured may lose the records a min-age rule depends on (`keys.KEPT`, written without a
    TTL): an `allkeys-*` maxmemory-policy evicts any key (`volatile-*` only keys with a TTL: not those), and
    without RDB save points or AOF a restart empties it. None: the configuration could not be read."""
    if config is None:
        return [
            "its configuration cannot be read (CONFIG GET refused: a managed Redis?): whether it evicts or "
            "persists the policy's records is unknown"
        ]
    risks = []
    policy = config.get("maxmemory-policy", "")
    if policy.startswith("allkeys-"):
        risks.append(
            f"maxmemory-policy {policy} (maxmemory {config.get('maxmemory', '?')}) evicts any key, the policy's "
            "records too (use noeviction or a volatile-* policy: they have no TTL)"
        )
    if not config.get("save", "").strip() and config.get("appendonly") == "no":
        risks.append("it persists nothing (no RDB save points, appendonly no): a restart of Redis empties it")
    return risks
