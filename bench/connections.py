#!/usr/bin/env python3
"""Memory under connection abuse: many idle TLS connections, and clients that stop reading.

    .venv/bin/python bench/connections.py [--idle 3000] [--slow 100] [--size-mib 32] [-- PROXY FLAGS...]

Starts the fake registry and the proxy as a real process (loopback only, its own TLS), caches a
big archive, then from a SEPARATE client process (so the client's memory is not the proxy's):

1. idle: opens `--idle` TLS connections and sends nothing. Reports how many the proxy kept open,
   how many it refused or closed, and the proxy's RSS (VmRSS) while they are held.
2. slow: `--slow` clients ask for the big archive, read its first 64 KiB and stop reading (small
   SO_RCVBUF). Samples the proxy's RSS for `--hold` seconds; reports the peak and how many
   connections the proxy dropped (TCP state seen by the client, no reading needed).

Flags after `--` go to `registry-proxy serve` (e.g. `-- --send-timeout 5s`). The whole run
stops by itself after `--time-limit` seconds. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import ssl
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.load import ProcessProbe  # noqa: E402
from bench.world import MIB, archive_document, mirror_path, random_release  # noqa: E402
from tests.fakes.process import ProxyProcess  # noqa: E402
from tests.fakes.rawclients import RawClient, open_tls, request  # noqa: E402
from tests.fakes.registry import FakeRegistry  # noqa: E402
from tests.fakes.signing import SigningKey, stop_gpg_agent  # noqa: E402


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ---- the client process ----------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> None:
    """Open the connections, report on stdout, hold them until stdin closes (or --hold runs out)."""
    _raise_fd_limit()
    context = ssl.create_default_context(cafile=args.ca)
    gate = asyncio.Semaphore(64)  # handshakes in flight
    slow = args.worker == "slow"

    async def one() -> RawClient | BaseException:
        async with gate:
            try:
                client = await open_tls(
                    "127.0.0.1",
                    args.port,
                    context,
                    timeout=15,
                    receive_buffer=32 * 1024 if slow else None,
                    stop_reading_after=64 * 1024 if slow else None,
                )
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                return exc
            if slow:
                client.send(request(args.path))
            return client

    results = await asyncio.gather(*(one() for _ in range(args.count)))
    clients = [r for r in results if isinstance(r, RawClient)]
    if slow:  # every client got the start of its body (or was dropped)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.got_data.wait() for c in clients)), 30)
    await asyncio.sleep(1.0)  # let the server refuse/close what it will
    _report(results, clients, phase="held")
    stdin = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stdin.read(), args.hold)  # the parent closes stdin when it has measured
    _report(results, clients, phase="end")
    for client in clients:
        client.abort()


def _report(results: list, clients: list[RawClient], phase: str) -> None:
    failed = len(results) - len(clients)
    dropped = sum(1 for c in clients if c.dropped_by_server())
    refused_503 = sum(1 for c in clients if c.status() == 503)
    print(
        json.dumps(
            {
                "phase": phase,
                "attempted": len(results),
                "connect_failed": failed,
                "open": len(clients) - dropped,
                "closed_by_proxy": dropped,
                "answered_503": refused_503,
                "bytes_received": sum(c.received for c in clients),
            }
        ),
        flush=True,
    )


# ---- the measuring process -------------------------------------------------------------------


async def _phase(proxy: ProxyProcess, probe: ProcessProbe, mode: str, count: int, path: str, hold: float) -> dict:
    before = probe.rss_mib()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--worker",
        mode,
        "--port",
        str(proxy.port),
        "--ca",
        str(proxy.ca_file),
        "--count",
        str(count),
        "--path",
        path,
        "--hold",
        str(hold + 120),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    peak = before
    started = time.monotonic()
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 240)
        held = json.loads(line) if line else {"error": "client process ended early"}
        peak = max(peak, probe.rss_mib())
        rss_held = probe.rss_mib()
        deadline = time.monotonic() + hold
        while time.monotonic() < deadline:
            peak = max(peak, probe.rss_mib())
            await asyncio.sleep(0.1)
        rss_end = probe.rss_mib()
        child.stdin.close()
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        end = json.loads(line) if line else {}
    finally:
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
        await child.wait()
    await asyncio.sleep(2.0)
    return {
        "clients": count,
        "rss_before_mib": round(before, 1),
        "rss_held_mib": round(rss_held, 1),
        "rss_peak_mib": round(peak, 1),
        f"rss_after_{hold:g}s_mib": round(rss_end, 1),
        "rss_after_release_mib": round(probe.rss_mib(), 1),
        "seconds": round(time.monotonic() - started, 1),
        "client_view_held": held,
        f"client_view_after_{hold:g}s": end,
    }


async def _warm(proxy: ProxyProcess, path: str) -> int:
    import aiohttp

    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path, ssl=context) as response:
        body = await response.read()
        if response.status != 200:
            raise RuntimeError(f"warming {path}: {response.status} {body[:200]!r}")
        return len(body)


async def _measure(args: argparse.Namespace) -> dict:
    _raise_fd_limit()  # the proxy inherits it: the old code had no cap, it must be able to accept them
    with tempfile.TemporaryDirectory(prefix="bench-connections-") as tmp:
        root = Path(tmp)
        key = SigningKey(root / "gpg", "Bench Release Signer")
        import trustme

        ca = trustme.CA()
        ca_file = root / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        upstream_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1").configure_cert(upstream_ssl)
        release, _ = random_release(root, key, "big", args.size_mib * MIB)
        registry = FakeRegistry(upstream_ssl)
        registry.add(release)
        await registry.start()
        proxy = ProxyProcess(root / "proxy" / "data", registry.url, ca_file, "--log-level", "warning", *args.proxy_args)
        try:
            await proxy.start()
            path = mirror_path(release, archive_document(release))
            size = await _warm(proxy, path)
            probe = ProcessProbe(proxy.process.pid)
            result = {
                "proxy_args": args.proxy_args,
                "archive_mib": round(size / MIB, 1),
                "rss_idle_mib": round(probe.rss_mib(), 1),
            }
            if args.idle:
                result["idle"] = await _phase(proxy, probe, "idle", args.idle, "/healthz", args.hold)
            if args.slow:
                result["slow"] = await _phase(proxy, probe, "slow", args.slow, path, args.hold)
            return result
        finally:
            await proxy.stop()
            await registry.stop()
            stop_gpg_agent(key.home)
            stop_gpg_agent(proxy.data_dir / "gnupg")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idle", type=int, default=3000, help="idle TLS connections (0: skip)")
    parser.add_argument("--slow", type=int, default=100, help="clients that stop reading (0: skip)")
    parser.add_argument("--size-mib", type=int, default=32, help="size of the big archive")
    parser.add_argument("--hold", type=float, default=15.0, help="seconds to hold the connections while sampling")
    parser.add_argument("--time-limit", type=float, default=420.0, help="abort the whole run after this")
    parser.add_argument("--worker", choices=["idle", "slow"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("proxy_args", nargs=argparse.REMAINDER, help="-- then flags for registry-proxy serve")
    args = parser.parse_args()
    args.proxy_args = [a for a in args.proxy_args if a != "--"]
    if args.worker:
        asyncio.run(_worker(args))
        return 0
    result = asyncio.run(asyncio.wait_for(_measure(args), args.time_limit))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
