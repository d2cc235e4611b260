"""A bounded in-process LRU in front of a persistent metadata store (write-through).

Warm requests then cost no thread hop or network round trip. Only values that were read
or written are kept, never absences, so a record another replica adds later is still
found in the shared store.
"""

from __future__ import annotations

from collections import OrderedDict

from proxy.cache import MetadataStore


class MemoryFront:
    """MetadataStore wrapper that remembers up to `max_entries` values."""

    def __init__(self, inner: MetadataStore, max_entries: int = 20_000) -> None:
        self.inner = inner
        self._max = max_entries
        self._values: OrderedDict[str, bytes] = OrderedDict()

    async def get(self, key: str) -> bytes | None:
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
            return value
        value = await self.inner.get(key)
        if value is not None:
            self._remember(key, value)
        return value

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self.inner.set(key, value, ttl)
        self._remember(key, value)

    async def delete(self, key: str) -> None:
        self._values.pop(key, None)
        await self.inner.delete(key)

    async def ping(self) -> bool:
        return await self.inner.ping()

    async def close(self) -> None:
        self._values.clear()
        await self.inner.close()

    def _remember(self, key: str, value: bytes) -> None:
        self._values[key] = value
        self._values.move_to_end(key)
        while len(self._values) > self._max:
            self._values.popitem(last=False)
