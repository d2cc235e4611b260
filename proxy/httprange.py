"""HTTP `Range` header parsing for archive downloads (single byte ranges). Pure."""

from __future__ import annotations

import re

_RANGE_RE = re.compile(r"^bytes=([0-9]*)-([0-9]*)\Z")


class UnsatisfiableRange(ValueError):
    """The range lies outside the file: answer 416."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """`(start, end_inclusive)` for a single satisfiable range; None means "send it all".

    Multi-range and malformed headers are ignored (a 200 with the whole file is always a
    valid answer); a syntactically valid range past the end raises UnsatisfiableRange.
    """
    if not header:
        return None
    match = _RANGE_RE.match(header.strip())
    if not match or (not match.group(1) and not match.group(2)):
        return None
    if size == 0:
        raise UnsatisfiableRange(header)
    first, last = match.groups()
    if not first:  # suffix range: the last N bytes
        length = int(last)
        if length == 0:
            raise UnsatisfiableRange(header)
        return max(size - length, 0), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if start >= size:
        raise UnsatisfiableRange(header)
    if end < start:
        return None
    return start, min(end, size - 1)
