"""The listening socket, bound at start before anything else is set up (or imported: binding takes no time,
the web stack's imports do), so a port in use or an address this host does not have is refused at once, in
one line (exit 2), instead of gunicorn's retries. The server (`proxy.web.server.run_server`) and the workers'
supervisor (`proxy.web.workers`, as gunicorn's `fd://N`) serve on it."""

from __future__ import annotations

import errno
import socket

from proxy.settings.values import ConfigError

BACKLOG = 511  # nginx's listen backlog

_BIND_FAILURES = {
    errno.EADDRINUSE: "address already in use: another process listens there (stop it, or choose another port)",
    errno.EADDRNOTAVAIL: "this host has no such address (listen on one of its addresses, or on 0.0.0.0 for all)",
    errno.EACCES: "permission denied: a port below 1024 needs privileges (choose a port above 1023)",
}


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket for --listen HOST:PORT, bound at once: a port in use, an address this host does not
    have or a name that does not resolve is a ConfigError naming it (no retries). As gunicorn binds: IPv6 for an
    IPv6 address (on Linux also accepting IPv4 on `::`), else IPv4; SO_REUSEADDR, so a restart does not wait for
    the previous process's connections in TIME_WAIT."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror):
            reason = f"cannot resolve {host!r} ({exc.strerror})"
        else:
            reason = _BIND_FAILURES.get(exc.errno or 0) or exc.strerror or str(exc)
        raise ConfigError(f"--listen {shown}: {reason}") from None
    return sock
