"""The one read buffer of the process that buffered protocols read connections into: the server's client
connections (`proxy.web.server`) and the S3 store's connections (`proxy.runtime.client_reads`).

uvloop's and asyncio's SSL protocols otherwise hand a plain protocol each piece of decrypted data as a new
`bytes`, allocated at 256 KiB for every read of the SSL object, which with glibc's mmap threshold pinned at
128 KiB (`proxy.web.allocator`) is an mmap, an mremap and an munmap each. A buffered protocol gets them written
into the buffer it hands out, and hands on copies of what arrived in pieces of 64 KiB (served from malloc's free
lists, never mapped).

The buffer always holds all that the SSL protocol has pending (its size hint): asyncio's protocol reads a
buffer once when the peer's connection ends (a TCP close or half-close without TLS's close_notify, also while
reading is paused) and drops whatever did not fit, so a smaller buffer loses the end of what the peer sent
before it closed (tests/integration/test_connection_reads.py). It grows to the most the protocols hold (their
flow control bounds it to a few hundred KiB) and is never freed.

Sharing one buffer is safe: the transports call `get_buffer` and `buffer_updated` back to back, and the bytes
are copied out before anything else runs (one event loop per process).
"""

from __future__ import annotations

from collections.abc import Callable

PIECE = 64 * 1024  # what a protocol is handed at a time: below the mmap threshold, the copies come from the heap


class SharedReadBuffer:
    """The process's one read buffer (class state: one per process)."""

    view = memoryview(bytearray(PIECE))  # replaced by a larger one when a size hint asks for more

    @staticmethod
    def get(sizehint: int) -> memoryview:
        """The buffer, at least `sizehint` bytes long (a transport's `get_buffer`)."""
        if sizehint > len(SharedReadBuffer.view):
            SharedReadBuffer.view = memoryview(bytearray(sizehint))
        return SharedReadBuffer.view

    @staticmethod
    def hand_on(nbytes: int, data_received: Callable[[bytes], object]) -> None:
        """Copies of the first `nbytes` of the buffer to `data_received`, in pieces of at most `PIECE` bytes
        (a transport's `buffer_updated`)."""
        view = SharedReadBuffer.view
        if nbytes <= PIECE:  # every request but the largest: one copy, no loop
            data_received(view[:nbytes].tobytes())
            return
        for start in range(0, nbytes, PIECE):
            data_received(view[start : min(start + PIECE, nbytes)].tobytes())
