"""Which programs a test starts: an audit hook (`subprocess.Popen`, `os.posix_spawn`) that notes the
children started while a watch is on, and the pytest plugin (registered by `tests/conftest.py`) that fails
a test starting one without the `process` mark, so that `-m "not process"` really leaves them out.

The programs the application itself runs in process are not counted: gpg (signatures) and git (module
sources from git), nor mount/umount (a fixture's tmpfs); those tests are what `-m "not process"` is for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

# Started by the proxy's own code in process (python-gnupg, the git fetcher), or a moment's set-up command
# of a fixture (a tmpfs mounted for a disk-full test): no process of the test's.
IN_PROCESS_PROGRAMS = frozenset({"gpg", "gpg2", "gpg-agent", "gpgconf", "gpgsm", "git", "mount", "umount"})


class ChildWatch:
    """Notes the programs started while `watching()` is on (and `paused()` is not)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._on = False
        self._paused = 0
        sys.addaudithook(self._audit)  # for the life of the interpreter: audit hooks cannot be removed

    def _audit(self, event: str, args: tuple) -> None:
        if not self._on or self._paused or event not in ("subprocess.Popen", "os.posix_spawn"):
            return
        executable, argv = args[0], args[1]
        program = os.fsdecode(executable or (argv[0] if argv else b"?"))
        if os.path.basename(program) not in IN_PROCESS_PROGRAMS:
            self.started.append(" ".join(os.fsdecode(part)[:60] for part in (argv or [program])[:3]))

    @contextmanager
    def watching(self) -> Iterator[list[str]]:
        """Note what is started in the block (a fresh list each time)."""
        self.started, self._on = [], True
        try:
            yield self.started
        finally:
            self._on = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Not counted: what a session or module fixture starts for every test that comes after."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1


STARTED_IN_SETUP = pytest.StashKey[list[str]]()


class ProcessMarkCheck:
    """A test that starts a child process (a proxy, the CLI, a server, a tool) must carry the `process` mark.

    What a session or module fixture starts (redis-server, the S3 server) serves every later test: not
    counted against the test that happened to start it."""

    def __init__(self) -> None:
        self.children = ChildWatch()

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef):
        if fixturedef.scope == "function":
            return (yield)
        with self.children.paused():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        with self.children.watching() as started:
            result = yield
        item.stash[STARTED_IN_SETUP] = started
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        with self.children.watching() as started:
            result = yield
        started = item.stash.get(STARTED_IN_SETUP, []) + started
        if started and item.get_closest_marker("process") is None:
            pytest.fail(f"started {started[0]!r} (and {len(started) - 1} more) without the `process` mark", False)
        return result
