"""HTTPS_PROXY is honoured for upstream traffic (restricted-egress networks)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.conftest import PROVIDER, serve_proxy

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store


class ConnectProxy:
    """A minimal HTTP CONNECT proxy on loopback that records the tunnels it opened."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = request.split(b"\r\n", 1)[0].decode().split(" ", 2)
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            writer.close()
            return
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


async def test_upstream_requests_go_through_https_proxy(make_settings, client_ssl, registry, monkeypatch):
    egress = ConnectProxy()
    port = await egress.start()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        async with serve_proxy(make_settings(), client_ssl) as running:
            status, body = await running.json(f"/mirror/v1/{PROVIDER}/index.json")
            assert status == 200, body
        assert f"127.0.0.1:{registry.port}" in egress.tunnels
    finally:
        await egress.stop()


async def test_no_proxy_bypasses_the_egress_proxy(make_settings, client_ssl, registry, monkeypatch):
    egress = ConnectProxy()
    port = await egress.start()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    try:
        async with serve_proxy(make_settings(), client_ssl) as running:
            status, _ = await running.json(f"/mirror/v1/{PROVIDER}/index.json")
            assert status == 200
        assert egress.tunnels == []
    finally:
        await egress.stop()


async def test_names_are_checked_even_when_the_egress_proxy_connects(make_settings, client_ssl, registry, monkeypatch):
    egress = ConnectProxy()
    port = await egress.start()
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    registry.files_base = f"https://localhost:{registry.port}"  # a name that resolves to loopback
    try:
        async with serve_proxy(make_settings(), client_ssl) as running:
            name = "terraform-provider-foo_1.0.0_linux_amd64.zip"
            status, body = await running.json(f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/{name}")
            assert (status, body["code"]) == (502, "forbidden_upstream_address")
        assert f"localhost:{registry.port}" not in egress.tunnels
    finally:
        await egress.stop()
