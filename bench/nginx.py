"""nginx (the Debian package) serving a directory of static files over TLS: the baseline."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.static import StaticServer
from tests.fakes.nginx import MAIN, NGINX
from tests.fakes.process import wait_healthy

SERVER = """\
    types {{ application/json json; application/zip zip; }}
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {www};
    }}"""


class Nginx(StaticServer):
    """One nginx master (ours, in the foreground) with `worker_processes auto`."""

    async def start(self, ca_file: Path) -> None:
        if NGINX is None:
            raise RuntimeError("nginx is not installed")
        self.www.mkdir(parents=True, exist_ok=True)
        (self.www / "healthz").write_text("ok\n")
        config = self.root / "nginx.conf"
        server = SERVER.format(port=self.port, cert=self._cert, key=self._key, www=self.www)
        config.write_text(MAIN.format(root=self.root, workers="auto", connections=4096, http=server))
        log = open(self.root / "stderr.log", "ab")  # noqa: ASYNC230, SIM115 - handed to the child process
        self.process = await asyncio.create_subprocess_exec(
            NGINX, "-p", str(self.root), "-c", str(config), "-e", str(self.root / "error.log"), stdout=log, stderr=log
        )
        log.close()
        await wait_healthy(
            self.url + "/healthz",
            ca_file,
            self.process,
            lambda: (self.root / "error.log").read_text()[-2000:],
            timeout=10,
        )


async def nginx_version() -> str | None:
    if NGINX is None:
        return None
    process = await asyncio.create_subprocess_exec(
        NGINX, "-v", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    return output.decode().strip().removeprefix("nginx version: ")
