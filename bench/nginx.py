"""nginx (the Debian package) serving a directory of static files over TLS: the baseline."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from tests.fakes.process import free_port, terminate, wait_healthy

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


class Nginx:
    """One nginx master (ours, in the foreground) with `worker_processes auto`."""

    def __init__(self, root: Path, cert: Path, key: Path) -> None:
        self.root = root
        self.www = root / "www"
        self.port = free_port()
        self._cert, self._key = cert, key
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def put(self, path: str, data: bytes | Path) -> None:
        """Serve `data` (bytes, or a file linked/copied in) at URL path `path`."""
        target = self.www / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        if isinstance(data, Path):
            try:
                target.hardlink_to(data)
            except OSError:
                shutil.copyfile(data, target)
        else:
            target.write_bytes(data)

    async def start(self, ca_file: Path) -> None:
        if NGINX is None:
            raise RuntimeError("nginx is not installed")
        self.www.mkdir(parents=True, exist_ok=True)
        (self.www / "healthz").write_text("ok\n")
        config = self.root / "nginx.conf"
        config.write_text(CONFIG.format(root=self.root, port=self.port, cert=self._cert, key=self._key,
                                        www=self.www))
        log = open(self.root / "stderr.log", "ab")  # noqa: ASYNC230, SIM115 - handed to the child process
        self.process = await asyncio.create_subprocess_exec(
            NGINX, "-p", str(self.root), "-c", str(config), "-e", str(self.root / "error.log"),
            stdout=log, stderr=log)
        log.close()
        await wait_healthy(self.url + "/healthz", ca_file, self.process,
                           lambda: (self.root / "error.log").read_text()[-2000:], timeout=10)

    async def stop(self) -> None:
        await terminate(self.process, 10)
        self.process = None


async def nginx_version() -> str | None:
    if NGINX is None:
        return None
    process = await asyncio.create_subprocess_exec(NGINX, "-v", stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
    output, _ = await process.communicate()
    return output.decode().strip().removeprefix("nginx version: ")
