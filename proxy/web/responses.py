"""JSON answers with the exact media type the clients require (`application/json`), and errors as JSON.

Metadata answers (`proxy.web.renderings`) carry a strong ETag and are answered `304 Not Modified`
when `If-None-Match` names it (weak comparison, RFC 9110 §13.1.2).
See docs/protocol.md#content-types-and-status-codes.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.errors import ProxyError
from proxy.protocol.http_ranges import evaluate
from proxy.web.renderings import Rendering, encode_json

JSON = "application/json"


def json_response(
    document: Any, status: int = 200, headers: dict[str, str] | None = None, reason: str | None = None
) -> web.Response:
    response = web.Response(body=encode_json(document), status=status, headers=headers, reason=reason)
    response.headers["Content-Type"] = JSON
    return response


def rendered_response(
    request: web.Request, rendered: Rendering, headers: dict[str, str] | None = None, content_type: str = JSON
) -> web.Response:
    """The rendered answer with its ETag, or 304 when the client's `If-None-Match` names it."""
    fields = {"ETag": rendered.etag, **headers} if headers else {"ETag": rendered.etag}
    if not_modified(request, rendered):
        return web.Response(status=304, headers=fields)
    fields["Content-Type"] = content_type
    return web.Response(body=rendered.body, headers=fields)


def not_modified(request: web.BaseRequest, rendered: Rendering) -> bool:
    """Whether the answer to `request` is `304 Not Modified`: its `If-None-Match` names the rendering's ETag."""
    if "If-None-Match" not in request.headers:
        return False
    if_none_match = ", ".join(request.headers.getall("If-None-Match"))
    return evaluate(rendered.etag, 0, if_none_match=if_none_match).status == 304


def error_response(error: ProxyError) -> web.Response:
    """An error of the hierarchy as the clients read it: `{"errors": [message], "code": ...}`, its status and
    its headers."""
    return json_response(error.document(), status=error.status, headers=error.headers, reason=error.reason_phrase)
