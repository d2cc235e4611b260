"""Giving memory back to the system after bursts of connections (glibc's malloc).

Every TLS connection holds a 256 KiB read buffer (asyncio's and uvloop's SSL protocols alike) and
OpenSSL's own buffers. Nothing of it leaks: once the connections are closed, the objects are gone and
malloc's bytes in use are back where they were. But glibc keeps the freed memory, for two reasons:

- Its mmap threshold is dynamic: blocks of 128 KiB and more start out mapped on their own (unmapped on
  free), until the first such block is freed; then the threshold rises to that block's size and every
  later read buffer comes from the heap.
- Freed heap memory goes back to the system only from the heap's top; the small, long-lived allocations
  made between the buffers pin the rest. Each burst then touches other pages of that free space.

So with uvloop, bursts of 1,000-3,000 idle TLS connections took the RSS from 90 to over 600 MiB with
about 20 MiB in use (bench/idle_soak.py; the numbers are in docs/performance.md). Two remedies, both
without effect on other allocators (jemalloc through LD_PRELOAD, musl):

- `pin_mmap_threshold`: the threshold fixed at glibc's default 128 KiB, so a connection's read buffer is
  mapped with the connection and unmapped when it closes (an operator's MALLOC_MMAP_THRESHOLD_ or
  GLIBC_TUNABLES setting is left alone);
- `BurstTrimmer`: once the open connections have fallen well below their peak, `malloc_trim(0)` returns
  the free pages inside the heap (and every arena) to the system.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
MMAP_THRESHOLD = 128 * 1024  # glibc's default, held fixed
TRIM_AFTER_DROP = 128  # connections closed since the peak before memory is worth trimming
TRIM_DELAY = 1.0  # seconds after the drop: the rest of a burst closes first, one trim serves it all


def _glibc() -> ctypes.CDLL | None:
    """glibc's libc with malloc_trim and mallopt, or None (another C library)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, ValueError, AttributeError):
        return None
    return libc


_LIBC = _glibc()


def operator_tuned(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Whether the operator configured malloc's mmap threshold through the environment."""
    return "MALLOC_MMAP_THRESHOLD_" in environ or "glibc.malloc.mmap_threshold" in environ.get("GLIBC_TUNABLES", "")


def pin_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at 128 KiB for this process (and the processes it forks). True if done."""
    if _LIBC is None or operator_tuned():
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim() -> bool:
    """Return the free memory of every malloc arena to the system; False without glibc or when nothing was."""
    return _LIBC is not None and bool(_LIBC.malloc_trim(0))


class BurstTrimmer:
    """Calls `trim` once a burst of connections has closed: when the open connections have fallen by at least
    `drop` since their peak, `delay` seconds later (on the loop's default executor: malloc_trim holds the
    arenas' locks, not the event loop)."""

    def __init__(
        self,
        *,
        drop: int = TRIM_AFTER_DROP,
        delay: float = TRIM_DELAY,
        release: Callable[[], bool] = trim,
        enabled: bool = _LIBC is not None,
    ) -> None:
        self.drop = drop
        self.delay = delay
        self.release = release
        self.enabled = enabled
        self.peak = 0
        self.trims = 0
        self._timer: asyncio.TimerHandle | None = None
        self._open = 0

    @property
    def pending(self) -> bool:
        """A trim is scheduled."""
        return self._timer is not None

    def opened(self, open_now: int) -> None:
        self._open = open_now
        self.peak = max(self.peak, open_now)

    def closed(self, open_now: int) -> None:
        self._open = open_now
        if self.enabled and self._timer is None and self.peak - open_now >= self.drop:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self._start)

    def _start(self) -> None:
        self._timer = None
        self.peak = self._open  # the next burst is measured from here
        asyncio.get_running_loop().run_in_executor(None, self._trim)

    def _trim(self) -> None:
        started = time.monotonic()
        released = self.release()
        self.trims += 1
        log.debug("memory.trimmed", released=released, seconds=round(time.monotonic() - started, 4))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
