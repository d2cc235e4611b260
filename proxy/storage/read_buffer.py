"""A read buffer reused chunk after chunk, but never while any view of it is still alive.

Serving an archive reads it in chunks of a few hundred KiB. A new buffer per chunk costs more than
the read itself: glibc maps a block of 128 KiB or more on its own (`proxy.web.allocator` pins that
threshold), so every chunk was an mmap, 64 zero-filled page faults and an munmap, about 1 CPU s per
GiB against 0.14 for reading into one buffer reused (docs/performance.md#serving-archives-over-tls).

Reusing a buffer is only safe while nothing else can still see it: a transport that could not send a
chunk at once keeps a view of it (uvloop's TCP transport does, asyncio's plain one does too), and
overwriting that memory would send bytes other than those hashed. A bytearray cannot be resized while
a buffer export of it is alive (a memoryview, or a slice of one, or C code holding its buffer), so
`take` tries to: the buffer is reused only when that succeeds, else a new one is made and the old one
is left to whoever still holds it. Correct whatever the callers keep; fast when they keep nothing.
"""

from __future__ import annotations


class ReadBuffer:
    """One bytearray of `size` bytes handed out again and again while no view of it is alive."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buffer = bytearray(size)
        self.allocations = 1  # buffers made, the first one included (a held view forces a new one)

    def take(self) -> bytearray:
        """The buffer to read the next chunk into: the same one as before unless a view of it is still
        alive anywhere (then a new one)."""
        if exported(self._buffer):
            self._buffer = bytearray(self.size)
            self.allocations += 1
        return self._buffer


def exported(buffer: bytearray) -> bool:
    """Whether any buffer export of `buffer` (a memoryview, a slice of one, C code holding it) is alive:
    then it cannot be resized."""
    try:
        buffer.append(0)
    except BufferError:
        return True
    del buffer[-1]
    return False
