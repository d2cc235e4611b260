"""Load generators and process probes: wrk (or an aiohttp loop), curl (or aiohttp) downloads, /proc."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import shutil
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
from yarl import URL

T = TypeVar("T")
WRK = shutil.which("wrk")
CURL = shutil.which("curl")
MIB = 1 << 20


# ---- /proc probes ----------------------------------------------------------------------------


class ProcessProbe:
    """Memory and CPU of one process (with `tree`: summed over it and its child processes, the workers
    of `serve --workers N`), from /proc. Peak RSS is VmHWM, reset per phase via clear_refs."""

    def __init__(self, pid: int, *, tree: bool = False) -> None:
        self.pid = pid
        self.tree = tree
        self.resettable = True

    def pids(self) -> list[int]:
        if not self.tree:
            return [self.pid]
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        return [self.pid, *map(int, children)]

    def _status_kib(self, field: str) -> int:
        return sum(_status_kib(pid, field) for pid in self.pids())

    def rss_mib(self) -> float:
        return self._status_kib("VmRSS") / 1024

    def peak_mib(self) -> float:
        """VmHWM (with `tree`: the sum of each process's peak, an upper bound of the peak of the sum)."""
        return self._status_kib("VmHWM") / 1024

    def peak_mib_each(self) -> dict[int, float]:
        """VmHWM of each process (with `tree`: the supervisor first, then its workers)."""
        return {pid: _status_kib(pid, "VmHWM") / 1024 for pid in self.pids()}

    def reset_peak(self) -> bool:
        """Make VmHWM the current RSS (Linux >= 4.0, needs ptrace rights on the process: we started it)."""
        try:
            for pid in self.pids():
                Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            self.resettable = False
        return self.resettable

    def cpu_seconds(self) -> float:
        return sum(_cpu_seconds(pid) for pid in self.pids())


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class RssSampler:
    """Samples VmRSS every few milliseconds in an asyncio task (a cross-check of VmHWM)."""

    def __init__(self, probe: ProcessProbe, interval: float = 0.005) -> None:
        self._probe, self._interval = probe, interval
        self.max_mib = 0.0
        self.samples = 0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            try:
                self.max_mib = max(self.max_mib, self._probe.rss_mib())
                self.samples += 1
            except (OSError, KeyError):
                return
            await asyncio.sleep(self._interval)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc) -> None:
        if self._task is not None:
            self._task.cancel()


# ---- a benchmark's run -----------------------------------------------------------------------------


async def in_temp_dir(prefix: str, keep: bool, run: Callable[[Path], Awaitable[T]]) -> T:
    """`run(root)` in a new temp dir `root`, removed afterwards unless `keep` (then its path is printed)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        return await run(root)
    finally:
        if keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def save_results(name: str, results: dict) -> None:
    """`results` as bench/results/NAME.json."""
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


# ---- requests per second ---------------------------------------------------------------------


def add_round_arguments(parser: argparse.ArgumentParser, *, seconds: float, rounds: int, connections: int) -> None:
    """The options of a benchmark of interleaved wrk rounds: their length, number and connections, and --keep."""
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--connections", type=int, default=connections)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (the servers' logs)")


@dataclass
class LoadResult:
    tool: str
    requests: int
    seconds: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int  # non-2xx answers plus socket errors

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _to_ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if match is None:
        raise ValueError(f"unknown wrk duration {text!r}")
    return float(match.group(1)) * _UNIT_MS[match.group(2)]


def parse_wrk(output: str) -> LoadResult:
    percentiles = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)\s*$", output, re.MULTILINE))
    total = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", output)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", output)
    if total is None or rps is None or "50" not in percentiles or "99" not in percentiles:
        raise ValueError(f"cannot parse wrk output:\n{output}")
    errors = 0
    if non2xx := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output):
        errors += int(non2xx.group(1))
    if sockets := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output):
        errors += sum(int(n) for n in sockets.groups())
    return LoadResult(
        "wrk",
        int(total.group(1)),
        _to_ms(total.group(2) + total.group(3)) / 1000,
        float(rps.group(1)),
        _to_ms(percentiles["50"]),
        _to_ms(percentiles["99"]),
        errors,
    )


async def wrk(url: str, *, connections: int, threads: int, seconds: float) -> LoadResult:
    """wrk does not verify certificates; TLS is still negotiated as with any client."""
    process = await asyncio.create_subprocess_exec(
        WRK,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--latency",
        "--timeout",
        "5s",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), seconds + 30)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed ({process.returncode}):\n{output.decode()}")
    return parse_wrk(output.decode())


@dataclass
class Throughput:
    tool: str
    mib_per_s: float
    seconds: float
    errors: int

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}


_SIZE_MIB = {"B": 1 / MIB, "KB": 1 / 1024, "MB": 1.0, "GB": 1024.0, "TB": 1024.0**2}


def parse_wrk_transfer(output: str) -> Throughput:
    """Bytes read over the whole run (bodies still in flight at the end included) per second."""
    total = re.search(r"requests in ([\d.]+)(us|ms|s|m), ([\d.]+)([KMGT]?B) read", output)
    if total is None:
        raise ValueError(f"cannot parse wrk output:\n{output}")
    seconds = _to_ms(total.group(1) + total.group(2)) / 1000
    mib = float(total.group(3)) * _SIZE_MIB[total.group(4)]
    errors = (
        sum(int(n) for n in sockets.groups())
        if (sockets := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output))
        else 0
    )
    if non2xx := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output):
        errors += int(non2xx.group(1))
    return Throughput("wrk", mib / seconds, seconds, errors)


async def wrk_throughput(url: str, *, connections: int, seconds: float) -> Throughput:
    """`connections` connections downloading `url` over and over (a large body: MiB/s, not requests/s)."""
    process = await asyncio.create_subprocess_exec(
        WRK,
        "-t2",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "60s",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), seconds + 90)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed ({process.returncode}):\n{output.decode()}")
    return parse_wrk_transfer(output.decode())


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def aiohttp_load(url: str, context: ssl.SSLContext, *, connections: int, seconds: float) -> LoadResult:
    """Fallback when wrk is absent: `connections` keep-alive connections in a closed loop."""
    latencies: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(ssl=context, limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = loop.time() + seconds

        async def worker() -> None:
            nonlocal errors
            while loop.time() < deadline:
                started = time.perf_counter()
                try:
                    async with session.get(url) as response:
                        await response.read()
                        ok = response.status == 200
                except (aiohttp.ClientError, OSError):
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - started
    return LoadResult(
        "aiohttp",
        len(latencies),
        elapsed,
        len(latencies) / elapsed,
        percentile(latencies, 0.50),
        percentile(latencies, 0.99),
        errors,
    )


async def sequential_latency(url: str, context: ssl.SSLContext, *, requests: int) -> dict:
    """Unloaded latency: `requests` GETs one after another on one keep-alive connection."""
    latencies: list[float] = []
    statuses = set()
    connector = aiohttp.TCPConnector(ssl=context, limit=1)
    async with aiohttp.ClientSession(connector=connector) as session:
        for index in range(requests + 5):
            started = time.perf_counter()
            async with session.get(url) as response:
                await response.read()
                statuses.add(response.status)
            if index >= 5:  # the first few include the TLS handshake and warm-up
                latencies.append((time.perf_counter() - started) * 1000)
    return {
        "requests": requests,
        "p50_ms": round(percentile(latencies, 0.50), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "statuses": sorted(statuses),
    }


# ---- redis-server ----------------------------------------------------------------------------


async def redis_command_calls(port: int) -> int:
    """Commands redis-server executed so far (INFO commandstats, less the INFO calls themselves)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"INFO commandstats\r\n")
        await writer.drain()
        header = await reader.readline()  # b"$LENGTH\r\n", then the text and b"\r\n"
        body = (await reader.readexactly(int(header[1:]) + 2)).decode()
    finally:
        writer.close()
        await writer.wait_closed()
    calls = re.findall(r"^cmdstat_([\w|]+):calls=(\d+)", body, re.MULTILINE)
    return sum(int(n) for name, n in calls if name != "info")


# ---- downloads -------------------------------------------------------------------------------


@dataclass
class Download:
    status: int
    size: int
    seconds: float
    first_byte_s: float
    sha256: str | None = None


async def download_aiohttp(
    url: str, context: ssl.SSLContext, *, hash_body: bool, start: asyncio.Barrier | None = None, timeout: float = 300
) -> Download:
    """One client on its own connection; waits on `start` (after its TLS handshake) when given."""
    connector = aiohttp.TCPConnector(ssl=context, limit=1)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        async with session.get(URL(url).origin() / "healthz") as warmup:
            await warmup.read()  # the TLS handshake happens before the start line (any status)
        if start is not None:
            await start.wait()
        started = time.perf_counter()
        first_byte = None
        digest = hashlib.sha256() if hash_body else None
        size = 0
        async with session.get(url) as response:
            async for chunk in response.content.iter_chunked(MIB):
                if first_byte is None:
                    first_byte = time.perf_counter() - started
                size += len(chunk)
                if digest is not None:
                    digest.update(chunk)
            status = response.status
        elapsed = time.perf_counter() - started
    return Download(
        status,
        size,
        elapsed,
        first_byte if first_byte is not None else elapsed,
        digest.hexdigest() if digest is not None else None,
    )


async def download_curl(url: str, ca_file: Path, timeout: float = 300) -> Download:
    process = await asyncio.create_subprocess_exec(
        CURL,
        "-sS",
        "--http1.1",
        "--cacert",
        str(ca_file),
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download} %{time_starttransfer} %{time_total}",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    output, error = await asyncio.wait_for(process.communicate(), timeout)
    if process.returncode != 0:
        raise RuntimeError(f"curl failed ({process.returncode}): {error.decode().strip()}")
    status, size, first_byte, total = output.decode().split()
    return Download(int(status), int(size), float(total), float(first_byte))


async def parallel_downloads(
    url: str, ca_file: Path, context: ssl.SSLContext, clients: int
) -> tuple[float, list[Download]]:
    """`clients` simultaneous downloads; returns (wall seconds until the last finished, results)."""
    started = time.perf_counter()
    if CURL is not None:
        results = await asyncio.gather(*(download_curl(url, ca_file) for _ in range(clients)))
    else:
        results = await asyncio.gather(*(download_aiohttp(url, context, hash_body=False) for _ in range(clients)))
    return time.perf_counter() - started, list(results)
