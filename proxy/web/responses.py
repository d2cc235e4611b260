"""JSON answers with the exact media type the clients require (`application/json`).

See docs/protocol.md#content-types-and-status-codes.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web


def json_response(document: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()
    response = web.Response(body=body, status=status, headers=headers)
    response.headers["Content-Type"] = "application/json"
    return response


def error_response(status: int, *messages: str) -> web.Response:
    return json_response({"errors": list(messages)}, status=status)
