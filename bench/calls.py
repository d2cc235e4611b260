#!/usr/bin/env python3
"""Python and C function calls per warm request: the proxy against the bare aiohttp app, a count no load moves.

    .venv/bin/python bench/calls.py [--seconds 5] [--connections 8] [--functions] [--source CHECKOUT]

The proxy (`serve --workers 1`: access control, metrics and the access log at their defaults) and the bare app
(`bench/bare.py --workers 1`, uvloop, the proxy's own certificate and bytes) each run in one process under
`sys.setprofile`, switched on and off by SIGUSR1 / SIGUSR2 around one `wrk -t1 -cC` run per document; the
calls it counted ('call' and 'c_call' events of the event loop's thread) are divided by the requests wrk made.
Results in `bench/results/calls.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import runpy
import signal
import ssl
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the proxy, tests.fakes and bench itself

COUNTS_ENV = "BENCH_CALLS_FILE"  # the FIFO a counted process writes its counts to on SIGUSR2


def _counted(argv: list[str]) -> None:
    """Run `argv` (`-m MODULE ARGS` or `SCRIPT ARGS`) in this process, counting its calls while switched on."""
    counts = {"call": 0, "c_call": 0}
    functions: Counter[str] = Counter()
    out = Path(os.environ[COUNTS_ENV])

    def profile(frame, event: str, arg) -> None:
        if event == "call":
            counts["call"] += 1
            code = frame.f_code
            functions[f"{Path(code.co_filename).stem}:{code.co_qualname}"] += 1
        elif event == "c_call":
            counts["c_call"] += 1
            functions[f"C {getattr(arg, '__qualname__', arg)}"] += 1

    collections = {"gc_runs": [0, 0, 0], "gc_seconds": [0.0, 0.0, 0.0]}
    began = [0.0]

    def collected(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections["gc_runs"][info["generation"]] += 1
            collections["gc_seconds"][info["generation"]] += time.perf_counter() - began[0]

    def start(*_) -> None:
        counts.update(call=0, c_call=0)
        functions.clear()
        collections.update(gc_runs=[0, 0, 0], gc_seconds=[0.0, 0.0, 0.0])
        gc.callbacks.append(collected)
        sys.setprofile(profile)

    def stop(*_) -> None:
        sys.setprofile(None)
        gc.callbacks.remove(collected)
        out.write_text(json.dumps({**counts, **collections, "functions": functions.most_common(400)}))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    if argv[0] == "-m":
        sys.path.insert(0, os.getcwd())  # as `python -m` has it: the checkout it runs in first
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


async def _count(url: str, pid: int, out: Path, connections: int, seconds: float) -> dict:
    """One wrk run against `url` while process `pid` counts its calls: the calls per request."""
    from bench import load

    os.mkfifo(out)  # the counts come through it: read once the process has written them all
    os.kill(pid, signal.SIGUSR1)
    result = await load.wrk(url, connections=connections, threads=1, seconds=seconds)
    os.kill(pid, signal.SIGUSR2)
    counts = json.loads(await asyncio.to_thread(out.read_text))
    os.unlink(out)
    requests = max(1, result.requests)
    return {
        "requests": result.requests,
        "errors": result.errors,
        "python_calls_per_request": round(counts["call"] / requests, 1),
        "c_calls_per_request": round(counts["c_call"] / requests, 1),
        # the garbage collector's runs per 1,000 requests by generation, and its µs per request (slowed by the count)
        "gc_runs_per_1000": [round(n * 1000 / requests, 2) for n in counts["gc_runs"]],
        "gc_us_per_request": round(sum(counts["gc_seconds"]) / requests * 1e6, 2),
        # the functions called at least once per 10 requests, with their calls per request
        "functions": [(name, round(n / requests, 2)) for name, n in counts["functions"] if n * 10 >= requests],
    }


async def run(args: argparse.Namespace, root: Path) -> dict:
    from bench.bare import BareAiohttp
    from bench.warm import get
    from bench.world import archive_document, build_world, mirror_path
    from tests.fakes.process import ProxyProcess
    from tests.fakes.signing import stop_gpg_agent

    world = await build_world(root, 1 << 10, 1 << 10)
    proxy = ProxyProcess(root / "proxy", world.registry.url, world.ca_file)
    proxy.args[1:1] = [__file__, "--child"]  # `python bench/calls.py --child -m proxy serve ...`
    if args.source is not None:
        proxy.source = args.source
    counts = {"proxy": root / "proxy-calls.json", "bare": root / "bare-calls.json"}
    bare: BareAiohttp | None = None
    os.environ[COUNTS_ENV] = str(counts["proxy"])
    try:
        await proxy.start()
        context = ssl.create_default_context(cafile=str(proxy.ca_file))
        paths = {
            "index.json": mirror_path(world.small, "index.json"),
            ":version.json": mirror_path(world.small, f"{world.small.version}.json"),
        }
        status, _ = await get(proxy.url + mirror_path(world.small, archive_document(world.small)), context)
        assert status == 200, f"archive: {status}"
        bodies = {}
        for label, path in paths.items():
            for _ in range(2):  # the first request fills the cache
                status, body = await get(proxy.url + path, context)
            assert status == 200, (label, status, body[:200])
            bodies[label] = body
        tls = proxy.data_dir / "tls"
        wrapper = (__file__, "--child")
        bare = BareAiohttp(root / "bare", tls / "server.pem", tls / "server-key.pem", "uvloop", 1, wrapper)
        for label, path in paths.items():
            bare.put(path, bodies[label])
        os.environ[COUNTS_ENV] = str(counts["bare"])
        await bare.start(proxy.ca_file)
        assert bare.process is not None and proxy.process is not None
        pids = {"proxy": (proxy.url, proxy.process.pid), "bare": (bare.url, bare.process.pid)}
        results: dict = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "documents": {},
        }
        for label, path in paths.items():
            results["documents"][label] = {
                server: await _count(url + path, pid, counts[server], args.connections, args.seconds)
                for server, (url, pid) in pids.items()
            }
        return results
    finally:
        if bare is not None:
            await bare.stop()
        await proxy.stop()
        await world.registry.stop()
        stop_gpg_agent(root / "gpg")


def report(results: dict) -> None:
    args = results["args"]
    print(f"function calls per warm request (sys.setprofile, one process each, wrk -t1 -c{args['connections']})")
    for label, servers in results["documents"].items():
        for server, entry in servers.items():
            print(
                f"  {label:>13} {server:>5}: {entry['python_calls_per_request']:6.1f} Python / "
                f"{entry['c_calls_per_request']:6.1f} C calls per request ({entry['requests']} requests); "
                f"gc runs per 1,000 requests {entry['gc_runs_per_1000']}, {entry['gc_us_per_request']} µs/request"
            )
            if args["functions"]:
                for name, per_request in entry["functions"]:
                    print(f"      {per_request:6.2f}  {name}")


async def main() -> int:
    from bench import load

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument("--functions", action="store_true", help="list the functions called per request")
    parser.add_argument("--source", type=Path, help="count the proxy of another checkout of the project (e.g. main)")
    args = parser.parse_args()
    if not load.WRK:
        print("wrk is needed (apt-get install wrk)")
        return 1
    results = await load.in_temp_dir("bench-calls-", args.keep, lambda root: run(args, root))
    report(results)
    load.save_results("calls", results)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _counted(sys.argv[2:])
    else:
        sys.exit(asyncio.run(main()))
