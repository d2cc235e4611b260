"""Bounded in-process memos: `Memo` keeps at most `limit` entries, the oldest put first out.

`memoised` reuses a value derived from a source object while the very same source object comes
back: stores hand out the same bytes object while a value is unchanged (`proxy.metadata_store.memory`), and
the memos built on them hand out the same decoded object in turn; so an identity check is enough to
know that nothing changed, with no hashing or comparing of contents. `forget_all` empties every memo
of the process (after a purge: `proxy.metadata_store.memory`). Pure: no I/O here.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")
MEMO_ENTRIES = 10_000
_EVERY_MEMO: weakref.WeakSet[Memo[Any, Any]] = weakref.WeakSet()  # every memo of this process, for forget_all


class Memo(Generic[K, V]):
    """A mapping of at most `limit` entries; putting a new key when full drops the oldest one put."""

    def __init__(self, limit: int = MEMO_ENTRIES) -> None:
        self._limit = limit
        self._entries: dict[K, V] = {}
        _EVERY_MEMO.add(self)

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def put(self, key: K, value: V) -> None:
        if key not in self._entries and len(self._entries) >= self._limit:
            self._entries.pop(next(iter(self._entries)))
        self._entries[key] = value

    def pop(self, key: K) -> V | None:
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def forget_all() -> int:
    """Empty every memo of this process (their values derive from records a purge removed): how many."""
    memos = list(_EVERY_MEMO)
    for memo in memos:
        memo.clear()
    return len(memos)


def memoised(memo: Memo[Any, tuple[Any, T]], key: Hashable, source: Any, compute: Callable[[Any], T]) -> T:
    """`compute(source)`, reused while the same source object is asked for under `key`. The memo holds the
    source, so its identity is never reused."""
    hit = memo.get(key)
    if hit is not None and hit[0] is source:
        return hit[1]
    value = compute(source)
    memo.put(key, (source, value))
    return value
