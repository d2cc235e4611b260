"""Remembered upstream 404s, kept apart from everything else and bounded in count and bytes.

Anyone can invent provider and module names by the thousand, and each one's 404 is worth
remembering for a short while (`--ttl-negative`), but never worth keeping: so negative answers
never reach the persistent store. `NegativeBound` sits in front of the metadata store and
sends every negative `CacheEntry` written through it to a `NegativeStore` of its own, bounded
by `--negative-cache-entries` and `--negative-cache-bytes` (the least recently used or
written go first), and kept at most `retention` seconds: an hour, or `--ttl-negative` if
longer, so a remembered 404 still answers 404 while the upstream fails (stale-if-error).

The embedded store keeps negatives in process memory (`MemoryNegatives`, lost on restart);
Redis keeps them for the whole fleet (`proxy.metadata_store.redis.RedisNegatives`, sealed like every value
the proxy keeps in Redis). Whatever a negative store answers can only ever mean "absent": a value
read from it that is not a negative entry (e.g. a 200 document planted there) is poison, refused
and reported, never an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from proxy.domain.lru import Lru
from proxy.metadata_store import CacheEntry, MetadataStore, Refuse, StoreWrapper
from proxy.metadata_store.keys import NEGATIVE

RETENTION_FLOOR = 3600.0
MAX_NEGATIVE_VALUE = 16 * 1024  # a negative entry has no body: status, URL and time only


def negative_retention(negative_ttl: float) -> float:
    """How long a remembered 404 is kept (for stale-if-error): an hour, or the negative TTL if longer."""
    return max(RETENTION_FLOOR, negative_ttl)


def is_negative(value: bytes) -> bool:
    """Whether `value` is an encoded negative `CacheEntry` (a remembered 404)."""
    if len(value) > MAX_NEGATIVE_VALUE:
        return False
    entry = CacheEntry.decode(value)
    return entry is not None and entry.negative


class NegativeStore(Protocol):
    """Bounded storage for negative entries; reports its size after every change."""

    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: list[str]) -> list[bytes | None]: ...

    async def put(self, key: str, value: bytes) -> None: ...

    async def discard(self, key: str) -> None: ...

    async def expired(self, now: float | None = None) -> list[tuple[str, int]]:
        """Entries past the retention still kept somewhere gc can remove them from, with their sizes."""
        ...


Report = Callable[[int, int], None]  # (entries, bytes) after a change


class MemoryNegatives:
    """An in-process LRU of negative entries, bounded by count and bytes, each kept at most `retention`."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        retention: float,
        *,
        report: Report | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._retention = retention
        self._report = report
        self._clock = clock
        # (value, when written); a use: a write, or a read that finds the entry within the retention
        self._items: Lru[str, tuple[bytes, float]] = Lru(max_entries, weigh=_size, max_weight=max_bytes)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size(self) -> int:
        """Bytes held (keys and values)."""
        return self._items.weight

    async def get(self, key: str) -> bytes | None:
        item = self._items.get(key)
        if item is None:
            return None
        if not 0 <= self._clock() - item[1] < self._retention:
            self._items.pop(key)
            self._reported()
            return None
        self._items.touch(key)
        return item[0]

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        return [await self.get(key) for key in keys]

    async def put(self, key: str, value: bytes) -> None:
        self._items.put(key, (value, self._clock()))  # one larger than the byte bound alone is not kept
        self._reported()

    async def discard(self, key: str) -> None:
        if key in self._items:
            self._items.pop(key)
            self._reported()

    async def expired(self, now: float | None = None) -> list[tuple[str, int]]:
        """None for gc: these entries live in one process's memory, and leave it with the process."""
        return []

    def _reported(self) -> None:
        if self._report is not None:
            self._report(len(self._items), self._items.weight)


def _size(key: str, item: tuple[bytes, float]) -> int:
    """The bytes a remembered 404 holds: its key and its value."""
    return len(key.encode()) + len(item[0])


class NegativeBound(StoreWrapper):
    """MetadataStore that keeps negative entries in a bounded `NegativeStore`, everything else in `inner`.

    A negative answer replaces what `inner` had under its key (as it did before); a positive one
    replaces the negative. Reads look in `inner` first (warm entries cost nothing extra), then
    among the negatives, where only a negative entry counts: anything else found there is handed
    to `refuse` (under its `negative:KEY` name) and read as a miss. Negatives are not listed by
    `keys()`: they are never exported.
    """

    def __init__(self, inner: MetadataStore, negatives: NegativeStore, *, refuse: Refuse) -> None:
        super().__init__(inner)
        self.negatives = negatives
        self._refuse = refuse

    async def get(self, key: str) -> bytes | None:
        value = await self.inner.get(key)
        return value if value is not None else self._absence(key, await self.negatives.get(key))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        values = await self.inner.get_many(keys)
        missing = [key for key, value in zip(keys, values, strict=True) if value is None]
        found = dict(zip(missing, await self.negatives.get_many(missing), strict=True)) if missing else {}
        return [
            value if value is not None else self._absence(key, found[key])
            for key, value in zip(keys, values, strict=True)
        ]

    def _absence(self, key: str, value: bytes | None) -> bytes | None:
        """`value` if it is a negative entry (a remembered 404); anything else is refused."""
        if value is None or is_negative(value):
            return value
        self._refuse(
            NEGATIVE.key(key),
            "not a remembered 404 (a document or record planted among the negative entries)",
            "not_negative",
        )
        return None

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        if is_negative(value):
            if await self.inner.get(key) is not None:
                await self.inner.delete(key)
            await self.negatives.put(key, value)
        else:
            await self.negatives.discard(key)
            await self.inner.set(key, value, ttl)

    async def delete(self, key: str) -> None:
        await self.negatives.discard(key)
        await self.inner.delete(key)
