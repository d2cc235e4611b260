"""aiohttp client connections that read into one buffer of the process (aiohttp's internals: pinned version).

uvloop's and asyncio's SSL protocols hand a plain protocol, such as aiohttp's client `ResponseHandler`, each
piece of decrypted data as a new `bytes`, allocated at 256 KiB for every read of the SSL object and then cut
to what it holds (one TLS record, up to 16 KiB). With glibc's mmap threshold pinned at 128 KiB
(`proxy.web.allocator`) every such block is mapped, remapped and unmapped on its own: three system calls and
page faults per TLS record, about 4 CPU s per GiB of an archive read from an S3 store over HTTPS, more than
the rest of serving it (docs/performance.md#archives-from-s3-and-with-a-policy).

A buffered protocol gets the decrypted bytes written into a buffer it hands out instead. So a connection made
with `read_into_shared_buffer`'s connector swaps its transport's protocol, once it is made, for
`SharedBufferReads`: the transport reads into one buffer of the process and `buffer_updated` hands aiohttp
copies of what arrived in pieces of 64 KiB (served from malloc's free lists, never mapped), while aiohttp keeps
its own protocol object for everything else (requests, pausing, the connection pool).

The buffer always holds all that the SSL protocol has pending (its size hint): asyncio's protocol reads a
buffer once when the peer closes while reading is paused and drops whatever did not fit, and uvloop's drops
what it has not handed on when the connection ends, so a smaller buffer would lose the end of a body that
the store sent before it closed the connection. It grows to the most the protocols hold (their flow control
bounds it to a few hundred KiB) and is never freed.
"""

from __future__ import annotations

import asyncio
import functools

import aiohttp
from aiohttp.client_proto import ResponseHandler

PIECE = 64 * 1024  # what aiohttp is handed at a time: below the mmap threshold, the copies come from the heap


class SharedBufferReads(asyncio.BufferedProtocol):
    """A transport's protocol that reads into the process's one buffer and passes every event on to aiohttp's
    protocol.

    Sharing one buffer is safe: the transports call `get_buffer` and `buffer_updated` back to back, and the
    bytes are copied out before anything else runs (one event loop per process makes client connections, the
    server's or a command's, as for the server's own read buffer)."""

    buffer = memoryview(bytearray(PIECE))  # of the process: replaced by a larger one when a hint asks for more

    def __init__(self, handler: ResponseHandler) -> None:
        self.handler = handler

    def get_buffer(self, sizehint: int) -> memoryview:
        if sizehint > len(SharedBufferReads.buffer):
            SharedBufferReads.buffer = memoryview(bytearray(sizehint))
        return SharedBufferReads.buffer

    def buffer_updated(self, nbytes: int) -> None:
        buffer, handler = SharedBufferReads.buffer, self.handler
        for start in range(0, nbytes, PIECE):
            handler.data_received(buffer[start : min(start + PIECE, nbytes)].tobytes())

    def eof_received(self) -> bool | None:
        return self.handler.eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.handler.resume_writing()


class BufferedResponseHandler(ResponseHandler):
    """aiohttp's client protocol, whose transport reads through `SharedBufferReads` once it is connected."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        transport.set_protocol(SharedBufferReads(self))


def read_into_shared_buffer(connector: aiohttp.BaseConnector) -> aiohttp.BaseConnector:
    """`connector`, its new connections reading into the process's one buffer (aiohttp builds each connection's
    protocol with the connector's `_factory`)."""
    connector._factory = functools.partial(BufferedResponseHandler, loop=connector._loop)  # type: ignore[attr-defined]
    return connector
