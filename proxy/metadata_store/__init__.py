"""Metadata cache: the store protocol, the entry format and the freshness policy.

A store is a byte key-value map (`embedded`, an SQLite file in the data dir, by default; `redis` for a fleet).
Entries are upstream answers (status, body, final URL, ETag, fetch time) or derived
records (verified hashes), encoded as versioned JSON so a future format change makes
old entries a miss rather than a crash. Freshness decisions are pure functions.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

FORMAT_VERSION = 1
# (key, why, reason): a value never used (proxy.metadata_store.sealed.Seal.refuse)
Refuse = Callable[[str, str, str], None]


class MetadataStore(Protocol):
    """A persistent byte key-value store."""

    async def get(self, key: str) -> bytes | None: ...

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Several values in one round trip, in the order of `keys`."""
        ...

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def ping(self) -> bool: ...

    @property
    def problem(self) -> str | None:
        """Why the store is unusable right now (for /readyz), or None while it works."""
        ...

    def keys(self, prefix: str = "") -> AsyncIterator[str]:
        """Every key starting with `prefix` (for export; not for request paths)."""
        ...

    async def close(self) -> None: ...


class StoreWrapper:
    """Base of the MetadataStore wrappers (memory front, seal, negative bound, disk-full guard): what a
    wrapper does not change goes to the store it wraps."""

    def __init__(self, inner: MetadataStore) -> None:
        self.inner = inner

    @property
    def problem(self) -> str | None:
        """Why the store under this wrapper is unusable now, or None."""
        return self.inner.problem

    def keys(self, prefix: str = "") -> AsyncIterator[str]:
        return self.inner.keys(prefix)

    async def ping(self) -> bool:
        return await self.inner.ping()

    async def close(self) -> None:
        await self.inner.close()


@dataclass(frozen=True)
class CacheEntry:
    """An upstream answer as cached: a 200 document or a negative (404) answer."""

    status: int
    body: bytes
    url: str
    fetched_at: float
    etag: str | None = None
    content_type: str = ""
    terraform_get: str | None = None  # the X-Terraform-Get header of a module download answer

    @property
    def negative(self) -> bool:
        return self.status not in (200, 204)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": FORMAT_VERSION,
                "kind": "entry",
                "status": self.status,
                "body": base64.b64encode(self.body).decode("ascii"),
                "url": self.url,
                "fetched_at": self.fetched_at,
                "etag": self.etag,
                "content_type": self.content_type,
                "terraform_get": self.terraform_get,
            }
        ).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> CacheEntry | None:
        data = _decode(raw, "entry")
        if data is None:
            return None
        try:
            return cls(
                int(data["status"]),
                base64.b64decode(data["body"]),
                str(data["url"]),
                float(data["fetched_at"]),
                data.get("etag"),
                data.get("content_type", ""),
                data.get("terraform_get"),
            )
        except (KeyError, TypeError, ValueError):
            return None


def encode_record(record: dict[str, Any]) -> bytes:
    """A derived record (e.g. verified hashes of an archive)."""
    return json.dumps({"v": FORMAT_VERSION, "kind": "record", "data": record}, sort_keys=True).encode()


def decode_record(raw: bytes | None) -> dict[str, Any] | None:
    data = _decode(raw, "record")
    return data.get("data") if data is not None and isinstance(data.get("data"), dict) else None


def _decode(raw: bytes | None, kind: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("v") != FORMAT_VERSION or data.get("kind") != kind:
        return None  # unknown or future format: treat as a miss
    return data


class Freshness(Enum):
    FRESH = "fresh"
    STALE = "stale"


def fresh_until(entry: CacheEntry, ttl: float | None, negative_ttl: float) -> float:
    """When `entry` turns stale (`freshness_of` says STALE from then on); infinite if immutable."""
    limit = negative_ttl if entry.negative else ttl
    return math.inf if limit is None else entry.fetched_at + limit


def freshness_of(entry: CacheEntry, now: float, ttl: float | None, negative_ttl: float) -> Freshness:
    """Fresh while younger than its TTL; `ttl=None` means immutable (fresh forever once 200).

    Negative answers always use the short negative TTL, immutable or not. A clock that
    went backwards makes an entry stale rather than fresh forever.
    """
    age = now - entry.fetched_at
    limit = negative_ttl if entry.negative else ttl
    if limit is None:
        return Freshness.FRESH
    return Freshness.FRESH if 0 <= age < limit else Freshness.STALE
