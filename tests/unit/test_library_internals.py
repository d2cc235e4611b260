"""What proxy/web/aiohttp_internals.py, proxy/runtime/client_reads.py, proxy/web/gunicorn_internals.py and
`UpstreamClient.open_spares` (proxy/upstream/client.py) rely on still holds in the installed aiohttp, aiobotocore and
gunicorn (pinned in constraints.txt). A failure here names what a new release changed: review that module before
upgrading."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import signal
import socket
import ssl
from importlib.metadata import version
from pathlib import Path

import aiohttp
import pytest
from aiobotocore.httpsession import AIOHTTPSession
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from gunicorn.arbiter import Arbiter
from gunicorn.config import Config
from gunicorn.sock import TCPSocket
from structlog.testing import capture_logs
from yarl import URL

from proxy.runtime import client_reads
from proxy.runtime.client_reads import SharedBufferReads, read_into_shared_buffer
from proxy.settings.config import Limits
from proxy.storage.s3 import SharedBufferSession
from proxy.upstream.client import UpstreamClient, create_ssl_context
from proxy.upstream.netguard import AddressPolicy
from proxy.web import aiohttp_internals, gunicorn_internals
from proxy.web.aiohttp_internals import describe_parse_error, new_request_handler
from proxy.web.eventloop import new_event_loop

AIOHTTP = f"aiohttp {version('aiohttp')} changed what proxy/web/aiohttp_internals.py relies on"
GUNICORN = f"gunicorn {version('gunicorn')} changed what proxy/web/gunicorn_internals.py relies on"
CLIENT = f"aiohttp {version('aiohttp')} changed what proxy/runtime/client_reads.py relies on"
SPARES = f"aiohttp {version('aiohttp')} changed what proxy/upstream/client.py's UpstreamClient.open_spares relies on"
BOTOCORE = f"aiobotocore {version('aiobotocore')} changed what proxy/storage/s3.py's SharedBufferSession relies on"
MAX_LINE, MAX_FIELD, MAX_HEADERS = 200, 100, 8
REPO = Path(__file__).resolve().parents[2]


def _pinned(name: str) -> str:
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1]
    raise AssertionError(f"{name} is not pinned in constraints.txt")


@pytest.mark.parametrize("name", ["aiohttp", "aiobotocore", "gunicorn"])
def test_the_libraries_whose_internals_are_used_are_pinned(name):
    assert _pinned(name)  # the modules were reviewed against the pinned versions


def test_aiohttps_protocol_takes_the_options_and_calls_handle_error_as_before():
    options = inspect.signature(RequestHandler.__init__).parameters
    for name in ("manager", "loop", "keepalive_timeout", "max_line_size", "max_field_size", "max_headers"):
        assert name in options, f"{AIOHTTP}: RequestHandler() has no parameter {name!r}"
    assert list(inspect.signature(RequestHandler.handle_error).parameters) == [
        "self",
        "request",
        "status",
        "exc",
        "message",
    ], f"{AIOHTTP}: RequestHandler.handle_error's parameters"


class LowLevelServer:
    """aiohttp's low-level server (or `server`, an AppRunner's) with the proxy's protocol; records what `reject` was
    given."""

    def __init__(self, server: web.Server | None = None) -> None:
        self.rejected: list[tuple[int, BaseException | None]] = []
        self.server = server

    def reject(self, request: web.BaseRequest, status: int, exc: BaseException | None) -> web.StreamResponse:
        self.rejected.append((status, exc))
        described = describe_parse_error(exc, max_line=MAX_LINE, max_field=MAX_FIELD, max_headers=MAX_HEADERS)
        status, text = described or (status, "internal error")
        response = web.json_response({"errors": [text]}, status=status)
        response.force_close()
        return response

    async def __aenter__(self) -> LowLevelServer:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            return web.Response(text="application")

        server = self.server or web.Server(handle)
        self.listener = await asyncio.get_running_loop().create_server(
            lambda: new_request_handler(
                server,
                self.reject,
                keepalive_timeout=5,
                max_line_size=MAX_LINE,
                max_field_size=MAX_FIELD,
                max_headers=MAX_HEADERS,
            ),
            "127.0.0.1",
            0,
        )
        self.port = self.listener.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info) -> None:
        self.listener.close()
        await self.listener.wait_closed()

    async def exchange(self, data: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(data)
            answer = await asyncio.wait_for(reader.read(), 5)  # every answer here closes the connection
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        return int(head.split()[1]), body


HEADERS = "".join(f"X-{i}: {i}\r\n" for i in range(MAX_HEADERS + 1))


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        (f"GET /{'a' * MAX_LINE} HTTP/1.1\r\n\r\n", 414, "request line too long"),
        (f"GET / HTTP/1.1\r\nX-Long: {'b' * MAX_FIELD}\r\n\r\n", 431, f"at most {MAX_FIELD} bytes each"),
        (f"GET / HTTP/1.1\r\n{HEADERS}\r\n", 431, f"at most {MAX_HEADERS} fields"),
        ("G(T / HTTP/1.1\r\n\r\n", 400, "invalid method"),
        ("GET / HTTP/9\r\n\r\n", 400, "malformed request"),
    ],
    ids=["request line", "header field", "header count", "method", "version"],
)
async def test_aiohttp_hands_its_parse_errors_to_handle_error(data, status, message):
    async with LowLevelServer() as server:
        answered, body = await server.exchange(data.encode())
    assert len(server.rejected) == 1, f"{AIOHTTP}: a request it could not parse never reached handle_error"
    assert answered == status, f"{AIOHTTP}: {server.rejected[0][1]!r} is no longer told apart ({body!r})"
    assert message in json.loads(body)["errors"][0]


async def test_a_request_aiohttp_parsed_reaches_the_application_and_not_handle_error():
    async with LowLevelServer() as server:
        answered, body = await server.exchange(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert (answered, body, server.rejected) == (200, b"application", [])


async def test_a_handler_put_in_front_of_an_app_runners_server_gets_every_request():
    seen: list[str] = []

    class Front:
        def open(self, inner: aiohttp_internals.Handler) -> aiohttp_internals.Handler:
            async def handle(request: web.BaseRequest) -> web.StreamResponse:
                seen.append(request.path)
                return web.Response(text="front") if request.path == "/front" else await inner(request)

            return handle

    async def application(request: web.Request) -> web.Response:
        return web.Response(text="application")

    app = web.Application()
    app.router.add_get("/{tail:.*}", application)
    app[aiohttp_internals.FRONT] = Front()
    runner = web.AppRunner(app)
    await runner.setup()
    aiohttp_internals.put_in_front(runner)
    assert runner.server is not None
    try:
        async with LowLevelServer(runner.server) as server:
            answers = [
                await server.exchange(f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode())
                for path in ("/front", "/app")
            ]
    finally:
        await runner.cleanup()
    assert answers == [(200, b"front"), (200, b"application")], f"{AIOHTTP}: web.Server.request_handler"
    assert seen == ["/front", "/app"]


async def test_an_answer_sent_whole_through_the_requests_writer_keeps_the_connection_as_told():
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        keep_alive = request.keep_alive
        close = b"" if keep_alive else b"Connection: close\r\n"
        whole = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(request.path), close, request.path.encode())
        return await aiohttp_internals.send_whole(request, whole, keep_alive)

    pipelined = b"".join(
        f"GET /{name} HTTP/1.1\r\nHost: a\r\n{fields}\r\n".encode()
        for name, fields in [("one", ""), ("two", ""), ("three", "Connection: close\r\n")]
    )
    async with LowLevelServer(web.Server(handle)) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(pipelined)
            answer = await asyncio.wait_for(reader.read(), 3)  # closed after the third (idle ones: after 5 s)
        finally:
            writer.close()
    assert answer == (
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n/one"
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n/two"
        b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\n/three"
    ), f"{AIOHTTP}: a response the handler sent itself (prepare, write_eof, keep_alive)"
    assert server.rejected == []


def test_gunicorns_arbiter_dispatches_sighup_to_handle_hup_and_knows_its_workers():
    assert Arbiter.SIG_NAMES.get(signal.SIGHUP) == "hup", f"{GUNICORN}: SIGHUP's name"
    assert signal.SIGHUP in Arbiter.SIGNALS, f"{GUNICORN}: the arbiter no longer queues SIGHUP"
    assert '"handle_%s"' in inspect.getsource(Arbiter.run), f"{GUNICORN}: signals are no longer dispatched by name"
    assert callable(getattr(Arbiter, "handle_hup", None)), f"{GUNICORN}: Arbiter.handle_hup"
    assert isinstance(Arbiter.WORKERS, dict), f"{GUNICORN}: Arbiter.WORKERS (pid -> worker)"
    assert gunicorn_internals.ForwardingArbiter.handle_hup is not Arbiter.handle_hup


def test_gunicorns_listener_wraps_a_real_socket():
    class Quiet:
        def info(self, *args, **kwargs) -> None:
            pass

        debug = warning = error = info

    listener = TCPSocket(("127.0.0.1", 0), Config(), Quiet())
    try:
        sock = gunicorn_internals.listening_socket(listener)
        assert isinstance(sock, socket.socket), f"{GUNICORN}: a worker's listener has no `sock`"
        assert sock.fileno() == listener.fileno()
    finally:
        listener.close()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_client_connections_read_every_byte_through_the_shared_buffer(loop, server_cert_files, ca_file):
    """A body of several MiB over TLS, on a new connection and on one reused from the pool, reaches aiohttp
    whole through `SharedBufferReads` (aiohttp built the connection's protocol with the connector's `_factory`,
    and the loop's SSL transport took the buffered protocol swapped in)."""
    body = os.urandom(3 << 20)

    async def exchange() -> list[tuple[object, bytes]]:
        async def answer(request: web.Request) -> web.Response:
            return web.Response(body=body)

        app = web.Application()
        app.router.add_get("/", answer)
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(*map(str, server_cert_files))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl)
        await site.start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}/"
        connector = read_into_shared_buffer(aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(ca_file))))
        answers = []
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                for _ in range(2):
                    async with session.get(url) as response:
                        protocol = response.connection.transport.get_protocol()
                        answers.append((protocol, await response.read()))
        finally:
            await runner.cleanup()
        return answers

    with asyncio.Runner(loop_factory=lambda: new_event_loop(loop)) as runner:
        answers = runner.run(exchange())
    for protocol, received in answers:
        assert isinstance(protocol, SharedBufferReads), f"{CLIENT}: {type(protocol).__name__} reads the connection"
        assert received == body


def test_a_connection_is_asked_of_the_connector_with_a_request_built_by_hand():
    connect = list(inspect.signature(aiohttp.BaseConnector.connect).parameters)
    assert connect == ["self", "req", "traces", "timeout"], f"{SPARES}: BaseConnector.connect's parameters"
    request = inspect.signature(aiohttp.ClientRequest.__init__).parameters
    assert "loop" in request and request["loop"].kind is inspect.Parameter.KEYWORD_ONLY, f"{SPARES}: ClientRequest"
    assert callable(getattr(aiohttp.connector.Connection, "release", None)), f"{SPARES}: Connection.release"


async def test_spare_connections_serve_the_requests_that_follow_together(upstream_ssl, ca_file):
    """The spares (a connection asked of the session's connector for a request never sent, released into the
    pool) are taken by the next requests to the host, one each, and the server never sees a request of theirs."""
    requests: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        requests.append(request.method)
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=upstream_ssl)
    await site.start()
    url = URL(f"https://127.0.0.1:{runner.addresses[0][1]}/")
    upstream = UpstreamClient.create(AddressPolicy(frozenset({"127.0.0.1"})), Limits(), create_ssl_context(ca_file))
    try:
        with capture_logs() as spares:
            await upstream.open_spares(url, 2)
        with capture_logs() as gets:
            await asyncio.gather(*(upstream.get(url, max_bytes=100) for _ in range(2)))
    finally:
        await upstream.close()
        await runner.cleanup()
    assert [entry["event"] for entry in spares] == ["upstream.spare_opened"] * 2, f"{SPARES}: {spares}"
    events = [entry["event"] for entry in gets]
    assert events.count("upstream.connection_reused") == 2 and "upstream.connected" not in events, f"{SPARES}"
    assert requests == ["GET", "GET"]


def test_aiobotocores_session_builds_its_connector_in_create_connector():
    assert issubclass(SharedBufferSession, AIOHTTPSession), f"{BOTOCORE}: its HTTP session class"
    create = inspect.getattr_static(AIOHTTPSession, "_create_connector", None)
    assert inspect.iscoroutinefunction(create), f"{BOTOCORE}: AIOHTTPSession has no coroutine _create_connector"
    assert list(inspect.signature(create).parameters) == ["self", "proxy_url"], f"{BOTOCORE}: its parameters"


PRIVATE = frozenset(
    {"aiohttp.web_protocol", "aiohttp.http_exceptions", "aiohttp.client_proto", "gunicorn.arbiter", "gunicorn.sock"}
)


def imported_modules(source: str) -> set[str]:
    """Every module `source` imports, in any form (`import a.b`, `from a.b import c`, `from a import b`: a.b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_only_the_internals_modules_import_those_internals():
    allowed = {Path(m.__file__).resolve() for m in (aiohttp_internals, client_reads, gunicorn_internals)}
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / "proxy").rglob("*.py"))
        if path.resolve() not in allowed
        for name in sorted(imported_modules(path.read_text()) & PRIVATE)
    ]
    assert offenders == []


def test_the_import_check_sees_every_form_of_import():
    source = "import gunicorn.arbiter\nfrom aiohttp import http_exceptions, web\nfrom aiohttp.web_protocol import X\n"
    assert imported_modules(source) & PRIVATE == {"gunicorn.arbiter", "aiohttp.http_exceptions", "aiohttp.web_protocol"}
    assert imported_modules((REPO / "proxy/web/aiohttp_internals.py").read_text()) & PRIVATE  # what it relies on
