"""Metadata answers kept as rendered bytes with a strong ETag, rendered again only when their source changes.

A warm `index.json` or `:version.json` is then answered from stored bytes: no JSON encoding and
no hashing per request. The source of an answer is the object the services hand out for it (the
parsed version list, the version's archive list, a cached upstream body), which stays the same
object while the cached document is unchanged (`proxy.runtime.memo`). The ETag is a hash of the body,
so it changes exactly when the body does. Pure: no I/O here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.runtime.memo import Memo, memoised


@dataclass(frozen=True)
class Rendering:
    """A JSON answer as sent: its body and strong ETag."""

    body: bytes
    etag: str

    @classmethod
    def of(cls, body: bytes) -> Rendering:
        return cls(body, strong_etag(body))


def strong_etag(body: bytes) -> str:
    """`"` + the first 32 hex digits of the body's SHA-256 + `"`."""
    return f'"{hashlib.sha256(body).hexdigest()[:32]}"'


def encode_json(document: Any) -> bytes:
    """Compact UTF-8 JSON, as every JSON answer of the proxy is written."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


class Renderings:
    """Rendering answers per document key, each reused while its source object is the same (bounded)."""

    def __init__(self) -> None:
        self._memo: Memo[Any, tuple[Any, Rendering]] = Memo()
        self.renders = 0  # answers rendered (not reused) so far: for tests and profiling

    def json(self, key: Any, source: Any, document: Callable[[Any], Any]) -> Rendering:
        """The JSON of `document(source)`, rendered once per source object."""
        return memoised(self._memo, key, source, lambda s: self._render(encode_json(document(s))))

    def body(self, key: Any, body: bytes) -> Rendering:
        """A body sent as it is (an upstream's document), hashed once per bytes object."""
        return memoised(self._memo, key, body, self._render)

    def _render(self, body: bytes) -> Rendering:
        self.renders += 1
        return Rendering.of(body)
