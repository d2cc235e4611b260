"""Unit tests for proxy.httprange.parse_range (RFC 9110 §14 single byte ranges)."""

from __future__ import annotations

import pytest

from proxy.httprange import UnsatisfiableRange, parse_range

SIZE = 1000


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        # no header: send everything
        (None, SIZE, None),
        ("", SIZE, None),
        # first-last
        ("bytes=0-99", SIZE, (0, 99)),
        ("bytes=0-0", SIZE, (0, 0)),
        ("bytes=100-199", SIZE, (100, 199)),
        ("bytes=999-999", SIZE, (999, 999)),
        ("bytes=0-999", SIZE, (0, 999)),
        (" bytes=0-99 ", SIZE, (0, 99)),
        # open end
        ("bytes=0-", SIZE, (0, 999)),
        ("bytes=500-", SIZE, (500, 999)),
        ("bytes=999-", SIZE, (999, 999)),
        # suffix
        ("bytes=-100", SIZE, (900, 999)),
        ("bytes=-1", SIZE, (999, 999)),
        ("bytes=-1000", SIZE, (0, 999)),
        ("bytes=-5000", SIZE, (0, 999)),  # longer than the file: the whole file
        # end beyond the size is clipped
        ("bytes=0-5000", SIZE, (0, 999)),
        ("bytes=990-1000", SIZE, (990, 999)),
        ("bytes=500-99999999999999999999", SIZE, (500, 999)),
        # a one-byte file
        ("bytes=0-0", 1, (0, 0)),
        ("bytes=-10", 1, (0, 0)),
    ],
)
def test_parse_range_satisfiable(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    result = parse_range(header, size)
    assert result == expected
    if result is not None:
        start, end = result
        assert 0 <= start <= end < size


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=1000-", SIZE),
        ("bytes=1000-2000", SIZE),
        ("bytes=5000-6000", SIZE),
        ("bytes=1000-1000", SIZE),
        ("bytes=-0", SIZE),
        ("bytes=-000", SIZE),
        ("bytes=0-", 0),
        ("bytes=0-0", 0),
        ("bytes=-0", 0),
    ],
)
def test_parse_range_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(UnsatisfiableRange):
        parse_range(header, size)


def test_parse_range_suffix_of_empty_file_is_not_a_bogus_span() -> None:
    # A zero-length representation has no last N bytes: RFC 9110 §14.1.1/§15.5.17 leave a 416 (or
    # ignoring the header) as the answers; a span (0, -1) would produce `Content-Range: bytes 0--1/0`.
    try:
        result = parse_range("bytes=-100", 0)
    except UnsatisfiableRange:
        return
    assert result is None


@pytest.mark.parametrize(
    "header",
    [
        # multi-range: ignored, the whole file is sent
        "bytes=0-1,5-6",
        "bytes=0-99, 200-299",
        "bytes=-1,0-0",
        # malformed
        "bytes=",
        "bytes=-",
        "bytes=abc-def",
        "bytes=0-abc",
        "bytes=1.5-2",
        "bytes=--1",
        "bytes=-1-2",
        "bytes=0--1",
        "bytes 0-99",
        "bytes:0-99",
        "Bytes=0-99x",
        "items=0-99",
        "0-99",
        "bytes = 0-99",
        "bytes=0 - 99",
        "bytes=\u0660-\u0669",  # non-ASCII digits: RFC 9110 DIGIT is ASCII only
        "bytes=0-99\x00",
        # end before start
        "bytes=100-99",
        "bytes=500-0",
    ],
)
def test_parse_range_ignored(header: str) -> None:
    assert parse_range(header, SIZE) is None


def test_unsatisfiable_range_is_value_error_with_header() -> None:
    with pytest.raises(ValueError, match="bytes=5000-"):
        parse_range("bytes=5000-", SIZE)
