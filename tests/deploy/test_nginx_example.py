"""deploy/nginx.conf, run by the real nginx in front of a backend that records what it receives: the
client's address, scheme and a request id are passed on, and a client-forged X-Forwarded-For is not."""

from __future__ import annotations

import asyncio
import re
import shutil
from functools import partial
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.fakes.ports import PORT_ATTEMPTS, free_port, listening_ports
from tests.fakes.process import REPO_ROOT, terminate, wait_for

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
pytestmark = pytest.mark.process

WRAPPER = """
daemon off;
master_process off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{}}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/site.conf;
}}
"""


def site_conf(port: int, backend: int, cert: Path, key: Path) -> str:
    """deploy/nginx.conf as it ships, with this test's port, certificate and backend in place of the
    example's."""
    text = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    replaced = re.sub(r"listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;", text)
    replaced = re.sub(r"ssl_certificate\s+\S+;", f"ssl_certificate {cert};", replaced)
    replaced = re.sub(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {key};", replaced)
    replaced = replaced.replace("proxy_pass http://127.0.0.1:8080;", f"proxy_pass http://127.0.0.1:{backend};")
    assert replaced.count(str(port)) == 1 and replaced.count(str(backend)) == 1, "deploy/nginx.conf changed shape"
    return replaced


async def start_nginx(tmp_path: Path, backend: int, cert: Path, key: Path) -> tuple[asyncio.subprocess.Process, int]:
    """nginx serving the example on a free port (another one if a parallel test took it first)."""
    (tmp_path / "nginx.conf").write_text(WRAPPER.format(tmp=tmp_path))
    for _ in range(PORT_ATTEMPTS):
        port = free_port()
        (tmp_path / "site.conf").write_text(site_conf(port, backend, cert, key))
        process = await asyncio.create_subprocess_exec(
            NGINX, "-c", str(tmp_path / "nginx.conf"), "-p", str(tmp_path), stderr=asyncio.subprocess.DEVNULL
        )
        await wait_for(partial(_up_or_gone, process, port), 30, "nginx to listen")
        if process.returncode is None:
            return process, port
    raise RuntimeError(f"nginx did not start: {(tmp_path / 'error.log').read_text()[-2000:]}")


def _up_or_gone(process: asyncio.subprocess.Process, port: int) -> bool:
    return process.returncode is not None or port in listening_ports(process.pid)


@pytest.fixture
async def backend():
    """An HTTP server on a free port recording the headers of every request it gets."""
    seen: list = []  # CIMultiDictProxy copies: header names in any case

    async def record(request: web.Request) -> web.Response:
        seen.append(request.headers.copy())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield runner.addresses[0][1], seen
    await runner.cleanup()


async def test_nginx_example_sets_the_forwarded_headers_from_its_own_view(
    backend, server_cert_files, client_ssl, tmp_path
):
    if NGINX is None:
        pytest.skip("nginx NOT FOUND: the nginx example is NOT checked (make test installs nginx-light)")
    backend_port, seen = backend
    process, port = await start_nginx(tmp_path, backend_port, *server_cert_files)
    try:
        forged = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "http", "X-Request-Id": "forged"}
        async with aiohttp.ClientSession() as session:
            for headers in ({}, forged):
                async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=client_ssl, headers=headers) as answer:
                    assert answer.status == 200 and await answer.text() == "ok"
    finally:
        await terminate(process, 10)
    assert len(seen) == 2
    for received in seen:
        assert received["X-Forwarded-For"] == "127.0.0.1"  # the edge's own view, never the client's list
        assert received["X-Forwarded-Proto"] == "https"
        assert re.fullmatch(r"[0-9a-f]{32}", received["X-Request-Id"])  # nginx's $request_id
