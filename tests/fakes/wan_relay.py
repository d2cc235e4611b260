"""A WAN in front of a local server: a TCP relay that adds a round-trip time to everything, connecting included.

Shared by `bench/` (benchmark 7, cold inits across a WAN) and the tests that need handshakes to cost time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class WanRelay:
    """A TCP relay on 127.0.0.1 in front of `target_port` that adds a round-trip time of `latency` seconds.

    Every chunk read from either side is written to the other half a round trip later (in order); what a
    client sends is held until one round trip after it connected (TCP's SYN and SYN-ACK), so its first bytes
    arrive one and a half round trips after `connect`, as on a real network. `connections` holds the wall
    clock of each connection accepted (`time.time()`, comparable with the proxy's log).
    """

    def __init__(self, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.target_port = target_port
        self.latency = 0.0
        self.connections: list[float] = []
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"https://{self.host}:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, self.host, 0)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):  # their reads end, and so their links
            writer.transport.abort()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accepted(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        self._writers.add(client_writer)
        self.connections.append(time.time())
        latency, connected = self.latency, asyncio.get_running_loop().time()
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            client_writer.close()
            self._writers.discard(client_writer)
            self._links.discard(task)
            return
        self._writers.add(upstream_writer)
        try:
            await asyncio.gather(
                _delayed_pipe(client_reader, upstream_writer, latency / 2, connected + latency),
                _delayed_pipe(upstream_reader, client_writer, latency / 2, 0.0),
            )
        finally:
            for writer in (client_writer, upstream_writer):
                writer.close()
                self._writers.discard(writer)
            self._links.discard(task)


async def _delayed_pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, not_before: float
) -> None:
    """Copy `reader` to `writer`, each chunk `delay` seconds after it was read, or after `not_before` (the loop's
    clock) if it was read before that; the end of the stream (a half close) too. A reset ends it quietly."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if (wait := due - loop.time()) > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    delivering = asyncio.ensure_future(deliver())
    try:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                data = await reader.read(1 << 16)
                queue.put_nowait((max(loop.time(), not_before) + delay, data))
                if not data or delivering.done():  # the end, or the other side went away
                    break
            await delivering
    finally:
        delivering.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await delivering
