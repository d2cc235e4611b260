"""An archive the proxy cannot store now (disk full), relayed from the upstream and verified on the way.

The service layer hands the web layer a `UpstreamRelay` instead of a `StoredArchive`; calling
`stream(begin, send)` fetches the upstream archive, hashes it while passing every chunk but
the last to `send`, and sends the last one only once the digest matched the expected one
(signed SHA256SUMS for providers, the `?checksum=` pin for modules). On a mismatch it raises
with the last chunk withheld, so a client never receives the complete (unverified) body.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Begin = Callable[[int | None], Awaitable[None]]  # called with the body length, when it is known
Send = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True)
class UpstreamRelay:
    """A verified-on-the-way relay of an upstream archive; `etag` is its SHA-256 when that is the pin, `size`
    its length when known before it is streamed (a download followed as it grows: its Content-Length), and
    `stored_as` the SHA-256 the store keeps it under once verified (a followed download, which counts as a
    serve of that archive; None for a relay that is not stored)."""

    etag: str | None
    stream: Callable[[Begin, Send], Awaitable[None]]
    size: int | None = None
    stored_as: str | None = None
