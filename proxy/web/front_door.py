"""The server's request handler: a warm network-mirror document answered at the front, everything else by the
application as before.

aiohttp hands every request to the application's handler: routing, then the middlewares (aiohttp's own,
`request_context` and `access_control`), then the route's handler. A warm `index.json` or `:version.json` that
this process answered a moment ago (`proxy.web.warm_answers`) needs none of that: `FrontDoor` recognises its path,
lets it in as `access_control` would (`proxy.web.access.quietly_admitted`), finds the kept answer as
`json_document` would (`proxy.web.network_mirror.warm_document`) and sends it with what the middlewares give every
answer: `Cache-Control` and `Vary`, `X-Request-Id`, `Server`, the metrics and the access-log line. An ETag the
client names is answered 304, and HEAD as aiohttp answers it. The answer is written as aiohttp would write the
application's, header by header in the same order (`whole_answer`), as one block of bytes: no response object is
made for it (`proxy.web.aiohttp_internals.send_whole`).

Anything else goes to the application unchanged, which answers it as before: another path or method, a
percent-encoded path or a query, another HTTP version, an `Expect` header, a purge check due, a token that is not
a valid static one (OIDC, unknown), a request access control would refuse (the application refuses it, and logs
it), no answer kept.
Up to that point the front door has logged and counted nothing, and what it noted (its token's client) the
application notes again. A warm answer begins no request state (`proxy.runtime.request_state`): nothing it runs logs,
waits or notes; the cache hit it stands for is counted and logged with the request (`record_request`).

The server puts it in front of the application's handler once the application has started (`open`, called by
`proxy.web.aiohttp_internals.put_in_front` for the application's `FRONT`); an application served without it answers
the same, through the middlewares. What a new middleware or `on_response_prepare` handler adds to every answer must be
added here too: tests/integration/test_front_door.py compares the two answers header by header, and the bytes of
their heads.
"""

from __future__ import annotations

import time
from email.utils import formatdate

from aiohttp import web
from aiohttp.hdrs import AUTHORIZATION, EXPECT, IF_NONE_MATCH

from proxy.protocol.cache_control import cache_control as cache_control_of
from proxy.runtime.log import new_request_id
from proxy.web.access import ACCESS, CLIENT, quietly_admitted
from proxy.web.aiohttp_internals import Handler, send_whole
from proxy.web.app_keys import GATEKEEPER, MEMORY_FRONT, SETTINGS
from proxy.web.cache_headers import shown_client, stale_windows
from proxy.web.middlewares import (
    SERVER,
    SUPPORTED_VERSIONS,
    as_the_client_made_it,
    record_request,
    request_arrived,
)
from proxy.web.network_mirror import MIRROR_ROUTE, reuse_of, warm_document
from proxy.web.renderings import Rendering
from proxy.web.responses import JSON, not_modified

PREFIX = "/mirror/v1/"  # a network-mirror document: /mirror/v1/HOST/NAMESPACE/TYPE/DOCUMENT
METHODS = frozenset({"GET", "HEAD"})
# The `Connection` field aiohttp writes, by (HTTP/1.x minor version, keep-alive): only where it is not the default.
CONNECTION = {(0, True): "Connection: keep-alive\r\n", (1, False): "Connection: close\r\n"}


class FrontDoor:
    """Warm network-mirror documents answered before routing and the middlewares; everything else handed on."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._inner: Handler | None = None
        self.answered = 0  # requests answered here: for tests and profiling

    def open(self, inner: Handler) -> Handler:
        """The request handler to give the server in place of `inner` (the application's own), once the application
        has started (its resources are open)."""
        self._inner = inner
        app = self._app
        self._settings = app[SETTINGS]
        self._access = app.get(ACCESS)
        self._front = app.get(MEMORY_FRONT)
        self._gatekeeper = app.get(GATEKEEPER)
        self._windows = stale_windows(self._settings)
        return self.handle

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.raw_path.startswith(PREFIX):
            answer = self.answer(request)  # type: ignore[arg-type]  # the application's requests are `web.Request`s
            if answer is not None:
                return await send_whole(request, *answer)
        assert self._inner is not None, "open() first"
        return await self._inner(request)

    def answer(self, request: web.Request) -> tuple[bytes, bool] | None:
        """The kept answer to `request` as the application would send it, whole, and whether the connection stays
        open after it; or None (the application answers)."""
        started = time.perf_counter()
        path, method, version = request.path, request.method, request.version
        if path != request.raw_path or method not in METHODS or version not in SUPPORTED_VERSIONS:
            return None
        headers = request.headers
        if EXPECT in headers:  # aiohttp's routing answers it (100 Continue, or 417)
            return None
        parts = path.split("/")  # "", "mirror", "v1", HOST, NAMESPACE, TYPE, DOCUMENT
        if len(parts) != 7 or not parts[6].endswith(".json"):
            return None
        front = self._front
        if front is not None and front.purge_check_due():
            return None
        app, settings, access = self._app, self._settings, self._access
        request_arrived(request)
        request = as_the_client_made_it(request, settings)
        client = None
        if access is not None and access.active:
            admitted = quietly_admitted(access, headers.get(AUTHORIZATION), parts[3], parts[4])
            if admitted is False:
                return None
            if admitted is not True:
                client = request[CLIENT] = admitted
        keeper = self._gatekeeper
        gate = keeper if keeper is not None and keeper.active else None  # as `app_gatekeeper(app)`
        kept = warm_document(app, reuse_of(app, request, parts[6], client, gate))
        if kept is None:
            return None
        rendered, fresh_for = kept
        request_id = new_request_id(headers.get("X-Request-Id"))
        status = 304 if IF_NONE_MATCH in headers and not_modified(request, rendered) else 200
        # `add_cache_headers`'s Cache-Control for a request without a query (the front door takes none)
        cache_control = cache_control_of(status, fresh_for, shown_client(headers, client, gate), self._windows)
        keep_alive = request.keep_alive
        whole = whole_answer(version.minor, status, rendered, cache_control, request_id, keep_alive, method == "HEAD")
        sent = len(rendered.body) if status == 200 else 0
        record_request(
            request, app, settings, MIRROR_ROUTE, client, request_id, "request", status, sent, started, cache="hit"
        )
        self.answered += 1
        return whole, keep_alive


def whole_answer(
    minor: int, status: int, rendered: Rendering, cache_control: str, request_id: str, keep_alive: bool, head: bool
) -> bytes:
    """A metadata answer (200 with `rendered`, or 304) to an HTTP/1.`minor` request, as aiohttp writes the
    application's (`proxy.web.responses.rendered_response` with the middlewares' header fields): the same fields in
    the same order; `head`: a HEAD request's, without its body. No value is checked for line breaks as aiohttp checks
    them: all are the proxy's own, the client's `request_id` as `new_request_id` lets it through (printable).
    All but the request id and the date is made once per kind of answer (`_answer_parts`)."""
    kind = (rendered.etag, status, cache_control, minor, keep_alive, head)  # the ETag stands for the body
    parts = _parts.get(kind)
    if parts is None:
        parts = _answer_parts(rendered, *kind[1:])
        if len(_parts) >= ANSWER_KINDS:
            _parts.clear()
        _parts[kind] = parts
    before_id, before_date, after_date = parts
    return b"".join((before_id, request_id.encode(), before_date, http_date(), after_date))


ANSWER_KINDS = 1024  # the answers' parts kept at most (the max-age in `Cache-Control` makes a kind a second)
_parts: dict[tuple, tuple[bytes, bytes, bytes]] = {}


def _answer_parts(
    rendered: Rendering, status: int, cache_control: str, minor: int, keep_alive: bool, head: bool
) -> tuple[bytes, bytes, bytes]:
    """`whole_answer`'s bytes before the request id, between it and the date, and after the date."""
    connection = CONNECTION.get((minor, keep_alive), "")
    if status == 304:
        before_id = f"HTTP/1.{minor} 304 Not Modified\r\nETag: {rendered.etag}\r\nCache-Control: {cache_control}\r\n"
        return (
            f"{before_id}Vary: Authorization\r\nX-Request-Id: ".encode(),
            f"\r\nServer: {SERVER}\r\nDate: ".encode(),
            f"\r\n{connection}\r\n".encode(),
        )
    body = rendered.body
    return (
        f"HTTP/1.{minor} 200 OK\r\nETag: {rendered.etag}\r\nContent-Type: {JSON}\r\nCache-Control: {cache_control}"
        "\r\nVary: Authorization\r\nX-Request-Id: ".encode(),
        f"\r\nServer: {SERVER}\r\nContent-Length: {len(body)}\r\nDate: ".encode(),
        f"\r\n{connection}\r\n".encode() + (b"" if head else body),
    )


_date = (-1, b"")  # the last second an HTTP date was written for, and its date


def http_date() -> bytes:
    """The `Date` of an answer now (IMF-fixdate, RFC 9110 §5.6.7), made once per second."""
    global _date
    second = int(time.time())
    if second != _date[0]:
        _date = (second, formatdate(second, usegmt=True).encode())
    return _date[1]
