"""Where the test suite's CPU goes: a pytest plugin that records the CPU time (user + system) of every test and
every fixture, and a report ranking them by file, by fixture and by test.

Record (any pytest arguments; each xdist worker writes its own file into the folder):
    TEST_CPU_OUT=FOLDER .venv/bin/python -m pytest -p scripts.test_cpu -n 2 ...
Report:
    .venv/bin/python scripts/test_cpu.py FOLDER [--top N]

A test's CPU is that of the worker's process and of the children it reaped in the test (setup, call and
teardown): a proxy process, terraform or gpg the test started and waited for. The setup and teardown of
session, package and module fixtures is not counted in the test that happened to run them but on its own
("shared fixtures"): what they start (redis-server, the S3 server) is reaped at their teardown, often after
the worker's last test. A fixture's CPU is its own setup and teardown, without the fixtures it asked for.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

FIELDS = ("self", "children")


def _cpu() -> tuple[float, float]:
    """CPU seconds so far of this process and of its reaped children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _since(start: tuple[float, float]) -> tuple[float, float]:
    now = _cpu()
    return now[0] - start[0], now[1] - start[1]


def pytest_configure(config: pytest.Config) -> None:
    # the folder is named in the environment: an option's value would be taken for a path to test by pytest's
    # first look at the arguments, where it finds the root folder, in xdist's workers
    folder = os.environ.get("TEST_CPU_OUT")
    if folder:
        config.pluginmanager.register(CpuRecorder(Path(folder)), "cpu-recorder")


class CpuRecorder:
    """Writes one JSON line per test phase and per fixture setup or teardown."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.out = (folder / f"{worker}.jsonl").open("w", encoding="utf-8")
        self.worker = worker
        self.started = time.monotonic()
        self._stack: list[float] = []  # CPU of the fixtures set up inside the one being set up
        self._teardown_start: dict[int, tuple[float, float]] = {}
        self._spawned: list[str] = []
        self._shared = 0.0  # CPU of fixtures wider than a test, set up or torn down in the current phase
        sys.addaudithook(self._audit)
        self._write(kind="start", cpu=_cpu())

    def _audit(self, event: str, args: tuple) -> None:
        if event in ("subprocess.Popen", "os.posix_spawn"):
            executable, argv = args[0], args[1]
            program = os.path.basename(os.fsdecode(executable or (argv[0] if argv else b"?")))
            if program.startswith("python") and argv and len(argv) > 2:  # python -m NAME / python -c
                program += " " + " ".join(os.fsdecode(part) for part in argv[1:3])[:40]
            self._spawned.append(program)

    def _write(self, **record) -> None:
        self.out.write(json.dumps(record) + "\n")

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session):
        start = _cpu()
        result = yield
        self._write(kind="collection", cpu=_since(start))
        return result

    def _phase(self, item: pytest.Item, phase: str):
        start, wall = _cpu(), time.monotonic()
        self._spawned, self._shared = [], 0.0
        result = yield
        self._write(
            kind="phase",
            test=item.nodeid,
            phase=phase,
            cpu=_since(start),
            wall=time.monotonic() - wall,
            spawned=self._spawned,
            shared=self._shared,
        )
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        return (yield from self._phase(item, "setup"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        return (yield from self._phase(item, "call"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item):
        return (yield from self._phase(item, "teardown"))

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
        start = _cpu()
        self._stack.append(0.0)
        try:
            return (yield)
        finally:
            used = sum(_since(start))
            inner = self._stack.pop()
            if self._stack:
                self._stack[-1] += used
            if fixturedef.scope != "function":
                self._shared += used - inner
            self._write(
                kind="fixture",
                name=fixturedef.argname,
                scope=fixturedef.scope,
                where=fixturedef.baseid,
                step="setup",
                cpu=used - inner,
            )
            # runs before the fixture's own teardown (finalizers run last-in first-out)
            fixturedef.addfinalizer(lambda: self._teardown_start.__setitem__(id(fixturedef), _cpu()))

    def pytest_fixture_post_finalizer(self, fixturedef: pytest.FixtureDef) -> None:
        start = self._teardown_start.pop(id(fixturedef), None)
        if start is not None:
            if fixturedef.scope != "function":
                self._shared += sum(_since(start))
            self._write(
                kind="fixture",
                name=fixturedef.argname,
                scope=fixturedef.scope,
                where=fixturedef.baseid,
                step="teardown",
                cpu=sum(_since(start)),
            )

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self) -> None:
        self._write(kind="end", cpu=_cpu(), wall=time.monotonic() - self.started)
        self.out.close()


def _records(folder: Path):
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            yield path.stem, json.loads(line)


def report(folder: Path, top: int) -> None:
    """Print the totals, then the costliest files, fixtures and tests."""
    by_file: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    by_test: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    by_fixture: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
    workers: dict[str, dict] = collections.defaultdict(dict)
    wider: dict[str, float] = collections.defaultdict(float)  # a worker's wider fixtures since its last phase
    shared = 0.0
    for worker, record in _records(folder):
        kind = record["kind"]
        if kind == "phase":
            own = record.get("shared", wider[worker])  # (records of before the field: the fixtures' own records)
            wider[worker] = 0.0
            shared += own
            cpu = sum(record["cpu"]) - own
            path = record["test"].split("::")[0]
            by_file[path][0] += cpu
            by_file[path][1] += record["wall"]
            by_file[path][2] += record["phase"] == "call"
            by_test[record["test"]][0] += cpu
            by_test[record["test"]][1] += record["wall"]
        elif kind == "fixture":
            entry = by_fixture[(record["name"], record["scope"])]
            entry[0 if record["step"] == "setup" else 1] += record["cpu"]
            entry[2] += record["step"] == "setup"
            if record["scope"] != "function":
                wider[worker] += record["cpu"]
        else:
            workers[worker][kind] = record
    tests_cpu = sum(cpu for cpu, _ in by_test.values())
    print(f"{'worker':10} {'start-up':>8} {'collection':>10} {'own':>8} {'children':>9} {'wall':>8}")
    for worker, records in sorted(workers.items()):
        end = records.get("end", {"cpu": [0, 0], "wall": 0})
        startup = sum(records.get("start", {"cpu": [0, 0]})["cpu"])
        collection = sum(records.get("collection", {}).get("cpu", [0, 0]))
        own, children = end["cpu"]
        print(f"{worker:10} {startup:8.1f} {collection:10.1f} {own:8.1f} {children:9.1f} {end['wall']:8.1f}")
    print(f"tests: {len(by_test)}, their CPU {tests_cpu:.1f} s; shared fixtures (session, module): {shared:.1f} s\n")
    print(f"{'CPU s':>8} {'wall s':>8} {'tests':>6}  file")
    for path, (cpu, wall, count) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.1f} {wall:8.1f} {count:6d}  {path}")
    print(f"\n{'setup s':>8} {'tear s':>8} {'times':>6}  fixture (scope)")
    for (name, scope), (setup, teardown, count) in sorted(by_fixture.items(), key=lambda kv: -kv[1][0] - kv[1][1])[
        :top
    ]:
        print(f"{setup:8.1f} {teardown:8.1f} {count:6d}  {name} ({scope})")
    print(f"\n{'CPU s':>8} {'wall s':>8}  test")
    for test, (cpu, wall) in sorted(by_test.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:8.2f} {wall:8.2f}  {test}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    report(args.folder, args.top)


if __name__ == "__main__":
    sys.exit(main())
