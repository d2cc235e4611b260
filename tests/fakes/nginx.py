"""A real nginx (Debian's nginx-light) in front of a proxy process: the shipped deploy/nginx.conf, or another
server block, run in the foreground on a free port with its own prefix, logs and temp dirs."""

from __future__ import annotations

import asyncio
import re
import shutil
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp

from tests.fakes.ports import PORT_ATTEMPTS, free_port, listening_ports
from tests.fakes.process import REPO_ROOT, ProxyProcess, terminate, wait_for, wait_healthy

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
# The address nginx connects to the proxy from (`proxy_bind`): the one trusted proxy of the tests, so a client
# connecting from 127.0.0.1 is an untrusted peer.
NGINX_ADDRESS = "127.0.0.2"

# The whole configuration: nginx in the foreground with everything it writes under `root`, and `http` (the http
# block's own directives and server blocks).
MAIN = """\
user root;
worker_processes {workers};
daemon off;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections {connections}; }}
http {{
    access_log off;
    client_body_temp_path {root}/tmp-body;
    proxy_temp_path {root}/tmp-proxy;
    fastcgi_temp_path {root}/tmp-fastcgi;
    uwsgi_temp_path {root}/tmp-uwsgi;
    scgi_temp_path {root}/tmp-scgi;
{http}
}}
"""


def shipped_server(port: int, cert: Path, key: Path, upstream_port: int, cache: Path) -> str:
    """deploy/nginx.conf's server block as shipped, with this test's port, certificate, proxy address and
    micro-cache directory (and nginx connecting from NGINX_ADDRESS)."""
    text = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    replacements = [
        (r"listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;"),
        (r"ssl_certificate\s+/etc/ssl/mirror\.crt;", f"ssl_certificate {cert};"),
        (r"ssl_certificate_key /etc/ssl/mirror\.key;", f"ssl_certificate_key {key};"),
        (r"server 127\.0\.0\.1:8080;", f"server 127.0.0.1:{upstream_port};"),
        (r"proxy_set_header X-Request-Id", f"proxy_bind {NGINX_ADDRESS};\n    proxy_set_header X-Request-Id"),
        (r"/var/cache/nginx/registry-proxy", str(cache)),
    ]
    for pattern, replacement in replacements:
        text, count = re.subn(pattern, replacement, text)
        assert count == 1, f"deploy/nginx.conf no longer has {pattern!r}"
    return text


PREFIXED = """\
server {{
    listen 127.0.0.1:{port} ssl;
    ssl_certificate     {cert};
    ssl_certificate_key {key};
    location {prefix} {{
        proxy_pass http://127.0.0.1:{upstream_port}/;
        proxy_bind {address};
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_set_header X-Forwarded-Host $http_host;
    }}
    location = /.well-known/terraform.json {{
        proxy_pass http://127.0.0.1:{upstream_port};
        proxy_bind {address};
    }}
}}
"""


class Nginx:
    """nginx with one server block (`server`), listening on `port` (TLS as the block says); the proxy's
    `/healthz` is at `prefix` + `healthz`."""

    def __init__(
        self, root: Path, server: str, port: int, prefix: str = "/", rebuild: Callable[[int], str] | None = None
    ) -> None:
        self.root = root
        self.server = server
        self.port = port
        self.prefix = prefix
        self.rebuild = rebuild  # the server block for another port, if someone took this one first
        self.workers: int | str = 1  # worker_processes (the benchmark's front: "auto")
        self.connections = 64  # worker_connections
        self.process: asyncio.subprocess.Process | None = None

    @classmethod
    def shipped(cls, root: Path, cert: Path, key: Path, upstream_port: int) -> Nginx:
        def server(port: int) -> str:
            return shipped_server(port, cert, key, upstream_port, root / "cache")

        port = free_port()
        return cls(root, server(port), port, rebuild=server)

    @classmethod
    def prefixed(cls, root: Path, cert: Path, key: Path, upstream_port: int, prefix: str, port: int) -> Nginx:
        """Serving the proxy under `prefix` (e.g. `/tf/`), which it strips, and the discovery document at the root."""
        server = PREFIXED.format(
            port=port, cert=cert, key=key, prefix=prefix, upstream_port=upstream_port, address=NGINX_ADDRESS
        )
        return cls(root, server, port, prefix)

    @property
    def url(self) -> str:
        """Where clients reach the proxy, ending in `/`."""
        return f"https://localhost:{self.port}{self.prefix}"

    async def start(self, ca_file: Path) -> None:
        if NGINX is None:
            raise RuntimeError("nginx is not installed (Debian package nginx-light: `make system-deps`)")
        for _ in range(PORT_ATTEMPTS if self.rebuild else 1):
            await self._start_once()
            await wait_for(self._listening_or_gone, 30, "nginx to listen")
            if self.process is not None and self.process.returncode is None:
                break
            if self.rebuild:
                self.port = free_port()
                self.server = self.rebuild(self.port)
        if self.process is None or self.process.returncode is not None:
            raise RuntimeError(f"nginx did not start: {self.last_words()}")
        await wait_healthy(self.url + "healthz", ca_file, self.process, self.last_words, timeout=60)

    def _listening_or_gone(self) -> bool:
        assert self.process is not None
        return self.process.returncode is not None or self.port in listening_ports(self.process.pid)

    async def _start_once(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "nginx.conf"
        config.write_text(
            MAIN.format(root=self.root, workers=self.workers, connections=self.connections, http=self.server)
        )
        log = open(self.root / "stderr.log", "ab")  # noqa: ASYNC230, SIM115 - handed to the child process
        self.process = await asyncio.create_subprocess_exec(
            NGINX, "-p", str(self.root), "-c", str(config), "-e", str(self.root / "error.log"), stdout=log, stderr=log
        )
        log.close()

    def last_words(self) -> str:
        return "".join(
            path.read_text(errors="replace")[-2000:]
            for path in (self.root / "stderr.log", self.root / "error.log")
            if path.exists()
        )

    async def stop(self) -> None:
        await terminate(self.process, 10)
        self.process = None


class BehindNginx:
    """A proxy process (plain HTTP, trusting only nginx's address) behind the shipped nginx.conf."""

    def __init__(self, proxy: ProxyProcess, nginx: Nginx, ca_file: Path) -> None:
        self.proxy, self.nginx = proxy, nginx
        self.tls = ssl.create_default_context(cafile=str(ca_file))

    async def get(self, url: str, **headers: str) -> tuple[int, str]:
        """GET `url` (through nginx, or straight to the proxy) with `headers`: its status and text."""
        async with aiohttp.ClientSession() as session, session.get(url, headers=headers, ssl=self.tls) as response:
            return response.status, await response.text()

    def remotes(self, path: str) -> list[str]:
        """The client addresses the proxy logged for `path`."""
        return [record["remote"] for record in self.proxy.events("request") if record["path"] == path]
