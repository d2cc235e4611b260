"""aiohttp client connections that read into one buffer of the process (aiohttp's internals: pinned version).

uvloop's and asyncio's SSL protocols hand a plain protocol, such as aiohttp's client `ResponseHandler`, each
piece of decrypted data as a new `bytes`, allocated at 256 KiB for every read of the SSL object and then cut
to what it holds (one TLS record, up to 16 KiB). With glibc's mmap threshold pinned at 128 KiB
(`proxy.web.allocator`) every such block is mapped, remapped and unmapped on its own: three system calls and
page faults per TLS record, about 4 CPU s per GiB of an archive read from an S3 store over HTTPS, more than
the rest of serving it (docs/performance.md#archives-from-s3-and-with-a-policy).

A buffered protocol gets the decrypted bytes written into a buffer it hands out instead
(`proxy.runtime.shared_reads`: the process's one buffer, sized to all that is pending). So a connection made
with `read_into_shared_buffer`'s connector swaps its transport's protocol, once it is made, for
`SharedBufferReads`: the transport reads into that buffer and aiohttp gets copies of what arrived in pieces of
64 KiB, while aiohttp keeps its own protocol object for everything else (requests, pausing, the connection
pool).
"""

from __future__ import annotations

import asyncio
import functools

import aiohttp
from aiohttp.client_proto import ResponseHandler

from proxy.runtime.shared_reads import SharedReadBuffer

__all__ = ["BufferedResponseHandler", "SharedBufferReads", "read_into_shared_buffer"]


class SharedBufferReads(asyncio.BufferedProtocol):
    """A transport's protocol that reads into the process's one buffer (`SharedReadBuffer`) and passes every
    event on to aiohttp's protocol."""

    def __init__(self, handler: ResponseHandler) -> None:
        self.handler = handler

    get_buffer = staticmethod(SharedReadBuffer.get)  # no call of this protocol's in between, per read

    def buffer_updated(self, nbytes: int) -> None:
        SharedReadBuffer.hand_on(nbytes, self.handler.data_received)

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
