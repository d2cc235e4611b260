"""HTTP `Range` and conditional requests for archive downloads (RFC 9110 §13, §14). Pure.

An archive's only validator is its strong ETag (its SHA-256); there is no Last-Modified,
so date conditions (`If-Modified-Since`, `If-Unmodified-Since`) are ignored and an
`If-Range` date never matches (§13.1.5: the full archive is sent).

aiohttp's request helpers (3.14) would change answers the tests pin, so the headers are parsed
here from their raw text (the handler joins repeated header lines into one list):

- `request.if_none_match` / `if_match` return the tag `"*"` and the wildcard `*` as the same
  `ETag("*")`, read only the first header line, and stop at an empty list element or an
  empty tag `""`, so a list naming our tag later on would not match.
- `request.if_range` is a date or None: an entity tag, the only validator an archive has,
  cannot be compared with it.
- `request.http_range` reads `bytes=-0` as the whole file (it is unsatisfiable: 416) and
  raises on positions longer than Python's 4,300-digit `int()` limit (clipped or 416 here);
  the rest (clipping to the size, 416 past the end or for an empty file) would still be ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANGE_RE = re.compile(r"^bytes=([0-9]*)-([0-9]*)\Z")
# entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE, in a comma-separated list (empty elements allowed)
_ETAG_RE = re.compile(r'[ \t]*(?:(W/)?("[\x21\x23-\x7e\x80-\xff]*")[ \t]*)?(?:,|\Z)')


class UnsatisfiableRangeError(ValueError):
    """The range lies outside the file: answer 416."""


@dataclass(frozen=True)
class Answer:
    """What to send: 200 (all), 206 (`span`, inclusive), 304, 412 or 416."""

    status: int
    span: tuple[int, int] | None = None


def evaluate(
    etag: str,
    size: int,
    *,
    if_match: str | None = None,
    if_none_match: str | None = None,
    if_range: str | None = None,
    range_header: str | None = None,
) -> Answer:
    """Decide a GET/HEAD of a representation with strong `etag` (quoted) and `size` bytes (§13.2.2)."""
    if if_match is not None and not _matches(if_match, etag, weak=False):
        return Answer(412)
    if if_none_match is not None and _matches(if_none_match, etag, weak=True):
        return Answer(304)
    if range_header and (if_range is None or if_range.strip() == etag):  # If-Range: strong comparison
        try:
            span = parse_range(range_header, size)
        except UnsatisfiableRangeError:
            return Answer(416)
        if span is not None:
            return Answer(206, span)
    return Answer(200)


def _matches(header: str, etag: str, *, weak: bool) -> bool:
    """Whether an If-Match/If-None-Match list names `etag` (a malformed list names nothing)."""
    if header.strip() == "*":
        return True
    position, found = 0, False
    while position < len(header):
        match = _ETAG_RE.match(header, position)
        if match is None or match.end() == position:
            return False
        is_weak, tag = match.groups()
        if tag is not None and tag == etag and (weak or not is_weak):
            found = True
        position = match.end()
    return found


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`(start, end_inclusive)` for a single satisfiable range; None means "send it all".

    Multi-range and malformed headers are ignored (a 200 with the whole file is always a
    valid answer); a syntactically valid range past the end raises UnsatisfiableRangeError.
    Positions of any length are accepted: they are compared, never converted whole.
    """
    if not header:
        return None
    match = _RANGE_RE.match(header.strip())
    if not match or (not match.group(1) and not match.group(2)):
        return None
    if size == 0:
        raise UnsatisfiableRangeError(header)
    first, last = match.groups()
    if not first:  # suffix range: the last N bytes
        length = _capped(last, size)
        if length == 0:
            raise UnsatisfiableRangeError(header)
        return size - length, size - 1
    if last and _magnitude(last) < _magnitude(first):  # invalid (RFC 9110 §14.1.1): ignored
        return None
    start = _capped(first, size)
    if start >= size:
        raise UnsatisfiableRangeError(header)
    end = _capped(last, size) if last else size - 1
    return start, min(end, size - 1)


def _magnitude(digits: str) -> tuple[int, str]:
    """A sort key ordering digit strings by their value, of any length."""
    digits = digits.lstrip("0")
    return len(digits), digits


def _capped(digits: str, cap: int) -> int:
    """`min(int(digits), cap)` without converting thousands of digits (int() refuses > 4,300)."""
    digits = digits.lstrip("0")
    if len(digits) > len(str(cap)):
        return cap
    return min(int(digits or "0"), cap)
