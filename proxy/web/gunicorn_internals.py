"""The one module that relies on gunicorn's internals (the version is pinned in constraints.txt).

Everything else of `serve --workers N` (proxy.web.workers) uses gunicorn's public interfaces: a
`BaseApplication` configured through `cfg.set`, its server hooks (`pre_fork`, `when_ready`,
`child_exit`, `on_exit`) and a worker class derived from `gunicorn.workers.base.Worker`. Two things
have no public interface:

- SIGHUP. gunicorn's arbiter answers it by reloading: new workers are started and the old ones stopped,
  and with them the downloads they run; no setting or hook changes that. The arbiter dispatches every
  signal it queued to its method `handle_<name>` (`Arbiter.SIG_NAMES`), so `ForwardingArbiter` overrides
  `handle_hup` and passes the signal on to the workers it knows (`Arbiter.WORKERS`: pid -> worker), each
  of which reads its tokens file again (proxy.web.app).
- A worker's listening sockets are gunicorn's socket wrappers; uvloop's `create_server` takes only a
  real socket, the wrapper's `sock`.

When a gunicorn release changes either, tests/unit/test_library_internals.py fails and says what changed.
"""

from __future__ import annotations

import os
import signal
import socket
from contextlib import suppress

import structlog
from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

log = structlog.get_logger("proxy.workers")


class ForwardingArbiter(Arbiter):
    """gunicorn's arbiter, except that SIGHUP is passed on to the workers instead of replacing them."""

    def handle_hup(self) -> None:
        workers = list(self.WORKERS)
        log.info("supervisor.reload", effect="SIGHUP passed on to the workers", workers=len(workers))
        for pid in workers:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)


def run_arbiter(application: BaseApplication) -> None:
    """What `BaseApplication.run` does, with the ForwardingArbiter."""
    ForwardingArbiter(application).run()


def listening_socket(listener: object) -> socket.socket:
    """The socket of one of a worker's listeners (`Worker.sockets`)."""
    sock = listener.sock  # type: ignore[attr-defined]
    assert isinstance(sock, socket.socket)
    return sock
