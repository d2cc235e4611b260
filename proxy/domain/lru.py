"""`Lru`: the one bounded in-process mapping that forgets the least recently used key first.

Its users say what a use is: `put` and `touch` are uses (the key becomes the most recently used); `get`,
`in` and iteration are not, so a lookup that decides nothing (an entry found stale, a check refused) leaves
the order as it was. Beyond `limit` entries, the least recently used go; with `weigh` (e.g. bytes), also
beyond `max_weight` in all. (`proxy.runtime.memo.Memo` is the other bounded memo: oldest put first out,
whatever was read.) Pure: no I/O here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Mapping[K, V]):
    """At most `limit` entries (and with `weigh`, at most `max_weight` in all: an entry heavier than that alone
    is not held); `put` and `touch` make a key the most recently used, the least recently used is dropped first."""

    __slots__ = ("_entries", "_weigh", "limit", "max_weight", "weight")

    def __init__(self, limit: int, *, weigh: Callable[[K, V], int] | None = None, max_weight: int = 0) -> None:
        self.limit = limit
        self.max_weight = max_weight
        self.weight = 0  # of the entries held (always 0 without `weigh`)
        self._weigh = weigh
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of `key` (not a use)."""
        return self._entries.get(key, default)

    def put(self, key: K, value: V) -> None:
        """Set `key` and make it the most recently used; drops the least recently used beyond the bounds."""
        if self._weigh is not None:
            self._put_weighed(self._weigh, key, value)
            return
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        while len(entries) > self.limit:
            entries.popitem(last=False)

    def _put_weighed(self, weigh: Callable[[K, V], int], key: K, value: V) -> None:
        """`put` with the weight kept and bounded too."""
        entries = self._entries
        self.pop(key)
        weight = weigh(key, value)
        if weight > self.max_weight:
            return
        entries[key] = value
        self.weight += weight
        while len(entries) > self.limit or self.weight > self.max_weight:
            oldest, dropped = entries.popitem(last=False)
            self.weight -= weigh(oldest, dropped)

    def touch(self, key: K) -> None:
        """Make `key`, if held, the most recently used (its value unchanged)."""
        if key in self._entries:
            self._entries.move_to_end(key)

    def pop(self, key: K) -> V | None:
        """Forget `key`; its value, or None if it was not held."""
        if self._weigh is None:
            return self._entries.pop(key, None)
        if key not in self._entries:
            return None
        value = self._entries.pop(key)
        self.weight -= self._weigh(key, value)
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        if self._weigh is not None:
            self.weight = 0

    def __getitem__(self, key: K) -> V:
        return self._entries[key]

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[K]:
        """The keys, least recently used first."""
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
