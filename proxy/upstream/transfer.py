"""The minimum transfer rate of a download, as pure bookkeeping (the caller supplies the clock).

After a grace period, the bytes received in the last `window` seconds must add up to at
least `min_rate * window`. `patience` tells how long the caller may wait for the next
chunk before that can no longer hold, so a trickle is caught on time even when no chunk
arrives at all.
"""

from __future__ import annotations

from collections import deque

BUCKETS_PER_WINDOW = 16


class TransferRate:
    """Bytes over a sliding window, kept in a few time buckets."""

    def __init__(self, min_rate: int, window: float, now: float, grace: float | None = None) -> None:
        self.min_rate = min_rate
        self.window = window
        self._needed = min_rate * window
        self._grace_end = now + (window if grace is None else grace)
        self._resolution = window / BUCKETS_PER_WINDOW
        self._buckets: deque[list[float]] = deque()  # [time of the last byte, bytes], oldest first

    def add(self, size: int, now: float) -> None:
        if self._buckets and now - self._buckets[-1][0] < self._resolution:
            self._buckets[-1][0] = now
            self._buckets[-1][1] += size
        else:
            self._buckets.append([now, size])
        self._prune(now)

    def received(self, now: float) -> float:
        """Bytes that arrived within the last window."""
        self._prune(now)
        return sum(size for _, size in self._buckets)

    def too_slow(self, now: float) -> bool:
        return self.min_rate > 0 and now >= self._grace_end and self.received(now) < self._needed

    def patience(self, now: float) -> float | None:
        """Seconds from `now` until the transfer is too slow if nothing more arrives (None: no minimum)."""
        if self.min_rate <= 0:
            return None
        start = max(now, self._grace_end)
        left = sum(size for when, size in self._buckets if when + self.window > start)
        if left < self._needed:
            return start - now
        for when, size in self._buckets:
            if when + self.window <= start:
                continue
            left -= size
            if left < self._needed:
                return when + self.window - now
        return start - now  # unreachable while min_rate > 0: an empty window is always too slow

    def _prune(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] + self.window <= now:
            self._buckets.popleft()
