"""A bounded in-process LRU in front of a persistent metadata store (write-through).

Warm requests then cost no thread hop or network round trip. Absences are remembered only
when `remember_absence` is set: right for the embedded store of a single process, which no
other process writes; wrong for Redis, where another replica may add a record at any moment,
and for the workers of `serve --workers N`, which share the embedded store. Absences
live in an LRU of their own (`max_absent`), so lookups of made-up keys, which anyone can
send by the thousand, never push warm values out of memory.

A purge (`proxy.governance.catalog`) removes records that every worker and replica may hold in memory: it
writes a new mark under `keys.PURGES`, and `follow_purges` (each request, at most once per
`PURGE_CHECK_INTERVAL`) reads the mark from the store under the front; when it changed, this
process drops everything it remembers (this front and every `proxy.runtime.memo.Memo`). The purge returns
only after that interval, so any request that arrives after it, in any process, sees the purge.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.domain.lru import Lru
from proxy.metadata_store import MetadataStore, StoreWrapper, keys
from proxy.runtime.memo import forget_all

PURGE_CHECK_INTERVAL = 1.0  # seconds between two reads of the purge mark by one process (a purge waits this long)
_UNREAD = b"\0unread"


class MemoryFront(StoreWrapper):
    """MetadataStore wrapper that remembers up to `max_entries` values and `max_absent` absences."""

    def __init__(
        self,
        inner: MetadataStore,
        max_entries: int = 20_000,
        *,
        remember_absence: bool = False,
        max_absent: int = 4096,
        purge_check_interval: float = PURGE_CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(inner)
        self._purge_check_interval = purge_check_interval
        self._clock = clock
        self._next_purge_check = float("-inf")
        self._purge_mark: bytes | None = _UNREAD
        self._remember_absence = remember_absence
        self._values: Lru[str, bytes] = Lru(max_entries)
        self._absent: Lru[str, None] = Lru(max_absent)
        self._epoch = 0  # bumped by every set/delete, so a read that raced a write is not remembered

    def generation(self) -> int:
        """A number that changes with every write, delete and purge through this front (answers made from what it
        held are current while it is the same: `proxy.web.warm_answers`)."""
        return self._epoch

    async def get(self, key: str) -> bytes | None:
        if self._known(key):
            return self._values.get(key)
        seen = self._epoch
        value = await self.inner.get(key)
        if (value is not None or self._remember_absence) and self._epoch == seen:
            self._remember(key, value)
        return value

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Memory hits at once; every miss in one call to the inner store."""
        known = {key: self._values.get(key) for key in keys if self._known(key)}
        missing = [key for key in keys if key not in known]
        seen = self._epoch
        fetched = dict(zip(missing, await self.inner.get_many(missing), strict=True)) if missing else {}
        for key, value in fetched.items():
            if (value is not None or self._remember_absence) and self._epoch == seen:
                self._remember(key, value)
        return [known[key] if key in known else fetched[key] for key in keys]

    def purge_check_due(self) -> bool:
        """Whether `follow_purges` would read the purge mark now (a request awaits it only then)."""
        return self._clock() >= self._next_purge_check

    async def follow_purges(self) -> bool:
        """Read the purge mark if it is due (at most once per interval); when another purge happened since the
        last read, drop every value this process remembers. Whether it dropped them."""
        now = self._clock()
        if now < self._next_purge_check:
            return False
        self._next_purge_check = now + self._purge_check_interval
        try:
            mark = await self.inner.get(keys.PURGES)
        except Exception:  # the store is down: nothing can have been purged through it meanwhile
            return False
        if mark == self._purge_mark:
            return False
        first, self._purge_mark = self._purge_mark == _UNREAD, mark
        if first:  # this process remembers nothing from before it read the mark
            return False
        self.drop_everything()
        return True

    def drop_everything(self) -> int:
        """Forget every value and absence remembered here and every memo of the process (after a purge): how many
        memos besides this front were emptied."""
        self._bump()
        self._values.clear()
        self._absent.clear()
        return forget_all()

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        """Write through. `ttl` is passed to the inner store; the memory copy lives until evicted."""
        if key == keys.PURGES:  # this process's own purge: its memory goes at once
            await self.inner.set(key, value, ttl)
            self._purge_mark = value
            self.drop_everything()
            return
        self._bump()
        await self.inner.set(key, value, ttl)
        self._bump()
        self._remember(key, value)

    async def delete(self, key: str) -> None:
        self._bump()
        self._forget(key)
        await self.inner.delete(key)
        self._bump()
        self._forget(key)

    def _bump(self) -> None:
        self._epoch += 1

    async def close(self) -> None:
        self._values.clear()
        self._absent.clear()
        await self.inner.close()

    def _known(self, key: str) -> bool:
        """Whether memory knows `key` (a value, or a remembered absence); marks it recently used."""
        for memo in (self._values, self._absent):
            if key in memo:
                memo.touch(key)
                return True
        return False

    def _forget(self, key: str) -> None:
        self._values.pop(key)
        self._absent.pop(key)

    def _remember(self, key: str, value: bytes | None) -> None:
        self._forget(key)
        if value is None:
            self._absent.put(key, None)
        else:
            self._values.put(key, value)
