"""Misbehaving TLS clients at the socket level: idle, slowloris, stop-reading, raw request lines.

Shared by `tests/faults` and `bench/connections.py`. Each connection is an asyncio Protocol
that records what it received and when the server closed it; `tcp_state` reads the kernel's
view of a socket without reading from it (a client that stopped reading cannot see a close
otherwise).
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl

TCP_ESTABLISHED = 1
HEAD_KEEP = 64 * 1024


class RawClient(asyncio.Protocol):
    """One client connection: keeps the first `keep` bytes received (64 KiB), counts the rest, can stop reading."""

    def __init__(self, stop_reading_after: int | None = None, keep: int = HEAD_KEEP) -> None:
        self.keep = keep
        self.head = bytearray()
        self.received = 0
        self.stop_reading_after = stop_reading_after
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.got_data = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if len(self.head) < self.keep:
            self.head += data[: self.keep - len(self.head)]
        self.received += len(data)
        self.got_data.set()
        if self.stop_reading_after is not None and self.received >= self.stop_reading_after:
            assert self.transport is not None
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def tcp_state(self) -> int | None:
        """The socket's TCP state (1 = established); None once the transport is gone."""
        if self.transport is None or self.closed.done():
            return None
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return None
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
        except OSError:
            return None

    def dropped_by_server(self) -> bool:
        """True when the server closed or reset the connection, even if we stopped reading."""
        return self.closed.done() or self.tcp_state() not in (TCP_ESTABLISHED, None)

    def clear(self) -> None:
        """Forget what was received, to read the next response on a keep-alive connection."""
        self.head.clear()
        self.received = 0
        self.got_data.clear()

    async def response(self, timeout: float = 10.0) -> tuple[int | None, bytes]:
        """Wait for one whole response (head plus Content-Length bytes, or the close): (status, body)."""
        async with asyncio.timeout(timeout):
            while True:
                head, sep, body = bytes(self.head).partition(b"\r\n\r\n")
                match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if sep and match and len(body) >= int(match.group(1)):
                    return self.status(), body[: int(match.group(1))]
                if self.closed.done():
                    return self.status(), body
                self.got_data.clear()
                waiter = asyncio.ensure_future(self.got_data.wait())
                await asyncio.wait([waiter, self.closed], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def status(self) -> int | None:
        """The status code of the first response, if its status line arrived."""
        line = bytes(self.head).split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) >= 2 and line[0].startswith(b"HTTP/") and line[1].isdigit() else None

    def body(self) -> bytes:
        return bytes(self.head).partition(b"\r\n\r\n")[2]


async def open_tls(
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    receive_buffer: int | None = None,
    stop_reading_after: int | None = None,
    keep: int = HEAD_KEEP,
    timeout: float = 10.0,
) -> RawClient:
    """A TLS connection (handshake done) whose protocol is a RawClient.

    `receive_buffer` shrinks the kernel's receive buffer so a client that stops reading
    holds little in flight (SO_RCVBUF must be set before connecting).
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if receive_buffer:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
        client = RawClient(stop_reading_after, keep)
        await loop.create_connection(
            lambda: client, sock=sock, ssl=context, server_hostname=host, ssl_handshake_timeout=timeout
        )
    except BaseException:
        sock.close()
        raise
    return client


def request(
    path: str, *, method: str = "GET", headers: dict[str, str] | None = None, version: str = "HTTP/1.1"
) -> bytes:
    """A request head as bytes (no body)."""
    lines = [f"{method} {path} {version}", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def exchange(host: str, port: int, context: ssl.SSLContext, data: bytes, timeout: float = 10.0) -> RawClient:
    """Send raw bytes on a fresh TLS connection and wait until the server closes it."""
    client = await open_tls(host, port, context, timeout=timeout)
    client.send(data)
    await asyncio.wait_for(asyncio.shield(client.closed), timeout)
    return client
