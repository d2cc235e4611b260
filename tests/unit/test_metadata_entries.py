"""Unit tests for proxy.metadata_store: entry and record encoding, freshness decisions."""

from __future__ import annotations

import base64
import json

import pytest

from proxy.metadata_store import FORMAT_VERSION, CacheEntry, Freshness, decode_record, encode_record, freshness_of

BINARY = bytes(range(256)) + b'\x00\xff{}"\\\n'


def _entry(**overrides) -> CacheEntry:
    values = {
        "status": 200,
        "body": b'{"versions": []}',
        "url": "https://registry.example/v1/providers/a/b/versions",
        "fetched_at": 1_700_000_000.25,
        "etag": '"abc"',
        "content_type": "application/json",
    }
    values.update(overrides)
    return CacheEntry(**values)


# ---------------------------------------------------------------------------------------------
# CacheEntry encode / decode
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        _entry(),
        _entry(body=BINARY),
        _entry(body=b""),
        _entry(status=404, body=b"not found", etag=None, content_type=""),
        _entry(etag=None),
        _entry(url="https://münchen.example/path?q=1&r=ü"),
        _entry(fetched_at=0.0),
    ],
)
def test_entry_roundtrip(entry: CacheEntry) -> None:
    raw = entry.encode()
    assert isinstance(raw, bytes)
    decoded = CacheEntry.decode(raw)
    assert decoded == entry
    assert decoded is not None
    assert decoded.body == entry.body
    assert type(decoded.fetched_at) is float


def test_entry_encoding_is_versioned_json_with_base64_body() -> None:
    data = json.loads(_entry(body=BINARY).encode())
    assert data["v"] == FORMAT_VERSION
    assert data["kind"] == "entry"
    assert base64.b64decode(data["body"]) == BINARY


def test_entry_negative_property() -> None:
    assert _entry(status=200).negative is False
    assert _entry(status=404).negative is True
    assert _entry(status=410).negative is True


def _raw(**changes) -> bytes:
    data = json.loads(_entry().encode())
    for key, value in changes.items():
        if value is _DROP:
            del data[key]
        else:
            data[key] = value
    return json.dumps(data).encode()


_DROP = object()


def test_raw_helper_produces_decodable_entry() -> None:
    assert CacheEntry.decode(_raw()) == _entry()


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"garbage",
        b"\xff\xfe\x00not json",
        b"[]",
        b"null",
        b"42",
        b'"string"',
        b"{}",
        b'{"v": 1}',
        _raw(v=FORMAT_VERSION + 1),
        _raw(v=0),
        _raw(v="1"),
        _raw(v=_DROP),
        _raw(kind="record"),
        _raw(kind="ENTRY"),
        _raw(kind=_DROP),
        _raw(status=_DROP),
        _raw(status="not a number"),
        _raw(status=None),
        _raw(body=_DROP),
        _raw(body="!!! not base64 !!!"),
        _raw(body=None),
        _raw(url=_DROP),
        _raw(fetched_at=_DROP),
        _raw(fetched_at="yesterday"),
        _raw(fetched_at=None),
    ],
)
def test_entry_decode_rejects(raw: bytes | None) -> None:
    assert CacheEntry.decode(raw) is None


def test_entry_decode_tolerates_missing_optional_fields() -> None:
    decoded = CacheEntry.decode(_raw(etag=_DROP, content_type=_DROP))
    assert decoded == _entry(etag=None, content_type="")


def test_record_is_not_an_entry() -> None:
    assert CacheEntry.decode(encode_record({"status": 200})) is None


# ---------------------------------------------------------------------------------------------
# encode_record / decode_record
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"zh": "zh:" + "0" * 64, "h1": ["h1:abc=", "h1:def="]},
        {"nested": {"a": [1, 2.5, None, True]}, "unicode": "münchen"},
    ],
)
def test_record_roundtrip(record: dict) -> None:
    assert decode_record(encode_record(record)) == record


def test_record_encoding_is_deterministic() -> None:
    assert encode_record({"b": 1, "a": 2}) == encode_record({"a": 2, "b": 1})


def _record_raw(**changes) -> bytes:
    data = {"v": FORMAT_VERSION, "kind": "record", "data": {"x": 1}}
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"not json",
        b"\xff\xff",
        b"[1, 2]",
        _entry().encode(),
        _record_raw(v=FORMAT_VERSION + 1),
        _record_raw(kind="entry"),
        _record_raw(data=[1, 2]),
        _record_raw(data="text"),
        _record_raw(data=None),
    ],
)
def test_record_decode_rejects(raw: bytes | None) -> None:
    assert decode_record(raw) is None


def test_record_raw_helper_decodes() -> None:
    assert decode_record(_record_raw()) == {"x": 1}


# ---------------------------------------------------------------------------------------------
# freshness_of
# ---------------------------------------------------------------------------------------------

T0 = 1_000_000.0


@pytest.mark.parametrize(
    ("status", "age", "ttl", "negative_ttl", "expected"),
    [
        # positive entries, finite TTL
        (200, 0.0, 600.0, 60.0, Freshness.FRESH),
        (200, 1.0, 600.0, 60.0, Freshness.FRESH),
        (200, 599.9, 600.0, 60.0, Freshness.FRESH),
        (200, 600.0, 600.0, 60.0, Freshness.STALE),
        (200, 601.0, 600.0, 60.0, Freshness.STALE),
        (200, 86400.0, 600.0, 60.0, Freshness.STALE),
        # positive entries are not judged by the negative TTL
        (200, 120.0, 600.0, 60.0, Freshness.FRESH),
        # ttl=None: immutable, fresh forever
        (200, 0.0, None, 60.0, Freshness.FRESH),
        (200, 10 * 365 * 86400.0, None, 60.0, Freshness.FRESH),
        # negative entries use negative_ttl, immutable or not
        (404, 0.0, 600.0, 60.0, Freshness.FRESH),
        (404, 59.0, 600.0, 60.0, Freshness.FRESH),
        (404, 60.0, 600.0, 60.0, Freshness.STALE),
        (404, 120.0, 600.0, 60.0, Freshness.STALE),
        (404, 30.0, None, 60.0, Freshness.FRESH),
        (404, 61.0, None, 60.0, Freshness.STALE),
        (404, 10 * 365 * 86400.0, None, 60.0, Freshness.STALE),
        (410, 61.0, None, 60.0, Freshness.STALE),
        # zero TTL: never fresh
        (200, 0.0, 0.0, 60.0, Freshness.STALE),
        (404, 0.0, None, 0.0, Freshness.STALE),
        # the clock went backwards
        (200, -1.0, 600.0, 60.0, Freshness.STALE),
        (200, -3600.0, 600.0, 60.0, Freshness.STALE),
        (404, -1.0, None, 60.0, Freshness.STALE),
    ],
)
def test_freshness_of(status: int, age: float, ttl: float | None, negative_ttl: float, expected: Freshness) -> None:
    entry = _entry(status=status, fetched_at=T0)
    assert freshness_of(entry, T0 + age, ttl, negative_ttl) is expected
