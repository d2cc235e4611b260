"""Values derived from a source object, reused while the very same source object comes back.

Stores hand out the same bytes object while a value is unchanged (`proxy.cache.memory`), and the
memos built on them hand out the same decoded object in turn; so an identity check is enough to
know that nothing changed, with no hashing or comparing of contents. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
MEMO_ENTRIES = 10_000


def memoised(
    memo: dict[Any, tuple[Any, Any]], key: Any, source: Any, compute: Callable[[Any], T], limit: int = MEMO_ENTRIES
) -> T:
    """`compute(source)`, reused while the same source object is asked for under `key` (at most `limit`
    keys; the oldest is dropped first). The memo holds the source, so its identity is never reused."""
    hit = memo.get(key)
    if hit is not None and hit[0] is source:
        return hit[1]
    value = compute(source)
    if len(memo) >= limit:
        memo.pop(next(iter(memo)))
    memo[key] = (source, value)
    return value
