"""Unit tests for proxy.protocol.http_ranges.parse_range (RFC 9110 §14 single byte ranges)."""

from __future__ import annotations

import pytest

from proxy.protocol.http_ranges import Answer, UnsatisfiableRangeError, evaluate, parse_range

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
    with pytest.raises(UnsatisfiableRangeError):
        parse_range(header, size)


def test_parse_range_suffix_of_empty_file_is_not_a_bogus_span() -> None:
    # A zero-length representation has no last N bytes: RFC 9110 §14.1.1/§15.5.17 leave a 416 (or
    # ignoring the header) as the answers; a span (0, -1) would produce `Content-Range: bytes 0--1/0`.
    try:
        result = parse_range("bytes=-100", 0)
    except UnsatisfiableRangeError:
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


# ---------------------------------------------------------------------------------------------
# positions of any length (Python's int() refuses more than 4,300 digits)
# ---------------------------------------------------------------------------------------------

MANY = "9" * 5000


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"bytes=0-{MANY}", (0, 999)),  # an absurd last-pos is clipped
        (f"bytes=10-{MANY}", (10, 999)),
        (f"bytes=-{MANY}", (0, 999)),  # an absurd suffix is the whole file
        ("bytes=" + "0" * 5000 + "5-" + "0" * 5000 + "9", (5, 9)),  # leading zeros are not magnitude
        ("bytes=-" + "0" * 5000 + "1", (999, 999)),
    ],
)
def test_parse_range_long_numbers_satisfiable(header: str, expected: tuple[int, int]) -> None:
    assert parse_range(header, SIZE) == expected


@pytest.mark.parametrize(
    "header", [f"bytes={MANY}-", f"bytes={MANY}-{MANY}", "bytes=-" + "0" * 5000, "bytes=" + "0" * 4998 + "1000-"]
)
def test_parse_range_long_numbers_unsatisfiable(header: str) -> None:
    with pytest.raises(UnsatisfiableRangeError):
        parse_range(header, SIZE)


@pytest.mark.parametrize(
    "header", [f"bytes={MANY}-5", f"bytes={MANY}9-{MANY}", f"bytes=2{MANY}-1{MANY}", "bytes=" + "0" * 5000 + "7-6"]
)
def test_parse_range_long_last_pos_before_first_pos_is_ignored(header: str) -> None:
    # last-pos < first-pos makes the range invalid (RFC 9110 §14.1.1): ignored, even past the end
    assert parse_range(header, SIZE) is None


# ---------------------------------------------------------------------------------------------
# evaluate: conditionals and Range together (RFC 9110 §13.2.2)
# ---------------------------------------------------------------------------------------------

ETAG = '"abc123"'


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, Answer(200)),
        # If-None-Match: weak comparison; "*" matches an existing archive
        ({"if_none_match": ETAG}, Answer(304)),
        ({"if_none_match": f"W/{ETAG}"}, Answer(304)),
        ({"if_none_match": "*"}, Answer(304)),
        ({"if_none_match": " * "}, Answer(304)),
        ({"if_none_match": f'"x", {ETAG}'}, Answer(304)),
        ({"if_none_match": f'W/"x",W/{ETAG} , '}, Answer(304)),
        ({"if_none_match": '"x"'}, Answer(200)),
        ({"if_none_match": '"*"'}, Answer(200)),  # a tag whose value is *, not the wildcard
        ({"if_none_match": "W/*"}, Answer(200)),
        ({"if_none_match": "abc123"}, Answer(200)),  # unquoted: malformed, names nothing
        ({"if_none_match": f"{ETAG} junk"}, Answer(200)),
        ({"if_none_match": ETAG, "range_header": "bytes=0-9"}, Answer(304)),
        # If-Match: strong comparison, before everything else
        ({"if_match": ETAG}, Answer(200)),
        ({"if_match": "*"}, Answer(200)),
        ({"if_match": f'"x", {ETAG}'}, Answer(200)),
        ({"if_match": f"W/{ETAG}"}, Answer(412)),
        ({"if_match": '"x"'}, Answer(412)),
        ({"if_match": "garbage"}, Answer(412)),
        ({"if_match": '"x"', "if_none_match": "*"}, Answer(412)),
        ({"if_match": ETAG, "range_header": "bytes=0-9"}, Answer(206, (0, 9))),
        # Range, and If-Range deciding between 206 and 200
        ({"range_header": "bytes=0-9"}, Answer(206, (0, 9))),
        ({"range_header": "bytes=1000-"}, Answer(416)),
        ({"range_header": f"bytes={MANY}-"}, Answer(416)),
        ({"range_header": "bytes=0-1,5-6"}, Answer(200)),
        ({"range_header": "bytes=0-9", "if_range": ETAG}, Answer(206, (0, 9))),
        ({"range_header": "bytes=0-9", "if_range": f" {ETAG} "}, Answer(206, (0, 9))),
        ({"range_header": "bytes=0-9", "if_range": f"W/{ETAG}"}, Answer(200)),
        ({"range_header": "bytes=0-9", "if_range": '"other"'}, Answer(200)),
        ({"range_header": "bytes=0-9", "if_range": "Tue, 01 Jan 2030 00:00:00 GMT"}, Answer(200)),
        ({"range_header": "bytes=0-9", "if_range": "garbage"}, Answer(200)),
        ({"range_header": "bytes=1000-", "if_range": '"other"'}, Answer(200)),
        ({"if_range": '"other"'}, Answer(200)),  # If-Range without Range is ignored
    ],
)
def test_evaluate(headers: dict[str, str], expected: Answer) -> None:
    assert evaluate(ETAG, SIZE, **headers) == expected
