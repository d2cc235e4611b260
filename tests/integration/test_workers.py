"""`serve --workers N`: real supervisor and worker processes on one listening socket.

The same shape as the fleet tests (tests/e2e/test_fleet_e2e.py): cold requests spread over the
workers (and over two replicas on one data dir) reach the upstream once per artifact; a killed
worker is replaced; SIGTERM lets a slow download finish before everything exits 0; the
embedded SQLite store takes two writing processes at once.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import ssl
import sys

import aiohttp
import pytest

from proxy.metadata_store.embedded import EmbeddedStore
from tests.fakes.packages import Release
from tests.fakes.process import REPO_ROOT, ProxyProcess, terminate

PATH = "/mirror/v1/registry.example.test/acme/foo/{v}/linux_amd64/terraform-provider-foo_{v}_linux_amd64.zip"
COLD_REQUESTS = 100


def client_ssl(proxy) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(proxy.ca_file))


async def fetch(session: aiohttp.ClientSession, proxy, path: str) -> tuple[int, bytes]:
    async with session.get(proxy.url + path, ssl=client_ssl(proxy)) as response:
        return response.status, await response.read()


def new_session() -> aiohttp.ClientSession:
    """A connection per request, so the kernel hands them to every worker."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))


def worker_pids(proxy) -> list[int]:
    return [record["pid"] for record in proxy.events("worker.started")]


async def wait_for(condition, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - a condition of other processes (their log, the registry)
            await asyncio.sleep(0.05)


def assert_fetched_once(registry, release: Release) -> None:
    assert registry.count(registry.archive_path(release, "linux_amd64")) == 1
    assert registry.count(f"/files/acme/foo/{release.version}/{release.shasums_name}") == 1


async def test_cold_requests_over_the_workers_fetch_each_artifact_once(proxy_process, registry):
    registry.archive_chunk_delay = 0.05
    proxy = await proxy_process("--workers", "2")
    await wait_for(lambda: len(worker_pids(proxy)) == 2)
    async with new_session() as session:
        results = await asyncio.gather(*(fetch(session, proxy, PATH.format(v="1.0.0")) for _ in range(COLD_REQUESTS)))
        release = registry.releases[("acme", "foo")]["1.0.0"]
        assert [status for status, _ in results] == [200] * COLD_REQUESTS
        assert all(body == release.zips["linux_amd64"] for _, body in results)
        assert_fetched_once(registry, release)
        async with asyncio.timeout(10):  # a worker counts a request after its last byte went out
            while await archives_served(session, proxy) < COLD_REQUESTS:  # noqa: ASYNC110 - polls the workers
                await asyncio.sleep(0.1)
        assert await archives_served(session, proxy) == COLD_REQUESTS  # the workers' counts, summed
    assert list((proxy.data_dir / "locks").iterdir()) == []  # lock files are removed after use


async def archives_served(session: aiohttp.ClientSession, proxy) -> float:
    """The archive requests answered 200, from /metrics."""
    async with session.get(proxy.url + "/metrics", ssl=client_ssl(proxy)) as response:
        exposition = await response.text()
    served = re.search(r'registry_proxy_requests_total\{route="[^"]*archive[^"]*",status="200"\} (\S+)', exposition)
    return float(served.group(1)) if served else 0.0


async def test_cold_requests_over_two_replicas_of_two_workers_fetch_once(proxy_process, registry, tmp_path):
    registry.archive_chunk_delay = 0.05
    shared = tmp_path / "shared-data"
    first = await proxy_process("--workers", "2", data_dir=shared)
    second = await proxy_process("--workers", "2", data_dir=shared)
    async with new_session() as session:
        results = await asyncio.gather(
            *(fetch(session, first if n % 2 else second, PATH.format(v="1.0.0")) for n in range(COLD_REQUESTS))
        )
    release = registry.releases[("acme", "foo")]["1.0.0"]
    assert [status for status, _ in results] == [200] * COLD_REQUESTS
    assert all(body == release.zips["linux_amd64"] for _, body in results)
    assert_fetched_once(registry, release)


async def test_a_killed_worker_is_replaced_and_the_proxy_keeps_answering(proxy_process, registry):
    proxy = await proxy_process("--workers", "2")
    await wait_for(lambda: len(worker_pids(proxy)) == 2)
    victim = worker_pids(proxy)[0]
    os.kill(victim, signal.SIGKILL)
    await wait_for(lambda: len(worker_pids(proxy)) == 3)
    assert victim not in worker_pids(proxy)[2:]
    async with new_session() as session:
        for _ in range(10):  # both workers answer
            async with session.get(proxy.url + "/readyz", ssl=client_ssl(proxy)) as response:
                assert response.status == 200
                assert (await response.json())["status"] == "ready"
        status, _ = await fetch(session, proxy, PATH.format(v="1.0.0"))
    assert status == 200
    assert proxy.process.returncode is None


async def test_sigterm_lets_a_slow_download_finish_then_every_process_exits_0(proxy_process, registry, signing_key):
    release = registry.add(
        Release("acme", "foo", "3.0.0", signing_key, platforms=("linux_amd64",), noise=2 * 1024 * 1024)
    )
    registry.archive_chunk_delay = 0.3  # a few seconds for the whole archive
    proxy = await proxy_process("--workers", "2")
    await wait_for(lambda: len(worker_pids(proxy)) == 2)
    archive = registry.archive_path(release, "linux_amd64")
    async with new_session() as session:
        download = asyncio.create_task(fetch(session, proxy, PATH.format(v="3.0.0")))
        await wait_for(lambda: registry.count(archive) == 1)
        supervisor = proxy.process
        supervisor.send_signal(signal.SIGTERM)
        status, body = await asyncio.wait_for(download, 30)
    assert status == 200 and body == release.zips["linux_amd64"]
    assert await asyncio.wait_for(supervisor.wait(), 30) == 0
    pids = worker_pids(proxy)
    assert sorted(record["pid"] for record in proxy.events("worker.stopped")) == sorted(pids)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


WRITER = """
import asyncio, sys
from pathlib import Path
from proxy.metadata_store.embedded import EmbeddedStore

async def main(path, name):
    store = EmbeddedStore(Path(path))
    await store.set("warm", b"")  # the supervisor makes the file before the workers start

    async def writer(task):  # a worker's requests read and write at the same time
        for n in range(40):
            assert n == 0 or await store.get(f"{name}:{task}:{n - 1}") is not None
            await store.set(f"{name}:{task}:{n}", b"x" * 512)

    await asyncio.gather(*(writer(task) for task in range(20)))
    print(store.problem or "ok", flush=True)
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@pytest.mark.process
async def test_the_embedded_store_takes_writers_from_two_processes_at_once(tmp_path):
    database = tmp_path / "metadata.sqlite"
    writers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", WRITER, str(database), name, cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE
        )
        for name in ("a", "b")
    ]
    outputs = await asyncio.wait_for(asyncio.gather(*(writer.communicate() for writer in writers)), 60)
    assert [writer.returncode for writer in writers] == [0, 0]
    assert [stdout.decode().strip() for stdout, _ in outputs] == ["ok", "ok"]  # never busy, never down
    store = EmbeddedStore(database)
    try:
        keys = [f"{name}:{task}:{n}" for name in "ab" for task in range(20) for n in range(40)]
        assert all(value is not None for value in await store.get_many(keys))
    finally:
        await store.close()


def alive(pid: int) -> bool:
    """The process runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


@pytest.mark.process
@pytest.mark.parametrize("attempt", range(3))  # the stop must land while a worker boots: a few tries
async def test_a_stop_signal_while_the_workers_boot_ends_every_process_promptly(tmp_path, registry, ca_file, attempt):
    """Found in the suite: a SIGTERM that reached a worker before its own handlers were installed was lost
    (the arbiter's handler, inherited by the fork, took it), and a worker stopped right after its start hung
    in its clean-up (Python 3.11's wait_for swallowed the evictor's cancel). The supervisor then waited its
    whole graceful timeout (25 s), and a worker whose supervisor was killed meanwhile served on forever."""
    proxy = ProxyProcess(tmp_path / "data", registry.url, ca_file, "--workers", "2")
    process = await asyncio.create_subprocess_exec(
        *proxy.args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=REPO_ROOT
    )
    pids: list[int] = []
    try:
        async with asyncio.timeout(30):
            while len(pids) < 2:
                line = await process.stdout.readline()
                assert line, "the proxy exited before booting its workers"
                if found := re.search(rb"Booting worker with pid: (\d+)", line):
                    pids.append(int(found.group(1)))
        process.send_signal(signal.SIGTERM)
        # Promptly: well before the supervisor's graceful timeout (25 s), after which it kills what is left.
        async with asyncio.timeout(20):
            while await process.stdout.read(65536):  # to the end: every process holding the pipe has exited
                pass
            await process.wait()
        assert process.returncode == 0
        assert not [pid for pid in pids if alive(pid)]
    finally:
        for pid in pids:  # first: a worker left running holds the pipe, and the wait for the master with it
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        await terminate(process, 5)
