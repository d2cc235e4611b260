"""The deploy tests' proxy behind a real nginx (deploy/nginx.conf as shipped, or under a prefix): nginx is the
process under test, the proxy is `serve` in the test's process (`tests.fakes.served_in_process`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.nginx import NGINX_ADDRESS, BehindNginx, Nginx
from tests.fakes.ports import free_port
from tests.fakes.served_in_process import ServedInProcess, captured_logs


@pytest.fixture
async def behind_nginx(tmp_path, registry, ca_file, server_cert_files) -> AsyncIterator:
    """Start a proxy process behind nginx: the shipped nginx.conf, or with `prefix` one that serves it under that
    path (stripped), the proxy given `--public-url https://localhost:PORT/PREFIX`."""
    started: list = []
    with captured_logs() as logs:

        async def start(*extra: str, prefix: str | None = None) -> BehindNginx:
            port = free_port()
            public = ["--public-url", f"https://localhost:{port}{prefix}"] if prefix else []
            proxy = ServedInProcess(
                tmp_path / "proxy-data",
                registry.url,
                ca_file,
                "--plain-http",
                "--trusted-proxies",
                NGINX_ADDRESS,
                *public,
                *extra,
                logs=logs,
            )
            await proxy.start()
            started.append(proxy)
            nginx = (
                Nginx.prefixed(tmp_path / "nginx", *server_cert_files, proxy.port, prefix, port)
                if prefix
                else Nginx.shipped(tmp_path / "nginx", *server_cert_files, proxy.port)
            )
            await nginx.start(ca_file)
            started.append(nginx)
            return BehindNginx(proxy, nginx, ca_file)

        yield start
        for process in reversed(started):
            await process.stop()
