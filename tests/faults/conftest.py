"""Fault-injection fixtures: a client that talks to a real proxy process over its own TLS.

Every test in this folder reproduces a fault against `python -m proxy serve` (the
`proxy_process` fixture of tests/conftest.py), a fake HTTPS upstream, real files, a
real redis-server and real gpg: no mocks. A fault that needs no process boundary (no signal,
`kill -9`, workers, the memory, file descriptors or PID of the process) is reproduced against
`serve` run in the test's own process (`in_process_proxy`, the same flags): the same application,
listener and shutdown, without a process start.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.process import ProcessClient, ProxyProcess
from tests.fakes.served_in_process import ServedInProcess, captured_logs


@pytest.fixture
async def in_process_proxy(tmp_path, registry, ca_file) -> AsyncIterator:
    """`await in_process_proxy(*flags, data_dir=..., upstream=...)`, as `proxy_process` takes them: `serve` in
    front of the fake registry, served in this process (`tests.fakes.served_in_process`); stopped after the test."""
    started: list[ServedInProcess] = []
    with captured_logs() as logs:

        async def start(*extra: str, data_dir: Path | None = None, upstream: bool = True) -> ServedInProcess:
            served = ServedInProcess(
                data_dir or tmp_path / "proxy-data", registry.url if upstream else None, ca_file, logs, *extra
            )
            await served.start()
            started.append(served)
            return served

        yield start
        for served in started:
            await served.stop()


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
