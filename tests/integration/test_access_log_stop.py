"""The access log is written a moment after the answers (`proxy.runtime.log.AccessLines`): a stop loses no line.
SIGTERM right after the answers, to a proxy of one process and to one of two workers: once it has exited, the
answers' lines are in the log. And in this process, lines that would wait for an hour are written when the
application stops (its cleanup), with its metrics' tallies folded."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import socket
import ssl

import aiohttp
import pytest
from aiohttp import web

from proxy.runtime import log
from proxy.web.app import create_app
from proxy.web.app_keys import METRICS
from proxy.web.server import ConnectionLimits, serve_app, start_listener

INDEX = "/mirror/v1/registry.example.test/acme/foo/index.json"


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_the_last_answers_line_is_logged_when_the_proxy_stops(proxy_process, workers):
    proxy = await proxy_process("--workers", workers)
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session:
        for n in range(5):
            headers = {"X-Request-Id": f"last-{n}"}
            async with session.get(proxy.url + INDEX, ssl=context, headers=headers) as response:
                assert response.status == 200
                await response.read()
    proxy.process.send_signal(signal.SIGTERM)  # within the moment the lines wait
    assert await proxy.process.wait() == 0
    logged = {record.get("request_id") for record in proxy.events("request")}
    assert {f"last-{n}" for n in range(5)} <= logged


async def test_lines_still_waiting_are_written_when_the_application_stops(make_local_settings, monkeypatch):
    stream = io.StringIO()
    lines = log.AccessLines(stream, after=3600)  # never written on their own here
    monkeypatch.setattr(log, "_access_lines", lines)
    monkeypatch.setattr(log, "_access_writer", log._json_lines(lines))
    app = create_app(make_local_settings())
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    async def listen(runner: web.AppRunner) -> list[asyncio.Server]:
        return [await start_listener(runner, None, ConnectionLimits(), sock=sock)]

    async def one_request() -> None:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/nowhere") as response:
            assert response.status == 404
        assert stream.getvalue() == ""  # still waiting

    await serve_app(app, listen, one_request, shutdown_timeout=1)
    assert [record["path"] for record in map(json.loads, stream.getvalue().splitlines())] == ["/nowhere"]
    sample = app[METRICS].registry.get_sample_value
    assert sample("registry_proxy_requests_total", {"route": "unmatched", "status": "404"}) == 1
