#!/usr/bin/env python3
"""Memory soak: bursts of idle TLS connections, RSS after each burst, on uvloop and asyncio.

    .venv/bin/python bench/idle_soak.py [--bursts 20] [--low 1000] [--high 3000] [--loop uvloop --loop asyncio]
                                        [--close client|timeout] [-- PROXY FLAGS...]

For each event loop: start the proxy as a real process (loopback only, its own TLS, one process), then
`--bursts` times: a SEPARATE client process (so its memory is not the proxy's) opens between `--low` and
`--high` TLS connections (sizes cycle through the range), sends nothing, and once all are open either
closes them (`--close client`) or waits for the proxy to drop them at `--client-header-timeout`
(`--close timeout`). The proxy's RSS is sampled while they are held, and 3 s after it reports no connection
open (its /metrics): it returns a burst's memory to the system 1 s after the burst (proxy.web.allocator).

The goal (issue 18, item 7): RSS flat within +/-10 % from the 5th to the last burst, i.e. every RSS from
the 5th burst on lies within 10 % of the 5th burst's. Prints one JSON document; exits 1 when a loop misses
the goal. Flags after `--` go to `registry-proxy serve` (e.g. `-- --max-connections 4096`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import ssl
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.connections import _raise_fd_limit  # noqa: E402
from bench.load import ProcessProbe  # noqa: E402
from tests.fakes.process import ProxyProcess  # noqa: E402
from tests.fakes.rawclients import RawClient, open_tls  # noqa: E402

FLAT_FROM = 5  # the burst whose RSS the later ones are compared with (1-based)
TOLERANCE = 0.10
SETTLE = 3.0  # seconds from the last close to the RSS sample: the proxy trims its heap 1 s after a burst


# ---- the client process ----------------------------------------------------------------------


async def _client(args: argparse.Namespace) -> None:
    """Commands on stdin: `open N` opens N idle TLS connections and prints how many are open; `close` closes
    them (or, with `--close timeout`, waits until the proxy has dropped them) and prints one JSON line."""
    _raise_fd_limit()
    context = ssl.create_default_context(cafile=args.ca)
    gate = asyncio.Semaphore(64)  # handshakes in flight
    stdin = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    async def one() -> RawClient | BaseException:
        async with gate:
            try:
                return await open_tls("127.0.0.1", args.port, context, timeout=60)
            except (OSError, ssl.SSLError, TimeoutError) as exc:
                return exc

    clients: list[RawClient] = []
    while line := (await stdin.readline()).decode().split():
        started = time.monotonic()
        if line[0] == "open":
            results = await asyncio.gather(*(one() for _ in range(int(line[1]))))
            clients = [r for r in results if isinstance(r, RawClient)]
            report = {
                "opened": len(clients),
                "failed": len(results) - len(clients),
                "closed_early": sum(1 for c in clients if c.closed.done()),
            }
        else:
            if args.close == "client":
                for client in clients:
                    if client.transport is not None:
                        client.transport.close()
            await asyncio.wait_for(asyncio.gather(*(asyncio.shield(c.closed) for c in clients)), 120)
            report = {}
        print(json.dumps({**report, "seconds": round(time.monotonic() - started, 2)}), flush=True)


# ---- the measuring process -------------------------------------------------------------------


async def _open_connections(proxy: ProxyProcess) -> int:
    """The proxy's open client connections, from /metrics (this request's own connection excluded)."""
    import aiohttp

    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + "/metrics", ssl=context) as response:
        text = await response.text()
    match = re.search(r"^registry_proxy_connections_open(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    return int(float(match.group(1))) - 1 if match else -1


async def _settled(proxy: ProxyProcess, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while await _open_connections(proxy) > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the proxy still holds connections")
        await asyncio.sleep(0.1)


def burst_sizes(count: int, low: int, high: int) -> list[int]:
    """`count` sizes cycling low .. high in five steps (the same for every loop)."""
    steps = [low + (high - low) * i // 4 for i in range(5)]
    order = [2, 4, 0, 3, 1]  # not monotonic
    return [steps[order[i % 5]] for i in range(count)]


def flatness(rss: list[float]) -> dict:
    """RSS from burst FLAT_FROM on, relative to burst FLAT_FROM's: within +/-TOLERANCE is flat."""
    if len(rss) < FLAT_FROM:
        return {"flat": None}
    base = rss[FLAT_FROM - 1]
    later = rss[FLAT_FROM - 1 :]
    low, high = min(later) / base - 1, max(later) / base - 1
    return {
        f"rss_burst_{FLAT_FROM}_mib": base,
        "rss_last_mib": rss[-1],
        "spread_pct": [round(100 * low, 1), round(100 * high, 1)],
        "flat": low >= -TOLERANCE and high <= TOLERANCE,
    }


async def _command(client: asyncio.subprocess.Process, command: str) -> dict:
    """Send one command to the client process; its JSON answer."""
    client.stdin.write(f"{command}\n".encode())
    await client.stdin.drain()
    line = await asyncio.wait_for(client.stdout.readline(), 300)
    if not line:
        raise RuntimeError("the client process ended early")
    return json.loads(line)


async def _soak(args: argparse.Namespace, loop_name: str, root: Path, ca_file: Path, result: dict) -> None:
    """Fill `result` (kept as it is when the time limit stops the run) with the bursts on `loop_name`."""
    flags = ["--log-level", "warning", "--event-loop", loop_name, "--max-connections", str(args.high + 64)]
    # With --close client every connection is held until the client closes it (a loaded machine takes more than
    # the default 10 s for 3,000 handshakes); with --close timeout the proxy drops them.
    header_timeout = args.header_timeout if args.close == "timeout" else 300.0
    flags += ["--client-header-timeout", f"{header_timeout:g}s", "--keepalive-timeout", f"{header_timeout:g}s"]
    proxy = ProxyProcess(root / loop_name / "data", None, ca_file, *flags, *args.proxy_args)
    await proxy.start()
    client = None
    try:
        probe = ProcessProbe(proxy.process.pid)
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            "--port",
            str(proxy.port),
            "--ca",
            str(proxy.ca_file),
            "--close",
            args.close,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        result.update(rss_start_mib=round(probe.rss_mib(), 1), bursts=[])
        for size in burst_sizes(args.bursts, args.low, args.high):
            opened = await _command(client, f"open {size}")
            held = probe.rss_mib()
            await _command(client, "close")
            await _settled(proxy)
            await asyncio.sleep(SETTLE)
            rss = round(probe.rss_mib(), 1)
            burst = {"connections": size, **opened, "rss_held_mib": round(held, 1), "rss_mib": rss}
            result["bursts"].append(burst)
            print(f"{loop_name}: {burst}", file=sys.stderr, flush=True)
        result.update(flatness([b["rss_mib"] for b in result["bursts"]]))
    finally:
        if client is not None:
            with contextlib.suppress(ProcessLookupError):
                client.kill()
            await client.wait()
        await proxy.stop()


async def _measure(args: argparse.Namespace, result: dict) -> None:
    _raise_fd_limit()  # the proxy inherits it
    import trustme

    with tempfile.TemporaryDirectory(prefix="bench-idle-soak-") as tmp:
        root = Path(tmp)
        ca_file = root / "upstream-ca.pem"  # no upstream is asked; the proxy wants a CA file all the same
        trustme.CA().cert_pem.write_to_path(str(ca_file))
        for loop_name in args.loop or ["uvloop", "asyncio"]:
            await _soak(args, loop_name, root, ca_file, result["loops"].setdefault(loop_name, {}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bursts", type=int, default=20, help="bursts per event loop")
    parser.add_argument("--low", type=int, default=1000, help="connections of the smallest burst")
    parser.add_argument("--high", type=int, default=3000, help="connections of the largest burst")
    parser.add_argument("--loop", action="append", choices=["uvloop", "asyncio"], help="default: both")
    parser.add_argument("--close", choices=["client", "timeout"], default="client", help="who ends the connections")
    parser.add_argument(
        "--header-timeout", type=float, default=2.0, help="--client-header-timeout with --close timeout"
    )
    parser.add_argument("--time-limit", type=float, default=3600.0, help="abort the whole run after this")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", help=argparse.SUPPRESS)
    parser.add_argument("proxy_args", nargs=argparse.REMAINDER, help="-- then flags for registry-proxy serve")
    args = parser.parse_args()
    args.proxy_args = [a for a in args.proxy_args if a != "--"]
    if args.client:
        asyncio.run(_client(args))
        return 0
    result: dict = {"proxy_args": args.proxy_args, "close": args.close, "loops": {}}
    try:
        asyncio.run(asyncio.wait_for(_measure(args, result), args.time_limit))
    except TimeoutError:
        result["aborted"] = f"stopped by --time-limit {args.time_limit:g} s"
        for loop in result["loops"].values():
            loop.update(flatness([b["rss_mib"] for b in loop.get("bursts", [])]))
    print(json.dumps(result, indent=2))
    return 0 if all(loop.get("flat") for loop in result["loops"].values()) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
