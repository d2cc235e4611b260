#!/usr/bin/env python3
"""Issue 23 item 3: warm `:version.json` through deploy/nginx.conf's micro-cache in front of the proxy against
nginx serving the same bytes as a static file, in one run (both nginx with `worker_processes auto`, TLS).

    .venv/bin/python bench/front.py [--seconds 10] [--connections 64] [--rounds 2]

Rounds alternate static and front (the load of the machine moves both alike); it prints and writes to
`bench/results/front.json` the requests/s of each, their ratio (goal: front ≥ 0.7 x static), the CPU seconds
per request of the nginx processes, the requests that reached the proxy during the front's load, and the
load average. Exit code 1 when the ratio misses the goal or any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the proxy, tests.fakes and bench itself

import aiohttp  # noqa: E402

from bench import load  # noqa: E402
from bench.nginx import Nginx as StaticNginx  # noqa: E402
from bench.world import build_world, mirror_path  # noqa: E402
from tests.fakes.nginx import NGINX_ADDRESS  # noqa: E402
from tests.fakes.nginx import Nginx as FrontNginx  # noqa: E402
from tests.fakes.process import ProxyProcess  # noqa: E402
from tests.fakes.signing import stop_gpg_agent  # noqa: E402

GOAL = 0.7
# bench/nginx.py's http-level directives for the static baseline, given to the front too: the comparison is of
# the micro-cache against a static file, not of keep-alive settings (wrk would reconnect every 1,000 requests).
FRONT_TUNING = "    sendfile on;\n    tcp_nopush on;\n    keepalive_requests 1000000;\n"


async def fetch(url: str, context: ssl.SSLContext) -> tuple[int, str, bytes]:
    """Status, nginx's cache status and body of one GET."""
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
        return response.status, response.headers.get("X-Cache-Status", ""), await response.read()


async def measure(url: str, probe: load.ProcessProbe, args: argparse.Namespace) -> dict:
    cpu = probe.cpu_seconds()
    result = (await load.wrk(url, connections=args.connections, threads=2, seconds=args.seconds)).as_dict()
    result["cpu_s_per_request"] = (probe.cpu_seconds() - cpu) / max(1, result["requests"])
    return result


async def run(args: argparse.Namespace, root: Path) -> dict:
    world = await build_world(root, 1 << 10, 1 << 10)
    proxy = ProxyProcess(
        root / "proxy", world.registry.url, world.ca_file, "--plain-http", "--trusted-proxies", NGINX_ADDRESS
    )
    static = StaticNginx(root / "static", world.cert_file, world.key_file)
    front: FrontNginx | None = None
    try:
        await proxy.start()
        front = FrontNginx.shipped(root / "front", world.cert_file, world.key_file, proxy.port)
        front.workers, front.connections = "auto", 4096
        front.server = FRONT_TUNING + front.server  # the static baseline's http-level tuning, nothing more
        await front.start(world.ca_file)
        path = mirror_path(world.small, f"{world.small.version}.json")
        front_url = f"https://127.0.0.1:{front.port}{path}"
        context = world.client_ssl()
        answers = [await fetch(front_url, context) for _ in range(2)]  # the first fills the cache
        assert [a[:2] for a in answers] == [(200, "MISS"), (200, "HIT")], [a[:2] for a in answers]
        static.root.mkdir(parents=True)
        await static.start(world.ca_file)
        static.put(path, answers[1][2])
        static_url = f"https://127.0.0.1:{static.port}{path}"
        probes = {
            "static": load.ProcessProbe(static.process.pid, tree=True),
            "front": load.ProcessProbe(front.process.pid, tree=True),
        }
        proxy_probe = load.ProcessProbe(proxy.process.pid, tree=True)
        rounds = []
        for _ in range(args.rounds):
            served = len(proxy.events("request"))
            proxy_cpu = proxy_probe.cpu_seconds()
            rounds.append(
                {
                    "load_before": os.getloadavg()[0],
                    "static": await measure(static_url, probes["static"], args),
                    "front": await measure(front_url, probes["front"], args),
                    "proxy_requests_during": len(proxy.events("request")) - served,
                    "proxy_cpu_s_during": round(proxy_probe.cpu_seconds() - proxy_cpu, 3),
                }
            )
        return {"rounds": rounds, "seconds": args.seconds, "connections": args.connections}
    finally:
        for server in (static, front):
            if server is not None and server.process is not None:
                await server.stop()
        await proxy.stop()
        stop_gpg_agent(proxy.data_dir / "gnupg")
        await world.registry.stop()
        stop_gpg_agent(root / "gpg")


def report(result: dict) -> bool:
    ok = True
    print(f"warm :version.json, wrk -t2 -c{result['connections']}, {result['seconds']} s each, TLS, nginx workers auto")
    print("| round | load | static req/s | front req/s | front/static | CPU µs/req static | front | proxy reqs |")
    print("|---|---|---|---|---|---|---|---|")
    for index, r in enumerate(result["rounds"], 1):
        static, front = r["static"], r["front"]
        ratio = front["requests_per_s"] / static["requests_per_s"]
        r["ratio"] = round(ratio, 3)
        ok = ok and ratio >= GOAL and static["errors"] == front["errors"] == 0
        print(
            f"| {index} | {r['load_before']:.2f} | {static['requests_per_s']:,.0f} | {front['requests_per_s']:,.0f} "
            f"| {ratio:.2f}x | {static['cpu_s_per_request'] * 1e6:.1f} | {front['cpu_s_per_request'] * 1e6:.1f} "
            f"| {r['proxy_requests_during']} |"
        )
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if load.WRK is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-front-") as tmp:
        result = await run(args, Path(tmp))
    ok = report(result)
    out = ROOT / "bench" / "results" / "front.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
