"""The ceiling: a bare aiohttp app answering fixed bytes over TLS, in its own process (or processes).

It answers every path it was given (`www`: URL path -> bytes, read once at start) from memory
with no work of its own, on asyncio's event loop or uvloop's, so a row of it shows what aiohttp
can reach on this machine at all. With `--workers N` it is N processes accepting on one listening
socket (bound before the fork), as the proxy's `serve --workers N` is. Run as a script it is the server:

    python bench/bare.py --port P --cert CERT --key KEY --www DIR --loop asyncio|uvloop [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: tests.fakes

from bench.static import StaticServer  # noqa: E402
from tests.fakes.process import wait_healthy  # noqa: E402

LOOPS = ("asyncio", "uvloop") if importlib.util.find_spec("uvloop") else ("asyncio",)


class BareAiohttp(StaticServer):
    """One bare aiohttp server process answering the files under `root/www` from memory."""

    def __init__(
        self, root: Path, cert: Path, key: Path, loop: str, workers: int = 1, wrapper: tuple[str, ...] = ()
    ) -> None:
        super().__init__(root, cert, key)
        self.loop = loop
        self.workers = workers
        self.wrapper = wrapper  # a script (and its arguments) that runs this one: `python WRAPPER... bare.py ...`

    async def start(self, ca_file: Path) -> None:
        self.put("/healthz", b"ok\n")
        log_path = self.root / "stderr.log"
        log = open(log_path, "ab")  # noqa: ASYNC230, SIM115 - handed to the child process
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            *self.wrapper,
            __file__,
            "--port",
            str(self.port),
            "--cert",
            str(self._cert),
            "--key",
            str(self._key),
            "--www",
            str(self.www),
            "--loop",
            self.loop,
            "--workers",
            str(self.workers),
            stdout=log,
            stderr=log,
        )
        log.close()
        await wait_healthy(
            self.url + "/healthz", ca_file, self.process, lambda: log_path.read_text()[-2000:], timeout=10
        )


def _app(www: Path) -> web.Application:
    bodies = {"/" + path.relative_to(www).as_posix(): path.read_bytes() for path in www.rglob("*") if path.is_file()}

    async def answer(request: web.Request) -> web.Response:
        body = bodies.get(request.path)
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    return app


def _serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--www", type=Path, required=True)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--workers", type=int, default=1, help="processes accepting on one socket")
    args = parser.parse_args(argv)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.cert, args.key)
    sock = socket.create_server(("127.0.0.1", args.port), backlog=2048)
    if args.workers > 1:
        _supervise(args.workers, lambda: _run(args, context, sock))
    else:
        _run(args, context, sock)


def _run(args: argparse.Namespace, context: ssl.SSLContext, sock: socket.socket) -> None:
    if args.loop == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    web.run_app(_app(args.www), sock=sock, ssl_context=context, access_log=None, print=None, loop=loop)


def _supervise(workers: int, run) -> None:
    """Fork `workers` processes that each `run()`; stop them all on SIGTERM/SIGINT (or when one ends)."""
    children = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            try:
                run()
            finally:
                os._exit(0)
        children.append(pid)

    def stop(*_) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    os.wait()  # the first to end (a signal, or a worker that died) stops the others
    stop()
    for _ in children[1:]:
        with contextlib.suppress(ChildProcessError):
            os.wait()


if __name__ == "__main__":
    _serve(sys.argv[1:])
