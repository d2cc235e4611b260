"""`registry-proxy serve` in the test's own process: the same flags, settings, generated TLS, metadata store
preparation, listener (connection limits, header, keep-alive and send timeouts, JSON protocol errors) and
graceful shutdown as `python -m proxy serve`, on the test's event loop, without a process start (about a
second of CPU each).

For fault tests that do not check the process boundary itself: signals, `kill -9`, workers, memory of the
process, file descriptors or PIDs of another process keep `ProxyProcess`. What a test reads of a
`ProxyProcess` (url, port, data_dir, ca_file, events, fetched_at, wait_stale, stop) reads the same here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import structlog
from aiohttp import web

from proxy.cli import build_parser, prepare_metadata_store, server_ssl_context, settings_from_args
from proxy.runtime.log import add_request_id
from proxy.web.app import create_app
from proxy.web.listener import bind_listener
from proxy.web.server import ConnectionLimits, serve_app, start_listener
from tests.fakes.process import REGISTRY_HOST, ProxyProcess

__all__ = ["ServedInProcess", "captured_logs"]


@contextlib.contextmanager
def captured_logs() -> Iterator[list[dict]]:
    """The proxy's log records while inside, with the fields its JSON log has (`level`, the request id)."""
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars, add_request_id, structlog.processors.add_log_level]
    ) as logs:
        yield logs


class ServedInProcess:
    """`serve` with `ProxyProcess`'s arguments, served on the running event loop until `stop()`."""

    def __init__(self, data_dir: Path, registry_url: str | None, ca_file: Path, *extra: str, logs: list[dict]) -> None:
        self.data_dir = data_dir
        self.logs = logs
        self._first_log = len(logs)
        self.plain_http = "--plain-http" in extra
        self._registry_url = registry_url
        self._upstream_ca = ca_file
        self._extra = extra
        self._stopped = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.port = 0

    url = ProxyProcess.url
    ca_file = ProxyProcess.ca_file
    fetched_at = ProxyProcess.fetched_at
    wait_stale = ProxyProcess.wait_stale

    @property
    def pid(self) -> int:
        """The process serving: this one."""
        return os.getpid()

    def _arguments(self) -> list[str]:
        upstream = (
            ["--upstream-map", f"{REGISTRY_HOST}={self._registry_url}", "--allow-host", ""]
            if self._registry_url
            else ["--allow-host", REGISTRY_HOST]
        )
        return [
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(self.data_dir),
            *upstream,
            "--upstream-ca-file",
            str(self._upstream_ca),
            *self._extra,
        ]

    async def start(self) -> None:
        """Bind a free port, prepare as `serve` does (ConfigError as it would stop it), and serve once listening."""
        sock = bind_listener("127.0.0.1", self.port)  # a free port, or the one it listened on before a restart
        self.port = sock.getsockname()[1]
        try:
            settings = settings_from_args(build_parser().parse_args(self._arguments()))
            context = server_ssl_context(settings, sorted(settings.tls.tls_hostnames))
            await prepare_metadata_store(settings)
        except BaseException:
            sock.close()
            raise
        listening = asyncio.Event()
        limits = ConnectionLimits.from_settings(settings)

        async def listen(runner: web.AppRunner) -> list[asyncio.Server]:
            listener = await start_listener(runner, context, limits, sock=sock)
            listening.set()
            return [listener]

        self._task = asyncio.create_task(
            serve_app(create_app(settings), listen, self._stopped.wait, shutdown_timeout=settings.server.shutdown_grace)
        )
        listened = asyncio.create_task(listening.wait())
        await asyncio.wait([self._task, listened], return_when=asyncio.FIRST_COMPLETED)
        if not listening.is_set():
            listened.cancel()
            await self._task  # raises what stopped the start
            raise RuntimeError("the proxy stopped before it listened")

    async def restart(self, *more: str) -> None:
        """Stop, then serve again on the same port and data dir with `more` arguments (a restart with new flags);
        `events` then reads the records since this start."""
        await self.stop()
        self._extra = (*self._extra, *more)
        self._stopped = asyncio.Event()
        self._first_log = len(self.logs)
        await self.start()

    def events(self, event: str | None = None) -> list[dict]:
        """The log records since this start (those named `event`, if given); those of another proxy served in
        this process at the same time are among them."""
        return [record for record in self.logs[self._first_log :] if event is None or record.get("event") == event]

    async def stop(self) -> None:
        """Graceful shutdown, as on SIGTERM: requests in flight get the shutdown grace, then the stores close."""
        if self._task is None:
            return
        self._stopped.set()
        task, self._task = self._task, None
        await task
