"""Issue 19 item 5: the application's life cycle. A start that fails at any step, or is stopped while it boots,
closes everything opened before that step: no file, thread, HTTP session, task or signal handler is left.

Each start runs the real application (`create_app`) through the server's own life cycle
(`proxy.web.server.serve_app`), in this process, so what it leaves behind can be counted.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import ssl
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from proxy.errors import StoreUnavailableError
from proxy.identity.tokens import AuthConfigError
from proxy.metadata_store.memory import MemoryFront
from proxy.settings.config import Settings
from proxy.web.app import create_app
from proxy.web.server import serve_app
from tests.fakes.redis_server import free_port


@dataclass(frozen=True)
class Footprint:
    """What a running application may hold of this process."""

    fds: dict[int, str]
    threads: frozenset[str]  # not counting the loop's executor, which outlives any application
    open_sessions: int  # made since the baseline froze the heap: `gc.get_objects` skips frozen objects
    tasks: int
    sighup: object

    @classmethod
    def now(cls) -> Footprint:
        gc.collect()
        fds = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # the listing's own descriptor, closed since
                continue
        threads = frozenset(
            f"{t.name}#{t.ident}" for t in threading.enumerate() if not t.name.startswith("asyncio_") and t.is_alive()
        )
        sessions = sum(1 for o in gc.get_objects() if isinstance(o, aiohttp.ClientSession) and not o.closed)
        tasks = len(asyncio.all_tasks() - {asyncio.current_task()})
        return cls(fds, threads, sessions, tasks, signal.getsignal(signal.SIGHUP))

    def left_since(self, before: Footprint) -> list[str]:
        """What is held now and was not before."""
        left = [f"fd {fd} -> {target}" for fd, target in self.fds.items() if before.fds.get(fd) != target]
        left += [f"thread {name}" for name in self.threads - before.threads]
        if self.open_sessions > before.open_sessions:
            left.append(f"{self.open_sessions - before.open_sessions} unclosed aiohttp.ClientSession")
        if self.tasks > before.tasks:
            left.append(f"{self.tasks - before.tasks} tasks still running")
        if self.sighup != before.sighup:
            left.append(f"the SIGHUP handler is {self.sighup!r}")
        return left


async def left_since(baseline: Footprint, settle: float = 5.0) -> list[str]:
    """What is still held that was not at `baseline`, once it stops shrinking within `settle` seconds: a thread
    or task that is on its way out when the footprint is taken is not left behind; a leak stays."""
    deadline = time.monotonic() + settle
    while True:
        left = Footprint.now().left_since(baseline)
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(0.05)


async def _no_listener(runner: web.AppRunner) -> list[asyncio.Server]:
    return []


async def _stop_at_once() -> None:
    return None


async def start_and_stop(app: web.Application) -> None:
    """The server's life cycle without a listener: start every resource, stop again."""
    await serve_app(app, _no_listener, _stop_at_once, shutdown_timeout=1)


@pytest.fixture
async def baseline(make_local_settings) -> AsyncIterator[Footprint]:
    """The process's footprint after one whole start and stop (lazy imports, the loop's executor threads).

    Everything alive by then is frozen (`gc.freeze`) until the test ends: each footprint's collection and
    scan for sessions then walks only what was made since, not the whole heap of a worker that has run
    thousands of tests (about 0.5 s of CPU each). Whatever the test leaves behind is made after the freeze."""
    tokens = make_local_settings().data_dir.parent / "tokens.toml"
    tokens.write_text("")
    await start_and_stop(create_app(make_local_settings(auth_tokens=tokens)))
    gc.collect()
    gc.freeze()
    try:
        yield Footprint.now()
    finally:
        gc.unfreeze()


class StartFailedError(Exception):
    pass


async def failing_step(app: web.Application) -> AsyncIterator[None]:
    raise StartFailedError("this step fails")
    yield  # a cleanup context, like the application's own


async def test_a_start_that_fails_after_any_step_closes_every_step_before_it(make_local_settings, baseline):
    tokens = make_local_settings().data_dir.parent / "tokens.toml"
    settings = make_local_settings(auth_tokens=tokens)  # with tokens, the access step also installs a handler
    steps = len(create_app(settings).cleanup_ctx)
    for position in range(steps + 1):
        app = create_app(settings)
        opened_before = [step.__name__ for step in app.cleanup_ctx[:position]]
        app.cleanup_ctx.insert(position, failing_step)
        with pytest.raises(StartFailedError):
            await start_and_stop(app)
        assert await left_since(baseline) == [], f"a failure after {opened_before} left these open"


async def test_a_stop_while_the_application_boots_closes_what_it_opened(make_local_settings, baseline):
    app = create_app(make_local_settings())
    reached = asyncio.Event()

    async def boots_slowly(app: web.Application) -> AsyncIterator[None]:
        reached.set()
        await asyncio.Event().wait()  # until the stop
        yield

    app.cleanup_ctx.append(boots_slowly)
    starting = asyncio.ensure_future(start_and_stop(app))
    await asyncio.wait_for(reached.wait(), 30)
    starting.cancel()  # what a stop signal does to a booting server (proxy.web.server.run_until_complete)
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert await left_since(baseline) == []


def _garbage(path: Path) -> Path:
    path.write_text("not what it should be\n")
    return path


# Real failures of one step (every step before it had opened): the settings that cause it, what it raises.
FAILURES = {
    "metadata store (its directory is a file)": (lambda s: {"data_dir": _block(s.cache_dir, s)}, FileExistsError),
    "upstream session (its CA file is garbage)": (
        lambda s: {"upstream_ca_file": _garbage(s.data_dir.parent / "ca")},
        ssl.SSLError,
    ),
    "access (a broken tokens file)": (
        lambda s: {"auth_tokens": _garbage(s.data_dir.parent / "tokens.toml")},
        AuthConfigError,
    ),
    "keyring (its home is a file)": (lambda s: {"data_dir": _block(s.gnupg_home, s)}, FileExistsError),
    "services (the git CA bundle cannot be written)": (
        lambda s: {"data_dir": _block(s.upstream_ca_bundle.parent, s)},
        FileExistsError,
    ),
    "archive store (S3 unreachable)": (
        lambda s: {
            "archive_store": "s3://bucket/archives",
            "s3_endpoint_url": f"http://127.0.0.1:{free_port()}",
            "s3_timeout": 1.0,
        },
        StoreUnavailableError,
    ),
}


def _block(path: Path, settings: Settings) -> Path:
    """A plain file where the directory `path` of the data dir should be; the data dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("in the way\n")
    return settings.data_dir


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_a_step_that_fails_to_open_leaves_nothing_open(make_local_settings, baseline, monkeypatch, failure):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # S3 fails on the connection, not on credentials
        monkeypatch.setenv(name, "test")
    overrides, error = FAILURES[failure]
    fresh = make_local_settings(data_dir=make_local_settings().data_dir.parent / "failing")  # not the baseline's
    settings = make_local_settings(**{"data_dir": fresh.data_dir, **overrides(fresh)})
    with pytest.raises(error) as raised:
        await start_and_stop(create_app(settings))
    assert await left_since(baseline) == [], f"{failure}: {raised.value!r}"


async def test_a_failure_inside_a_step_after_its_resource_opened_closes_that_resource(
    make_local_settings, baseline, monkeypatch
):
    """The metadata store's step opens the store, then reads the purge mark: a failure there (or a stop
    landing on that await) still closes the store it opened."""

    async def fails(self) -> bool:
        raise StartFailedError("reading the purge mark fails")

    monkeypatch.setattr(MemoryFront, "follow_purges", fails)
    with pytest.raises(StartFailedError):
        await start_and_stop(create_app(make_local_settings()))
    assert await left_since(baseline) == []
