"""The ceiling: a bare aiohttp app answering fixed bytes over TLS, in its own process (or processes).

It answers every path it was given (`www`: URL path -> bytes, read once at start) from memory
with no work of its own, on asyncio's event loop or uvloop's, so a row of it shows what aiohttp
can reach on this machine at all. With `--workers N` it is N processes accepting on one listening
socket (bound before the fork), as the proxy's `serve --workers N` is.

With `--archive URL_PATH` it is the ceiling of a warm archive serve instead: a GET of URL_PATH
streams the file `www/URL_PATH` (not held in memory) in chunks of `--chunk` bytes, each read with
`os.preadv` into one reused buffer, hashed with BLAKE3 (unless `--no-hash`) and written, with the
proxy's write-buffer limit; the same libraries as the proxy's archive serve, none of its code
path. Run as a script it is the server:

    python bench/bare.py --port P --cert CERT --key KEY --www DIR --loop asyncio|uvloop [--workers N]
        [--archive URL_PATH --chunk BYTES --write-buffer-high BYTES [--no-hash]]
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from blake3 import blake3

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: tests.fakes

from bench.static import StaticServer  # noqa: E402
from proxy.storage.read_buffer import ReadBuffer  # noqa: E402
from tests.fakes.process import wait_healthy  # noqa: E402

LOOPS = ("asyncio", "uvloop") if importlib.util.find_spec("uvloop") else ("asyncio",)


@dataclass(frozen=True)
class ArchiveServe:
    """`--archive`: the URL path of the one file streamed from disk, and how."""

    path: str
    chunk: int
    write_buffer_high: int
    hashed: bool = True

    def flags(self) -> list[str]:
        sizes = ["--chunk", str(self.chunk), "--write-buffer-high", str(self.write_buffer_high)]
        return ["--archive", self.path, *sizes, *([] if self.hashed else ["--no-hash"])]


class BareAiohttp(StaticServer):
    """One bare aiohttp server process answering the files under `root/www` from memory (but `archive`'s, from
    its file)."""

    def __init__(
        self,
        root: Path,
        cert: Path,
        key: Path,
        loop: str,
        workers: int = 1,
        wrapper: tuple[str, ...] = (),
        archive: ArchiveServe | None = None,
    ) -> None:
        super().__init__(root, cert, key)
        self.loop = loop
        self.workers = workers
        self.wrapper = wrapper  # a script (and its arguments) that runs this one: `python WRAPPER... bare.py ...`
        self.archive = archive

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
            *(self.archive.flags() if self.archive else ()),
            stdout=log,
            stderr=log,
        )
        log.close()
        await wait_healthy(
            self.url + "/healthz", ca_file, self.process, lambda: log_path.read_text()[-2000:], timeout=10
        )


def _app(www: Path, archive: ArchiveServe | None) -> web.Application:
    bodies = {"/" + path.relative_to(www).as_posix(): path for path in www.rglob("*") if path.is_file()}
    streamed = bodies.pop(archive.path, None) if archive else None
    bodies = {url: path.read_bytes() for url, path in bodies.items()}

    async def answer(request: web.Request) -> web.Response:
        body = bodies.get(request.path)
        if body is None:
            return web.Response(status=404)
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    if archive is not None and streamed is not None:
        app.router.add_get(archive.path, _streamer(streamed, archive))
    app.router.add_get("/{tail:.*}", answer)
    return app


def _streamer(file: Path, archive: ArchiveServe) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler streaming `file`: read into one reused buffer (a new one only while a view of it is alive),
    hashed, written; one `write` per chunk, which waits while the transport is above its high-water mark."""

    async def stream(request: web.Request) -> web.StreamResponse:
        if request.transport is not None:
            request.transport.set_write_buffer_limits(high=archive.write_buffer_high)
        buffers, check = ReadBuffer(archive.chunk), blake3() if archive.hashed else None
        fd = os.open(file, os.O_RDONLY)
        try:
            size, offset = os.fstat(fd).st_size, 0
            response = web.StreamResponse(headers={"Content-Type": "application/zip"})
            response.content_length = size
            await response.prepare(request)
            while offset < size:
                view = memoryview(buffers.take())
                count = os.preadv(fd, [view], offset)
                if not count:
                    break
                offset += count
                chunk = view[:count]
                if check is not None:
                    check.update(chunk)
                await response.write(chunk)
                del view, chunk  # so that the next `take` finds the buffer free
        finally:
            os.close(fd)
        await response.write_eof()
        return response

    return stream


def _serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--www", type=Path, required=True)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--workers", type=int, default=1, help="processes accepting on one socket")
    parser.add_argument("--archive", help="URL path of the file under --www streamed from disk, not memory")
    parser.add_argument("--chunk", type=int, help="with --archive: bytes read, hashed and written at a time")
    parser.add_argument("--write-buffer-high", type=int, help="with --archive: the transport's high-water mark")
    parser.add_argument("--no-hash", action="store_true", help="stream the archive without hashing it")
    args = parser.parse_args(argv)
    if args.archive and not (args.chunk and args.write_buffer_high):
        parser.error("--archive needs --chunk and --write-buffer-high")
    args.archive = args.archive and ArchiveServe(
        args.archive, args.chunk, args.write_buffer_high, hashed=not args.no_hash
    )
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
    web.run_app(_app(args.www, args.archive), sock=sock, ssl_context=context, access_log=None, print=None, loop=loop)


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
