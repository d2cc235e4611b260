"""Fault-injection fixtures: a client that talks to a real proxy process over its own TLS.

Every test in this folder reproduces a fault against `python -m proxy serve` (the
`proxy_process` fixture of tests/conftest.py), a fake HTTPS upstream, real files, a
real redis-server and real gpg: no mocks. A fault that needs no process boundary (no signal,
`kill -9`, workers, the memory, file descriptors or PID of the process) is reproduced against
`serve` run in the test's own process (`in_process_proxy` of tests/conftest.py, the same flags):
the same application, listener and shutdown, without a process start.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.fakes.process import ProcessClient, ProxyProcess
from tests.fakes.served_in_process import ServedInProcess


@pytest.fixture
async def connect() -> AsyncIterator:
    """`await connect(process)` → a ProcessClient; sessions close after the test."""
    sessions: list[aiohttp.ClientSession] = []

    async def make(process: ProxyProcess | ServedInProcess, timeout: float = 30) -> ProcessClient:
        context = True if process.plain_http else ssl.create_default_context(cafile=str(process.ca_file))
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), timeout=aiohttp.ClientTimeout(total=timeout)
        )
        sessions.append(session)
        return ProcessClient(process, session)

    yield make
    for session in sessions:
        await session.close()
