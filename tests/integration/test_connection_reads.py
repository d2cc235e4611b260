"""Every connection reads into one buffer of the process (`proxy.runtime.shared_reads`, a buffered protocol):
what each connection's protocol gets is exactly what its client sent, also when several connections send at once,
bodies larger than the buffer arrive in several reads, over TLS on both event loops, and when a client closed
before the connection read what it sent."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from proxy.runtime.metrics import Metrics
from proxy.runtime.shared_reads import PIECE
from proxy.web.eventloop import new_event_loop
from proxy.web.server import ConnectionGate, ConnectionLimits, LimitedConnection
from tests.fakes.process import wait_for


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
        loop.run_until_complete(exchange(tls, clients=4, size=3 * PIECE))
    finally:
        loop.close()


class Paused(asyncio.Protocol):
    """The protocol behind the connection: not reading at first (as aiohttp, its request body buffer full),
    keeps what it is handed, and says so when the connection is lost."""

    def __init__(self, lost: asyncio.Future[bytes]) -> None:
        self.data = bytearray()
        self.lost = lost

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.pause_reading()

    def eof_received_below(self) -> bool:
        """Whether asyncio's SSL protocol under the connection has seen the end of the TCP stream (its own flag)."""
        return self.transport._ssl_protocol._eof_received

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost.set_result(bytes(self.data))


def send_and_half_close(port: int, context: ssl.SSLContext, body: bytes) -> None:
    """A client that sends `body` over TLS, then ends its side with a TCP half-close (no close_notify, as a
    client that shuts its socket down), and reads until the server closes."""
    with socket.create_connection(("127.0.0.1", port)) as raw, context.wrap_socket(raw) as tls:
        tls.sendall(body)
        socket.socket.shutdown(tls, socket.SHUT_WR)
        while socket.socket.recv(tls, 65536):
            pass


async def half_closed_while_paused(tls: tuple[ssl.SSLContext, ssl.SSLContext], size: int) -> None:
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[bytes] = loop.create_future()
    protocols: list[Paused] = []

    def new_protocol() -> Paused:
        protocols.append(Paused(lost))
        return protocols[-1]

    gate = ConnectionGate(100, Metrics())
    server = await loop.create_server(
        lambda: LimitedConnection(gate, ConnectionLimits(), new_protocol, loop), "127.0.0.1", 0, ssl=tls[0]
    )
    body = bytes(range(256)) * (size // 256)
    port = server.sockets[0].getsockname()[1]
    client = asyncio.ensure_future(asyncio.to_thread(send_and_half_close, port, tls[1], body))
    try:
        await wait_for(lambda: bool(protocols) and protocols[0].eof_received_below(), 10, "the end of the stream")
        protocols[0].transport.resume_reading()
        assert await lost == body
    finally:
        await client
        server.close()
        await server.wait_closed()


def test_what_a_client_sent_before_it_closed_is_all_read(server_cert_files, ca_file):
    """A client sends more than 64 KiB and half-closes while the connection is not reading: asyncio's SSL protocol
    then reads one buffer when reading resumes and drops what did not fit, so the buffer holds all that is
    pending. (uvloop's drops everything not yet handed on at a TCP end without close_notify, whatever the buffer:
    it takes it for a broken connection.)"""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(*server_cert_files)
    client = ssl.create_default_context(cafile=str(ca_file))
    client.check_hostname = False
    loop = new_event_loop("asyncio")
    try:
        loop.run_until_complete(half_closed_while_paused((server, client), size=150_000))
    finally:
        loop.close()
