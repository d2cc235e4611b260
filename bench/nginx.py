"""nginx (the Debian package) serving a directory of static files over TLS: the baseline."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from bench.static import StaticServer
from tests.fakes.process import wait_healthy

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)

CONFIG = """\
user root;
worker_processes auto;
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/tmp-body;
    proxy_temp_path {root}/tmp-proxy;
    fastcgi_temp_path {root}/tmp-fastcgi;
    uwsgi_temp_path {root}/tmp-uwsgi;
    scgi_temp_path {root}/tmp-scgi;
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
    }}
}}
"""


class Nginx(StaticServer):
    """One nginx master (ours, in the foreground) with `worker_processes auto`."""

    async def start(self, ca_file: Path) -> None:
        if NGINX is None:
            raise RuntimeError("nginx is not installed")
        self.www.mkdir(parents=True, exist_ok=True)
        (self.www / "healthz").write_text("ok\n")
        config = self.root / "nginx.conf"
        config.write_text(CONFIG.format(root=self.root, port=self.port, cert=self._cert, key=self._key, www=self.www))
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
