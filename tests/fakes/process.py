"""Real processes for tests and benchmarks: the proxy (`python -m proxy serve`) and a client
for it, its CLI, and `terraform`.

Shared by `tests/e2e`, `tests/faults` and `bench/`, so nothing imports a conftest.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import sqlite3
import ssl
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from tests.fakes.ports import PORT_ATTEMPTS, PortTakenError, free_port, listening_ports

__all__ = ["REGISTRY_HOST", "ProxyProcess", "free_port", "terminate", "wait_for", "wait_healthy"]

REGISTRY_HOST = "registry.example.test"
TERRAFORM = shutil.which("terraform")
REPO_ROOT = Path(__file__).parents[2]
# How long a proxy may take to start before a test fails: about a second on a quiet machine, but a
# machine running parallel test workers (and other test runs) can be far slower; only a hang takes this long.
START_TIMEOUT = 90.0
# A path entry where `import rich` fails (tests/fakes/production_path/rich): the proxy's children import what they
# would where the proxy is installed, not the development tools of the test virtualenv.
PRODUCTION_PATH = Path(__file__).parent / "production_path"


def child_environment() -> dict[str, str]:
    """This process's environment, with PRODUCTION_PATH first on the Python path."""
    environment = dict(os.environ)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PRODUCTION_PATH), environment.get("PYTHONPATH")]))
    return environment


class ProxyProcess:
    """`python -m proxy serve` with its own generated TLS, pointed at the fake registry."""

    def __init__(self, data_dir: Path, registry_url: str | None, ca_file: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        upstream = (
            ["--upstream-map", f"{REGISTRY_HOST}={registry_url}", "--allow-host", ""]
            if registry_url
            else ["--allow-host", REGISTRY_HOST]
        )
        workers = [] if "--workers" in extra else ["--workers", "1"]  # one process unless a test asks for more
        self.args = [
            sys.executable,
            "-m",
            "proxy",
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(data_dir),
            *upstream,
            "--upstream-ca-file",
            str(ca_file),
            "--log-format",
            "json",
            *workers,
            *extra,
        ]
        self.process: asyncio.subprocess.Process | None = None
        self.log_path = data_dir.parent / f"proxy-{self.port}.log"
        self.plain_http = "--plain-http" in extra
        self.source = REPO_ROOT  # the checkout whose `proxy` package runs (a benchmark may run another's)

    @property
    def url(self) -> str:
        return f"{'http' if self.plain_http else 'https'}://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        return self.data_dir / "tls" / "ca.pem"

    async def start(self) -> None:
        """Start the proxy and wait until it is healthy; on another port if someone took its port first."""
        for attempt in range(PORT_ATTEMPTS):
            try:
                await self._start_once()
                return
            except PortTakenError:
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                self._listen_on(free_port())

    def _listen_on(self, port: int) -> None:
        listen = self.args.index("--listen") + 1
        self.args[listen] = self.args[listen].replace(f":{self.port}", f":{port}")
        self.port = port

    async def _start_once(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115, ASYNC230 - handed to the child process
        log_start = log.tell()
        self.process = await asyncio.create_subprocess_exec(
            *self.args, stdout=log, stderr=log, cwd=self.source, env=child_environment()
        )
        log.close()
        await self._wait_bound(log_start)
        await wait_healthy(
            self.url + "/healthz",
            None if self.plain_http else self.ca_file,
            self.process,
            lambda: self.log_path.read_text()[-2000:],
            timeout=START_TIMEOUT,
        )

    async def _wait_bound(self, log_start: int) -> None:
        """Until this process (the supervisor, with workers) listens on its port; PortTakenError if
        someone else had it (the supervisor of workers would retry it for seconds: it is stopped)."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while self.port not in listening_ports(self.process.pid):
            with open(self.log_path, "rb") as file:  # noqa: ASYNC230 - a small local file
                file.seek(log_start)
                taken = b"in use" in file.read()
            if self.process.returncode is not None or taken:
                await terminate(self.process, 5)
                self.process = None
                if taken:
                    raise PortTakenError(f"port {self.port} was taken")
                raise RuntimeError(f"{self.url} exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.url} did not listen: {self.log_path.read_text()[-2000:]}")
            await asyncio.sleep(0.02)

    def fetched_at(self, key: str) -> float | None:
        """When the document cached under `key` in the proxy's embedded metadata store was fetched (its
        wall-clock `fetched_at`, by which the proxy judges freshness); None while it is not cached. Read
        only, while the proxy runs."""
        path = self.data_dir / "metadata" / "metadata.sqlite"
        if not path.exists():
            return None
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT value FROM metadata WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        sealed = bytes(row[0])
        return float(json.loads(sealed[sealed.index(b"{") :])["fetched_at"])  # the JSON after the seal

    async def wait_stale(self, ttl: float, *keys: str) -> None:
        """Until every document cached under `keys` is older than `ttl` seconds."""

        def stale() -> bool:
            times = [self.fetched_at(key) for key in keys]
            return all(at is not None and time.time() > at + ttl for at in times)

        await wait_for(stale, ttl + 30, f"{', '.join(keys)} to be older than {ttl}s")

    def events(self, event: str | None = None) -> list[dict]:
        """The proxy's JSON log records so far (those named `event`, if given)."""
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (event is None or record.get("event") == event):
                records.append(record)
        return records

    async def kill(self) -> None:
        """SIGKILL: no cleanup, no lock release (a crash)."""
        assert self.process is not None
        self.process.kill()
        await self.process.wait()
        self.process = None

    async def stop(self) -> None:
        await terminate(self.process, 15)
        self.process = None


class ProcessClient:
    """HTTP(S) requests to one proxy process, trusting the CA it generated."""

    def __init__(self, process: ProxyProcess, session: aiohttp.ClientSession) -> None:
        self.process = process
        self.session = session

    async def get(self, path: str, **kwargs) -> tuple[int, dict, bytes]:
        async with self.session.get(self.process.url + path, **kwargs) as response:
            return response.status, dict(response.headers), await response.read()

    async def head(self, path: str, **kwargs) -> tuple[int, dict]:
        async with self.session.head(self.process.url + path, **kwargs) as response:
            return response.status, dict(response.headers)


async def wait_healthy(
    url: str, ca_file: Path | None, process: asyncio.subprocess.Process, last_words: Callable[[], str], timeout: float
) -> None:
    """Poll `url` over TLS (trusting `ca_file`, once it exists; plain HTTP if None) until it answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"{url} exited: {last_words()}")
        if ca_file is None or ca_file.exists():  # noqa: ASYNC240 - a test helper polling a local file
            try:
                context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
                async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, OSError, ssl.SSLError):
                pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not come up: {last_words()}")


async def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` (state of another process, or of a fake) until it holds; fail naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Like `wait_for`, for a condition that must be awaited (a store's contents)."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def terminate(process: asyncio.subprocess.Process | None, grace: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited after `grace` seconds."""
    if process is not None and process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()


class Terraform:
    """Runs `terraform init` in a working directory with a CLI config pointing at the proxy."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def workdir(self, name: str, main_tf: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True)
        (path / "main.tf").write_text(main_tf)
        return path

    async def init(
        self, workdir: Path, cli_config: str, ca_file: Path, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        return await self.run(workdir, ["init", "-input=false", "-no-color"], cli_config, ca_file, env)

    async def run(
        self, workdir: Path, args: list[str], cli_config: str, ca_file: Path, env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Run `terraform ARGS` in `workdir` with its own CLI config, trusting `ca_file`; `env`: variables to
        add (`TF_TOKEN_<host>`: the CLI's variables are otherwise not passed on)."""
        extra = env or {}
        config = workdir / "cli.tfrc"
        config.write_text(cli_config)
        env = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
        env.update(
            TF_CLI_CONFIG_FILE=str(config),
            SSL_CERT_FILE=str(ca_file),
            CHECKPOINT_DISABLE="1",
            TF_IN_AUTOMATION="1",
            HOME=str(workdir),
        )
        env.update(extra)
        process = await asyncio.create_subprocess_exec(
            TERRAFORM, *args, cwd=workdir, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await asyncio.wait_for(process.communicate(), 180)
        return process.returncode, output.decode()


async def registry_proxy(*args: str) -> tuple[int, str]:
    """Run the `registry-proxy` CLI (as `python -m proxy`) and return its exit code and output."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        *args,
        cwd=REPO_ROOT,
        env=child_environment(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 180)
    return process.returncode, output.decode()


async def registry_proxy_in_process(*args: str) -> tuple[int, str]:
    """`registry_proxy(*args)` without a process start (about a second of CPU each): the CLI's `main`, which the
    `registry-proxy` script and `python -m proxy` call and whose return value is their exit code, run in a
    thread of this process (it runs its own event loop) with stdout and stderr captured together. For tests of
    what a command does and prints; a test of the process itself (signals, exit of `serve`) uses `registry_proxy`."""
    return await asyncio.to_thread(cli_in_process, *args)


def cli_in_process(*args: str) -> tuple[int, str]:
    """`registry_proxy_in_process` in this thread, for a test without an event loop."""
    from proxy.cli import main

    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return code, output.getvalue()
