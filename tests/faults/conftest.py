"""Fault-injection fixtures: a client that talks to a real proxy process over its own TLS.

Every test in this folder reproduces a fault against `python -m proxy serve` (the
`proxy_process` fixture of tests/conftest.py), a fake HTTPS upstream, real files, a
real redis-server and real gpg: no mocks. A fault that needs no process boundary (no signal,
restart, second process or real server loop) is reproduced against the same application served
in the test's own process (`in_process_proxy`): the same checks, without a process start.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.conftest import serve_proxy
from tests.fakes.process import ProcessClient, ProxyProcess


@dataclass
class InProcessProxy:
    """The application served in this process, with what fault tests read of a ProxyProcess."""

    url: str
    data_dir: Path
    ca_file: Path
    plain_http: bool
    logs: list[dict]

    def events(self, event: str | None = None) -> list[dict]:
        """The log records so far (those named `event`, if given), as the process logs them."""
        return [record for record in self.logs if event is None or record.get("event") == event]


@pytest.fixture
async def in_process_proxy(make_local_settings, client_ssl, ca_file) -> AsyncIterator:
    """`await in_process_proxy(**settings)`: the proxy in front of the fake registry, served in this
    process over TLS (the test CA's certificate) on a port it bound itself; `connect` talks to it."""
    async with contextlib.AsyncExitStack() as stack:
        logs = stack.enter_context(capture_logs())

        async def start(**overrides) -> InProcessProxy:
            settings = make_local_settings(**overrides)
            running = await stack.enter_async_context(serve_proxy(settings, client_ssl))
            return InProcessProxy(running.url, settings.data_dir, ca_file, settings.tls.plain_http, logs)

        yield start


@pytest.fixture
async def connect() -> AsyncIterator:
    """`await connect(process)` → a ProcessClient; sessions close after the test."""
    sessions: list[aiohttp.ClientSession] = []

    async def make(process: ProxyProcess | InProcessProxy, timeout: float = 30) -> ProcessClient:
        context = True if process.plain_http else ssl.create_default_context(cafile=str(process.ca_file))
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=timeout)
        )
        sessions.append(session)
        return ProcessClient(process, session)

    yield make
    for session in sessions:
        await session.close()
