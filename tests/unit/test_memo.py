"""`proxy.runtime.memo`: the one bounded memo (oldest put first out) and identity memos on it."""

from __future__ import annotations

from proxy.runtime.memo import Memo, memoised


def test_a_memo_keeps_at_most_its_limit_dropping_the_oldest_put_first():
    memo: Memo[str, int] = Memo(limit=2)
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("a", 10)  # a key already there takes no room
    assert (memo.get("a"), memo.get("b"), len(memo)) == (10, 2, 2)
    memo.put("c", 3)
    assert (memo.get("a"), memo.get("b"), memo.get("c")) == (None, 2, 3)
    assert memo.pop("b") == 2 and memo.pop("b") is None and len(memo) == 1


def test_memoised_values_are_reused_while_the_same_source_object_comes_back():
    memo: Memo = Memo(limit=10)
    calls: list[bytes] = []

    def decode(source: bytes) -> str:
        calls.append(source)
        return source.decode()

    first = b"value"
    same_content = bytes(bytearray(b"value"))  # equal, but another object
    assert memoised(memo, "k", first, decode) == "value"
    assert memoised(memo, "k", first, decode) == "value"
    assert memoised(memo, "k", same_content, decode) == "value"
    assert [id(c) for c in calls] == [id(first), id(same_content)]
