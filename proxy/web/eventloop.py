"""The event loop the server runs on: uvloop when installed (its TLS and sockets are much cheaper
than asyncio's pure-Python SSL protocol), else asyncio's own; `--event-loop` picks one explicitly.

The same over plain HTTP: archives are read and hashed in user space on every serve (no
`sendfile`, docs/integrity.md#archive-stores), so asyncio's `loop.sendfile` is no reason to
keep its loop."""

from __future__ import annotations

import asyncio

from proxy.settings.config import ConfigError


def new_event_loop(choice: str = "auto") -> asyncio.AbstractEventLoop:
    """A new loop: `uvloop` (an error if it is not installed), `asyncio`, or `auto` (uvloop if importable)."""
    if choice in ("uvloop", "auto"):
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
