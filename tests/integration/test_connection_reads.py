"""Every connection reads into one buffer of the process (`proxy.web.server.READ_BUFFER`, a buffered protocol):
what each connection's protocol gets is exactly what its client sent, also when several connections send at once,
bodies larger than the buffer arrive in several reads, and over TLS on both event loops."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from proxy.runtime.metrics import Metrics
from proxy.web.eventloop import new_event_loop
from proxy.web.server import READ_BUFFER_SIZE, ConnectionGate, ConnectionLimits, LimitedConnection


class Recorder(asyncio.Protocol):
    """The protocol behind the connection: keeps what it was handed, answers `ok` once `expected` bytes arrived."""

    def __init__(self, received: list[bytearray], expected: int) -> None:
        self.data = bytearray()
        self.expected = expected
        received.append(self.data)

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        assert isinstance(data, bytes)  # a copy: the buffer is the next connection's at once
        self.data += data
        if len(self.data) == self.expected:
            self.transport.write(b"ok")


async def exchange(tls: tuple[ssl.SSLContext, ssl.SSLContext] | None, clients: int, size: int) -> None:
    loop = asyncio.get_running_loop()
    received: list[bytearray] = []
    gate = ConnectionGate(100, Metrics())
    server = await loop.create_server(
        lambda: LimitedConnection(gate, ConnectionLimits(), lambda: Recorder(received, size), loop),
        "127.0.0.1",
        0,
        ssl=tls[0] if tls else None,
    )
    port = server.sockets[0].getsockname()[1]
    bodies = [bytes([65 + n]) * (size // 2) + bytes(range(256)) * (size // 512) for n in range(clients)]

    async def send(body: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls[1] if tls else None)
        for start in range(0, len(body), 10_000):  # in pieces, interleaved with the other clients'
            writer.write(body[start : start + 10_000])
            await writer.drain()
        answer = await reader.readexactly(2)
        writer.close()
        return answer

    try:
        assert await asyncio.gather(*(send(body) for body in bodies)) == [b"ok"] * clients
        assert sorted(bytes(data) for data in received) == sorted(bodies)
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop_name", ["uvloop", "asyncio"])
@pytest.mark.parametrize("over_tls", [True, False])
def test_each_connection_gets_exactly_its_own_bytes(loop_name, over_tls, server_cert_files, ca_file):
    tls = None
    if over_tls:
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(*server_cert_files)
        tls = (server, ssl.create_default_context(cafile=str(ca_file)))
    loop = new_event_loop(loop_name)
    try:
        loop.run_until_complete(exchange(tls, clients=4, size=3 * READ_BUFFER_SIZE))
    finally:
        loop.close()
