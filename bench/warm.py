#!/usr/bin/env python3
"""Issue 23 item 1: warm `index.json` and `:version.json` of the proxy against the bare aiohttp app, in one run.

    .venv/bin/python bench/warm.py [--seconds 8] [--rounds 3] [--connections 64] [--workers 2] [--py-spy]
        [--baseline CHECKOUT] [-- PROXY FLAGS]

The proxy runs as shipped (`serve --workers N`, access control, metrics and the access log at their
defaults; the access log goes to a file). The bare app (`bench/bare.py`) is N uvloop processes on one
socket with the proxy's own certificate, answering the proxy's own bytes of both documents from memory.
Rounds alternate the two for each document (`wrk -t2 -cC`), so the load of a shared machine falls on both
alike. Reported per document: the medians of req/s, p99 and the servers' CPU µs per request (all their
processes, from /proc: what the load of the machine barely moves), the ratios proxy / bare (goal: req/s
≥ 0.8, p99 ≤ 2), and the load average. At saturation on 2 cores the req/s ratio follows the inverse ratio of
CPU per request. Results in `bench/results/warm.json`; exit 1 when a request failed.

With `--baseline CHECKOUT` (another checkout of the project, e.g. `git worktree add --detach ../base main`), that
checkout's proxy is served alike and measured in the same rounds ("baseline"): before and after in one run.

With `--py-spy` (`pip install py-spy`), one more wrk run per document is sampled by py-spy in one proxy worker,
and the frames with the largest inclusive share of its samples are printed (and kept in the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import ssl
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the proxy, tests.fakes and bench itself

import aiohttp  # noqa: E402

from bench import load  # noqa: E402
from bench.bare import LOOPS, BareAiohttp  # noqa: E402
from bench.world import archive_document, build_world, mirror_path  # noqa: E402
from tests.fakes.process import ProxyProcess  # noqa: E402
from tests.fakes.signing import stop_gpg_agent  # noqa: E402

GOAL_RATE = 0.8  # proxy req/s >= 0.8 x bare
GOAL_P99 = 2.0  # proxy p99 <= 2 x bare


async def get(url: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
        return response.status, await response.read()


async def measure(url: str, probe: load.ProcessProbe, args: argparse.Namespace) -> dict:
    """One wrk run against `url`, with the CPU its server spent meanwhile and the load average."""
    cpu = probe.cpu_seconds()
    result = (await load.wrk(url, connections=args.connections, threads=2, seconds=args.seconds)).as_dict()
    result["cpu_us_per_request"] = round((probe.cpu_seconds() - cpu) / max(1, result["requests"]) * 1e6, 1)
    result["load_1min"] = os.getloadavg()[0]
    return result


def summary(runs: dict[str, list[dict]]) -> dict:
    """Medians per server, the ratios proxy / bare, and with a baseline its CPU ratio to bare and the proxy's to it."""
    median = {
        server: {field: statistics.median(r[field] for r in rs) for field in ("requests_per_s", "p99_ms", "p50_ms")}
        | {"cpu_us_per_request": statistics.median(r["cpu_us_per_request"] for r in rs)}
        for server, rs in runs.items()
    }
    proxy, bare = median["proxy"], median["bare"]
    baseline = median.get("baseline")
    return {
        "median": median,
        "rate_ratio": proxy["requests_per_s"] / bare["requests_per_s"],
        "p99_ratio": proxy["p99_ms"] / bare["p99_ms"],
        "cpu_ratio": proxy["cpu_us_per_request"] / bare["cpu_us_per_request"],
        "load_1min": [r["load_1min"] for rs in runs.values() for r in rs],
    } | (
        {
            "baseline_cpu_ratio": baseline["cpu_us_per_request"] / bare["cpu_us_per_request"],
            "cpu_vs_baseline": proxy["cpu_us_per_request"] / baseline["cpu_us_per_request"],
        }
        if baseline is not None
        else {}
    )


async def run(args: argparse.Namespace, root: Path) -> dict:
    world = await build_world(root, 1 << 10, 1 << 10)
    proxy = ProxyProcess(root / "proxy", world.registry.url, world.ca_file, "--workers", str(args.workers), *args.flags)
    proxies = {"proxy": proxy}
    if args.baseline is not None:
        baseline = ProxyProcess(root / "base", world.registry.url, world.ca_file, "--workers", str(args.workers))
        baseline.args[baseline.args.index("--workers") + 2 :] = args.flags
        baseline.source = args.baseline
        proxies["baseline"] = baseline
    bare: BareAiohttp | None = None
    try:
        for started in proxies.values():
            await started.start()
        context = ssl.create_default_context(cafile=str(proxy.ca_file))
        documents = {"index.json": "index.json", ":version.json": f"{world.small.version}.json"}
        paths = {label: mirror_path(world.small, name) for label, name in documents.items()}
        bodies = {}
        for started in proxies.values():
            archive = mirror_path(world.small, archive_document(world.small))
            status, _ = await get(started.url + archive, ssl.create_default_context(cafile=str(started.ca_file)))
            assert status == 200, f"archive: {status}"
            for label, path in paths.items():
                for _ in range(2):  # the first request fills the cache
                    status, body = await get(
                        started.url + path, ssl.create_default_context(cafile=str(started.ca_file))
                    )
                assert status == 200, (label, status, body[:200])
                bodies.setdefault(label, body)
        tls = proxy.data_dir / "tls"
        bare = BareAiohttp(root / "bare", tls / "server.pem", tls / "server-key.pem", LOOPS[-1], args.workers)
        for label, path in paths.items():
            bare.put(path, bodies[label])
        await bare.start(proxy.ca_file)
        for label, path in paths.items():
            status, body = await get(bare.url + path, context)
            assert (status, body) == (200, bodies[label]), (label, status)
        assert bare.process is not None
        servers = {name: (started.url, process_probe(started.process)) for name, started in proxies.items()}
        servers["bare"] = (bare.url, process_probe(bare.process))
        results: dict = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "loop": LOOPS[-1],
            "documents": {},
        }
        for label, path in paths.items():
            runs: dict[str, list[dict]] = {server: [] for server in servers}
            for round_ in range(args.rounds):
                order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
                for server in order:
                    url, probe = servers[server]
                    runs[server].append(await measure(url + path, probe, args))
            results["documents"][label] = {"runs": runs, **summary(runs)}
            if args.py_spy:
                for server, (url, probe) in servers.items():
                    worker = probe.pids()[-1]
                    results["documents"][label][f"profile_{server}"] = await profile(url + path, worker, root, args)
        return results
    finally:
        if bare is not None:
            await bare.stop()
        for started in proxies.values():
            await started.stop()
        await world.registry.stop()
        stop_gpg_agent(root / "gpg")


def process_probe(process: asyncio.subprocess.Process | None) -> load.ProcessProbe:
    """The CPU and memory of a started server process and its workers."""
    assert process is not None
    return load.ProcessProbe(process.pid, tree=True)


async def profile(url: str, pid: int, root: Path, args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """py-spy's samples of process `pid` under one more wrk run: the top frames as (frame, inclusive %, self %)."""
    out = root / f"py-spy-{pid}-{os.urandom(4).hex()}.txt"
    spy_binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    seconds = str(max(1, round(args.seconds)))
    argv = ["record", "--pid", str(pid), "--rate", "250", "--duration", seconds, "--format", "raw", "--nonblocking"]
    spy = await asyncio.create_subprocess_exec(
        spy_binary, *argv, "--output", str(out), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await load.wrk(url, connections=args.connections, threads=2, seconds=args.seconds)
    await spy.wait()
    return top_frames(out.read_text(), 40)


def top_frames(collapsed: str, count: int) -> list[tuple[str, float, float]]:
    """From py-spy's collapsed stacks (`frame;frame;... N` per line): the frames with the largest inclusive share
    of the samples, each with its inclusive and self share in %."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        n = int(samples)
        total += n
        frames = [frame.split(" (")[0] + " (" + frame.rsplit("/", 1)[-1] for frame in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    # The frames every sample passes through (the process's start-up, the event loop) say nothing.
    ranked = sorted(((f, n) for f, n in inclusive.items() if n < 0.6 * total), key=lambda item: -item[1])[:count]
    return [(frame, 100 * n / total, 100 * own.get(frame, 0) / total) for frame, n in ranked]


def report(results: dict) -> bool:
    ok = True
    args = results["args"]
    print(
        f"warm metadata, wrk -t2 -c{args['connections']}, {args['rounds']} rounds of {args['seconds']:g} s, "
        f"{args['workers']} workers each, TLS; bare aiohttp on {results['loop']}"
    )
    for label, entry in results["documents"].items():
        median = entry["median"]
        for server in median:
            m = median[server]
            rates = ", ".join(f"{r['requests_per_s']:.0f}" for r in entry["runs"][server])
            print(
                f"  {label:>13} {server:>8}: {m['requests_per_s']:8.0f} req/s, p50 {m['p50_ms']:.2f} ms, "
                f"p99 {m['p99_ms']:.2f} ms, {m['cpu_us_per_request']:6.1f} µs CPU/request  (req/s: {rates})"
            )
        loads = entry["load_1min"]
        print(
            f"  {label:>13} proxy/bare: req/s {entry['rate_ratio']:.2f}x (goal >= {GOAL_RATE}), "
            f"p99 {entry['p99_ratio']:.2f}x (goal <= {GOAL_P99}), CPU/request {entry['cpu_ratio']:.2f}x; "
            f"load {min(loads):.1f}-{max(loads):.1f}"
        )
        if "cpu_vs_baseline" in entry:
            print(
                f"  {label:>13} CPU/request: baseline/bare {entry['baseline_cpu_ratio']:.2f}x, "
                f"proxy/baseline {entry['cpu_vs_baseline']:.2f}x"
            )
        ok = ok and all(r["errors"] == 0 for runs in entry["runs"].values() for r in runs)
        for server in median:
            if f"profile_{server}" in entry:
                print(f"    py-spy, one {server} worker: inclusive % (own %) of its samples")
            for frame, inclusive, own in entry.get(f"profile_{server}", []):
                print(f"      {inclusive:5.1f} % ({own:4.1f} % own)  {frame}")
    if not ok:
        print("  some requests failed (see the JSON)")
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    load.add_round_arguments(parser, seconds=8.0, rounds=3, connections=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--py-spy", action="store_true", help="profile one proxy worker per document")
    parser.add_argument("--baseline", type=Path, help="another checkout of the project, measured in the same rounds")
    parser.add_argument("flags", nargs="*", help="more flags for `proxy serve` (after --)")
    args = parser.parse_args()
    if not load.WRK:
        print("wrk is needed (apt-get install wrk)")
        return 1
    results = await load.in_temp_dir("bench-warm-", args.keep, lambda root: run(args, root))
    ok = report(results)
    load.save_results("warm", results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
