"""`serve --workers N`: N worker processes behind one listening socket, supervised by gunicorn.

gunicorn's arbiter (the supervisor) takes the listening socket bound at start (`fd://N`, gunicorn's
own way of being handed a socket: it never binds, so never retries a port in use), forks the
workers, restarts a worker that dies, and on SIGTERM (or SIGINT) stops listening and lets every worker drain. Each
worker (`ProxyWorker`) runs the application exactly as the single-process server does
(`proxy.web.server.serve_app`): the same connection limits and timeouts, TLS with the context
the supervisor made (certificates are generated once, before the fork), and the graceful
shutdown of requests in flight (`--shutdown-grace`).

Before forking, the metadata store has been opened once (`proxy.cli`: the metadata secret is made
and the embedded file checked, sealed or moved aside by one process), and the supervisor makes the
directory where the workers' metrics meet (`proxy.runtime.metrics.share_between_processes`). The
workers share the embedded SQLite store (WAL, busy timeout) and fetch each artifact once
between them (`proxy.metadata_store.file_locks.FileLocks`, or Redis locks with --redis-url).

This module uses gunicorn's public interfaces only (an application configured through `cfg.set`, server
hooks, a worker class); SIGHUP passed on to the workers and the workers' sockets need gunicorn's
internals, kept in `proxy.web.gunicorn_internals`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import ssl
from collections.abc import Callable
from contextlib import suppress

import structlog
from aiohttp import web
from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.workers.base import Worker

from proxy.runtime import metrics
from proxy.settings.config import Settings
from proxy.web.allocator import pin_mmap_threshold
from proxy.web.app import create_app
from proxy.web.eventloop import new_event_loop
from proxy.web.gunicorn_internals import listening_socket, run_arbiter
from proxy.web.listener import BACKLOG
from proxy.web.server import ConnectionLimits, run_until_complete, serve_app, start_listener

log = structlog.get_logger("proxy.workers")

HEARTBEAT = 1.0  # seconds between a worker's signs of life to the supervisor
WORKER_TIMEOUT = 30  # a worker silent this long (its event loop blocked) is killed and replaced
UNWIND = 10.0  # beyond --shutdown-grace: cancelled fetches clean up, stores close
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)


def run_workers(
    settings: Settings,
    ssl_context: ssl.SSLContext | None,
    sock: socket.socket,
    *,
    on_listening: Callable[[], None] | None = None,
) -> None:
    """Serve on the listening socket `sock` (`proxy.web.server.bind_listener`) with `settings.server.workers`
    workers until SIGTERM or SIGINT. Exits the process (SystemExit): 0 after a graceful stop, 3 when a worker
    could not start. `on_listening` is called in the supervisor once it listens. The caller has prepared the
    metadata store once (`proxy.cli`), so the workers find the secret made and the embedded file checked."""
    pin_mmap_threshold()  # before the fork: the workers inherit it
    Supervisor(settings, ssl_context, sock.detach(), on_listening).run()


class Supervisor(BaseApplication):
    """gunicorn's arbiter configured from our Settings (no gunicorn command line or config file)."""

    def __init__(
        self,
        settings: Settings,
        ssl_context: ssl.SSLContext | None,
        listening_fd: int,
        on_listening: Callable[[], None] | None = None,
    ) -> None:
        self.settings = settings
        self.ssl_context = ssl_context
        self.listening_fd = listening_fd  # handed to gunicorn, which owns (and closes) it from then on
        self.on_listening = on_listening
        self.metrics_dir = metrics.new_shared_dir(settings.data_dir / "metrics")
        super().__init__()

    def load_config(self) -> None:
        settings = self.settings
        options = {
            "bind": [f"fd://{self.listening_fd}"],  # the socket bound at start: gunicorn binds nothing itself
            "workers": settings.server.workers,
            "worker_class": ProxyWorker,
            "backlog": BACKLOG,
            "timeout": WORKER_TIMEOUT,
            "graceful_timeout": math.ceil(settings.server.shutdown_grace + UNWIND),
            "logger_class": SupervisorLog,
            "proc_name": "registry-proxy",
            "control_socket_disable": True,
            "child_exit": lambda _arbiter, worker: metrics.forget_process(self.metrics_dir, worker.pid),
            "on_exit": lambda _arbiter: metrics.remove_shared_dir(self.metrics_dir),
            "when_ready": lambda _arbiter: self.on_listening and self.on_listening(),
            "pre_fork": StopSignalsBlockedAcrossFork().pre_fork,
        }
        for name, value in options.items():
            self.cfg.set(name, value)

    def run(self) -> None:
        run_arbiter(self)  # gunicorn's arbiter, with SIGHUP passed on to the workers

    def load(self) -> web.Application:
        """In each worker, after the fork: its own application (its stores open when it starts)."""
        metrics.share_between_processes(self.metrics_dir)
        return create_app(self.settings)


class StopSignalsBlockedAcrossFork:
    """Workers are forked with the stop signals blocked: one that arrives before a worker has its own
    handlers stays pending until it has them (else it reaches the arbiter's handler inherited by the child
    and is lost, and the worker serves on until it is killed). Blocked in gunicorn's `pre_fork` hook;
    restored in the supervisor right after the fork (`os.register_at_fork`, which runs after a failed fork
    too); the worker unblocks them once its loop runs (`ProxyWorker.init_signals`)."""

    def __init__(self) -> None:
        self._previous: set[signal.Signals] | None = None
        os.register_at_fork(after_in_parent=self._restore)

    def pre_fork(self, _arbiter: object, _worker: object) -> None:
        self._previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def _restore(self) -> None:
        if self._previous is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)
            self._previous = None


class ProxyWorker(Worker):
    """One worker process: our application and listener on the supervisor's listening sockets."""

    def init_process(self) -> None:
        supervisor: Supervisor = self.app  # type: ignore[assignment]
        self.loop = new_event_loop(supervisor.settings.server.event_loop)
        asyncio.set_event_loop(self.loop)
        self._stopping = asyncio.Event()
        super().init_process()  # signals, the application, then run()

    def init_signals(self) -> None:
        super().init_signals()  # gunicorn's own (SIGABRT on a timeout, SIGUSR1 reopens logs, ...)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the application installs its reload (with tokens)
        for number in STOP_SIGNALS:  # through the loop, so a stop wakes it at once
            self.loop.add_signal_handler(number, self._stop)
        # Blocked by the arbiter for the fork; unblocked once the loop runs (uvloop drops a signal that
        # arrives before it runs), so a stop signal pending since the fork reaches `_stop`.
        self.loop.call_soon(signal.pthread_sigmask, signal.SIG_UNBLOCK, STOP_SIGNALS)

    def _stop(self) -> None:
        self.alive = False
        self._stopping.set()

    def run(self) -> None:
        supervisor: Supervisor = self.app  # type: ignore[assignment]
        settings = supervisor.settings
        limits = ConnectionLimits.from_settings(settings)
        self.booted = False  # until it listens: a failure to start stops the supervisor instead of a restart loop

        async def listen(runner: web.AppRunner) -> list[asyncio.Server]:
            listeners = [
                await start_listener(runner, supervisor.ssl_context, limits, sock=listening_socket(listening))
                for listening in self.sockets
            ]
            self.booted = True
            log.info("worker.started", pid=os.getpid())
            return listeners

        self._heartbeat_task = self.loop.create_task(self._heartbeat())  # cancelled with the loop's other tasks
        run_until_complete(
            self.loop,
            serve_app(self.wsgi, listen, self._until_stopped, shutdown_timeout=settings.server.shutdown_grace),
        )
        log.info("worker.stopped", pid=os.getpid())

    async def _heartbeat(self) -> None:
        """Tell the supervisor this worker lives, also while it drains."""
        while True:
            self.notify()
            await asyncio.sleep(HEARTBEAT)

    async def _until_stopped(self) -> None:
        """Until a stop signal, or the supervisor is gone (this worker was orphaned)."""
        while not self._stopping.is_set():
            if os.getppid() != self.ppid:
                log.warning("worker.orphaned", pid=os.getpid(), effect="the supervisor is gone: draining and exiting")
                return
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), HEARTBEAT)


class SupervisorLog(glogging.Logger):
    """gunicorn's own messages as structlog events (`supervisor`), like the rest of the log."""

    def setup(self, cfg) -> None:
        self.error_log.handlers = [_ToStructlog()]
        self.error_log.setLevel(logging.DEBUG)  # structlog filters by --log-level
        self.access_log.handlers = [logging.NullHandler()]  # requests are logged by the application

    def access(self, *args, **kwargs) -> None:
        pass


class _ToStructlog(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Listening at:"):  # it says http:// for TLS; `proxy.listening` has the URL
            return
        level = record.levelname.lower()
        emit = getattr(log, level if level in ("debug", "info", "warning", "error", "critical") else "info")
        emit("supervisor", message=message, exc_info=record.exc_info or False)
