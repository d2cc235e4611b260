"""The event loop the server runs on: uvloop when installed (its TLS and sockets are much cheaper
than asyncio's pure-Python SSL protocol), else asyncio's own; `--event-loop` picks one explicitly.

With `--plain-http`, `auto` keeps asyncio's loop: uvloop has no `loop.sendfile`, and over plain
HTTP the kernel's zero-copy `sendfile` of archives is worth more than uvloop's cheaper sockets."""

from __future__ import annotations

import asyncio

from proxy.config import ConfigError


def new_event_loop(choice: str = "auto", *, plain_http: bool = False) -> asyncio.AbstractEventLoop:
    """A new loop: `uvloop` (an error if it is not installed), `asyncio`, or `auto` (uvloop if
    importable, except over plain HTTP, where archives go out with sendfile)."""
    if choice == "uvloop" or (choice == "auto" and not plain_http):
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ConfigError("--event-loop uvloop: uvloop is not installed") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`, for the log."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
