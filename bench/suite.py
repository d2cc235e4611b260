"""The benchmark suite: five measurements of real proxy processes, each next to a baseline.

1. cold fan-out: peak RSS while 10 clients fetch a 200 MiB archive from an empty proxy;
2. warm `index.json` / `:version.json` requests per second and latency (wrk, else aiohttp),
   the proxy with its embedded store (1 and `--workers` N worker processes), the proxy with
   Redis, nginx, and the ceiling: a bare aiohttp app answering the same bytes (asyncio, uvloop);
3. warm archive throughput, 8 connections (wrk) and 1 and 4 clients (curl, else aiohttp),
   the proxy with 1 and N workers, peak RSS per worker;
4. `terraform init` through the proxy: cold, warm, and from a static mirror (nginx);
5. cold fleet fan-out: 100 clients split across two replicas (each with `--fleet-workers`
   worker processes) sharing Redis and a data dir, upstream GETs per artifact;
6. warm archive throughput by archive store and policy: a proxy with `--workers` N per setup (archive
   store on disk or in S3 on moto's server over HTTPS, with or without a policy) against nginx, interleaved;
7. (`--only init-wan`) cold `terraform init` across a WAN: every upstream answer delayed by
   `--upstream-latency`, through an empty proxy (network mirror, `host` block) against direct.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import secrets
import shutil
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench import load
from bench.bare import LOOPS, ArchiveServe, BareAiohttp
from bench.load import MIB, ProcessProbe, RssSampler
from bench.nginx import NGINX, Nginx, nginx_version
from bench.wan import Step, WanRun, connection_steps, process_cpu_seconds, proxy_steps, render, upstream_steps
from bench.world import PLATFORM, World, archive_document, build_world, mirror_path, policy_text
from proxy.settings.values import format_duration, parse_duration
from proxy.web.archive_responses import CHUNK
from proxy.web.server import WRITE_BUFFER_HIGH
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, TERRAFORM, ProxyProcess, Terraform
from tests.fakes.redis_server import RedisServer
from tests.fakes.s3_server import CREDENTIALS, S3Server
from tests.fakes.signing import stop_gpg_agent
from tests.fakes.wan_relay import WanRelay

REDIS_SERVER = shutil.which("redis-server")

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "latest.json"
PHASES = ("cold", "archive", "stores", "fleet", "json", "init-big", "init-small")  # a default run
STORE_SETUPS = ("disk", "disk+policy", "s3", "s3+policy")  # benchmark 6: archive store, policy or none
STORE_POLICY_RULES = 50  # the policy of benchmark 6: rules of every kind (`bench.world.policy_text`)
ON_REQUEST = ("init-cold", "init-wan")  # only when asked for
CEILINGS = {"ceiling_hashed": True, "ceiling_plain": False}  # benchmark 3's bare aiohttp file servers: BLAKE3 or not
INIT_MODES = ("direct", "mirror", "host")  # straight from the upstream; through a network mirror; `host` block


@dataclass
class Row:
    metric: str
    proxy: str
    baseline: str = "-"
    ratio: str = "-"
    note: str = ""
    proxy_workers: str = "-"  # the proxy with `--workers` N processes
    ratio_workers: str = "-"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}x"


def _nginx_row(metric: str, key: str, own: dict, nginx: dict, note: str = "") -> Row:
    """A row of `own[key]` against nginx's `nginx[key]` (CPU s per GiB with two decimals, MiB/s with none)."""
    shown = "{:.2f}" if key == "wrk8_cpu_s_per_gib" else "{:.0f}"
    baseline = f"{shown.format(nginx[key])} (nginx)" if key in nginx else "-"
    return Row(metric, shown.format(own[key]), baseline, _ratio(own[key], nginx.get(key)), note)


def _main_tf(release: Release) -> str:
    source = f"{REGISTRY_HOST}/{release.namespace}/{release.type}"
    return (
        f'terraform {{\n  required_providers {{\n    {release.type} = {{\n      source  = "{source}"\n'
        f'      version = "{release.version}"\n    }}\n  }}\n}}\n'
    )


def _cli_config(base_url: str, plugin_cache: Path) -> str:
    return (
        f'plugin_cache_dir = "{plugin_cache}"\n'
        f'provider_installation {{\n  network_mirror {{\n    url = "{base_url}/mirror/v1/"\n  }}\n}}\n'
    )


def _host_cli_config(providers_url: str, plugin_cache: Path) -> str:
    """A `host` block naming the registry's `providers.v1` (straight to the fake upstream, no proxy, it
    stands in for its discovery; through the proxy, its registry pass-through)."""
    return (
        f'plugin_cache_dir = "{plugin_cache}"\n'
        f'host "{REGISTRY_HOST}" {{\n  services = {{\n'
        f'    "providers.v1" = "{providers_url}"\n  }}\n}}\n'
    )


def _init_cli_config(mode: str, base_url: str, plugin_cache: Path) -> str:
    """The CLI config of an init in `mode` (`INIT_MODES`) against the server at `base_url`."""
    if mode == "direct":
        return _host_cli_config(f"{base_url}/v1/providers/", plugin_cache)
    if mode == "host":
        return _host_cli_config(f"{base_url}/registry/{REGISTRY_HOST}/providers/v1/", plugin_cache)
    return _cli_config(base_url, plugin_cache)


async def _get(url: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
        return response.status, await response.read()


async def _version_of(*command: str) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    output, _ = await process.communicate()
    lines = output.decode().strip().splitlines()
    return " ".join(lines[0].split()[:2]) if lines else None


async def _redis_version() -> str | None:
    """`redis-server --version` prints "Redis server v=7.0.15 sha=... bits=64 build=..."."""
    if REDIS_SERVER is None:
        return None
    process = await asyncio.create_subprocess_exec(
        REDIS_SERVER, "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    output, _ = await process.communicate()
    version = next((word[2:] for word in output.decode().split() if word.startswith("v=")), "?")
    return f"redis-server {version}"


class Suite:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.rows: list[Row] = []
        self.checks: list[dict] = []
        self.notes: list[str] = []
        self.results: dict = {}
        self.world: World | None = None
        self.nginx: Nginx | None = None
        self.redis: RedisServer | None = None
        self.redis_args: tuple[str, ...] = ()  # a proxy on that Redis: URL, prefix, metadata secret, lock TTL
        self.terraform = Terraform(root / "tf")
        self._workdirs = 0
        self.last_init_started = 0.0
        self.wan: WanRelay | None = None  # benchmark 7's WAN relay while it runs

    # ---- bookkeeping ---------------------------------------------------------------------------

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        if not ok:
            print(f"CHECK FAILED: {name}: {detail}", file=sys.stderr)
        return ok

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"note: {text}", file=sys.stderr)

    @staticmethod
    def progress(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    # ---- the run -------------------------------------------------------------------------------

    async def run(self) -> None:
        args = self.args
        self.results["meta"] = await self._meta()
        async with contextlib.AsyncExitStack() as stack:
            self.progress(f"building releases ({args.size_mib} MiB random archive), key, CA, fake registry")
            stack.callback(stop_gpg_agent, self.root / "gpg")
            world = self.world = await build_world(self.root, args.size_mib * MIB, args.fleet_mib * MIB)
            stack.push_async_callback(world.registry.stop)
            await self._start_nginx(stack)

            only = set(args.only or PHASES)
            if only & {"cold", "archive", "fleet", "json", "init-big"}:
                await self._proxies_phases(stack, only)
            elif "stores" in only:
                await self.archive_stores(stack)
            if "init-small" in only:
                await self.init_small(stack)
            if "init-cold" in only:
                await self.init_cold(stack)
            if "init-wan" in only:
                await self.init_wan(stack)

    async def _proxies_phases(self, stack: contextlib.AsyncExitStack, only: set[str]) -> None:
        """Benchmarks 1, 3, 6, 5, 2 and 4b (those of `only`): the proxy with 1 and with N workers, then 6's own."""
        args = self.args
        proxy = await self._start_proxy(stack, "proxy-a")
        probe = ProcessProbe(proxy.process.pid)
        if "cold" in only:
            await self.cold_fanout(proxy, probe)
        elif only & {"archive", "init-big"}:
            await self._fetch_big(proxy, "the proxy")
        workers = None
        if only & {"archive", "json"}:
            self.progress(f"starting the proxy with --workers {args.workers} (and caching the big archive in it)")
            workers = await self._start_proxy(stack, "proxy-workers", "--workers", str(args.workers))
        if "archive" in only:
            await self._fetch_big(workers, "the N-worker proxy")
            await self.warm_archive(
                {"proxy": (proxy, probe), "proxy_workers": (workers, ProcessProbe(workers.process.pid, tree=True))}
            )
        if only & {"archive", "stores"}:
            await self.archive_stores(stack)
        fleet = await self._start_fleet(stack) if only & {"fleet", "json"} else None
        redis_proxy = None
        if fleet is not None:
            if "fleet" in only:
                await self.fleet_cold(*fleet)
            for replica in fleet:
                await replica.stop()
            redis_proxy = await self._start_proxy(
                stack, "proxy-redis", *self.redis_args, data_dir=self.root / "fleet" / "data"
            )
        if "json" in only:
            await self.warm_json(proxy, probe, workers, redis_proxy)
        if workers is not None:
            await workers.stop()
        if "init-big" in only:
            await self.init_big_warm(proxy)
        self.results["proxy_a_final_peak_rss_mib"] = round(probe.peak_mib(), 1)
        await proxy.stop()
        if redis_proxy is not None:
            await redis_proxy.stop()

    async def _meta(self) -> dict:
        import aiohttp as aiohttp_module

        return {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "python": sys.version.split()[0],
            "aiohttp": aiohttp_module.__version__,
            "wrk": await _version_of("wrk", "-v") if load.WRK else None,
            "curl": await _version_of("curl", "--version") if load.CURL else None,
            "nginx": await nginx_version(),
            "redis": await _redis_version(),
            "terraform": await _version_of(TERRAFORM, "version") if TERRAFORM else None,
            "archive_mib": self.args.size_mib,
            "workers": self.args.workers,
            "bare_aiohttp_loops": list(LOOPS),
            "json_load": {
                "connections": self.args.connections,
                "seconds": self.args.json_seconds,
                "tool": "wrk" if self._use_wrk else "aiohttp",
            },
            "download_client": "curl" if load.CURL else "aiohttp",
            "fleet": {
                "clients": self.args.fleet_clients,
                "archive_mib": self.args.fleet_mib,
                "upstream_chunk_delay_s": self.args.fleet_chunk_delay,
                "fleet_lock_ttl": self.args.fleet_lock_ttl,
                "workers_per_replica": self.args.fleet_workers,
            },
        }

    @property
    def _use_wrk(self) -> bool:
        return load.WRK is not None and not self.args.no_wrk

    async def _start_nginx(self, stack: contextlib.AsyncExitStack) -> None:
        if self.args.no_nginx:
            self.note("nginx baseline disabled (--no-nginx)")
            return
        if NGINX is None:
            self.note("nginx is not installed: no nginx baseline (apt-get install nginx-light)")
            return
        world = self.world
        nginx = Nginx(self.root / "nginx", world.cert_file, world.key_file)
        nginx.root.mkdir(parents=True)
        await nginx.start(world.ca_file)
        stack.push_async_callback(nginx.stop)
        nginx.put(mirror_path(world.big, archive_document(world.big)), world.big_zip)
        for name in world.small.platforms:
            nginx.put(mirror_path(world.small, archive_document(world.small, name)), world.small.zips[name])
        self.nginx = nginx

    async def _start_proxy(
        self,
        stack: contextlib.AsyncExitStack,
        name: str,
        *extra: str,
        data_dir: Path | None = None,
        upstream: str | None = None,
        source: Path | None = None,
    ) -> ProxyProcess:
        """A proxy process of this checkout (or of `source`), its upstream the fake registry (or `upstream`)."""
        proxy = ProxyProcess(
            data_dir or self.root / name / "data",
            upstream or self.world.registry.url,
            self.world.ca_file,
            "--log-level",
            "warning",
            *extra,
        )
        if source is not None:
            proxy.source = source
        stack.callback(stop_gpg_agent, proxy.data_dir / "gnupg")  # the proxy's keyring, after it stopped
        await proxy.start()
        stack.push_async_callback(proxy.stop)
        return proxy

    async def _start_fleet(self, stack: contextlib.AsyncExitStack) -> tuple[ProxyProcess, ProxyProcess] | None:
        """redis-server, then replicas A and B sharing it and one data dir (B reuses A's generated CA)."""
        if self.args.no_redis:
            self.note("Redis benchmarks disabled (--no-redis): no fleet fan-out, no Redis JSON numbers")
            return None
        if REDIS_SERVER is None:
            self.note(
                "redis-server is not installed: the fleet fan-out and Redis JSON benchmarks are SKIPPED "
                "(apt-get install redis-server)"
            )
            return None
        redis = RedisServer(self.root / "redis")
        await asyncio.to_thread(redis.start)
        stack.callback(redis.stop)  # after the replicas stopped (the stack unwinds in reverse)
        self.redis = redis
        self.redis_args = (
            "--redis-url",
            redis.url,
            "--redis-prefix",
            "bench-fleet",
            "--metadata-secret",
            secrets.token_hex(32),
            "--fleet-lock-ttl",
            self.args.fleet_lock_ttl,
        )
        extra = (*self.redis_args, "--workers", str(self.args.fleet_workers))
        data_dir = self.root / "fleet" / "data"
        first = await self._start_proxy(stack, "fleet-a", *extra, data_dir=data_dir)
        second = await self._start_proxy(stack, "fleet-b", *extra, data_dir=data_dir)
        return first, second

    # ---- 1. cold fan-out -----------------------------------------------------------------------

    async def cold_fanout(self, proxy: ProxyProcess, probe: ProcessProbe) -> None:
        world, clients = self.world, self.args.clients
        self.progress(f"1. cold fan-out: {clients} clients x {self.args.size_mib} MiB from an empty proxy")
        release = world.big
        url = proxy.url + mirror_path(release, archive_document(release))
        context = ssl.create_default_context(cafile=str(proxy.ca_file))
        idle = probe.rss_mib()
        resettable = probe.reset_peak()
        cpu = probe.cpu_seconds()
        start = asyncio.Barrier(clients)
        with RssSampler(probe) as sampler:
            downloads = await asyncio.wait_for(
                asyncio.gather(
                    *(load.download_aiohttp(url, context, hash_body=True, start=start) for _ in range(clients))
                ),
                240,
            )
        peak = probe.peak_mib()
        cpu = probe.cpu_seconds() - cpu
        expected_sha, expected_size = release.sha256(PLATFORM), len(release.zips[PLATFORM])
        upstream_gets = world.registry.count(world.registry.archive_path(release, PLATFORM))
        self.check(
            "cold: every client got 200", all(d.status == 200 for d in downloads), str([d.status for d in downloads])
        )
        self.check(
            "cold: every body has the right size and sha256",
            all(d.size == expected_size and d.sha256 == expected_sha for d in downloads),
        )
        self.check("cold: upstream saw exactly one GET of the archive", upstream_gets == 1, f"{upstream_gets} GETs")
        wall = max(d.seconds for d in downloads)
        first_bytes = [d.first_byte_s for d in downloads]
        self.results["cold_fanout"] = {
            "clients": clients,
            "archive_bytes": expected_size,
            "upstream_archive_gets": upstream_gets,
            "idle_rss_mib": round(idle, 1),
            "peak_rss_mib": round(peak, 1),
            "peak_rss_source": "VmHWM (reset before the phase)" if resettable else "VmHWM (since process start)",
            "sampled_max_rss_mib": round(sampler.max_mib, 1),
            "rss_samples": sampler.samples,
            "wall_s": round(wall, 3),
            "first_byte_s": [round(t, 3) for t in first_bytes],
            "per_client_s": [round(d.seconds, 3) for d in downloads],
            "proxy_cpu_s": round(cpu, 2),
        }
        self.rows.append(
            Row(
                f"cold {clients}x{self.args.size_mib} MiB: proxy peak RSS",
                f"{peak:.0f} MiB",
                note=f"idle {idle:.0f} MiB (+{peak - idle:.0f}); sampled max {sampler.max_mib:.0f} MiB",
            )
        )
        self.rows.append(
            Row(
                f"cold {clients}x{self.args.size_mib} MiB: wall time",
                f"{wall:.1f} s",
                note=f"first byte {min(first_bytes):.1f}-{max(first_bytes):.1f} s; "
                f"upstream GETs {upstream_gets}; proxy CPU {cpu:.1f} s",
            )
        )

    # ---- 5. cold fleet fan-out ----------------------------------------------------------------

    async def fleet_cold(self, first: ProxyProcess, second: ProxyProcess) -> None:
        world, registry, args = self.world, self.world.registry, self.args
        clients, release = args.fleet_clients, world.mid
        self.progress(
            f"5. cold fleet fan-out: {clients} clients x {args.fleet_mib} MiB split across replicas A and B "
            f"({args.fleet_workers} workers each, one Redis, one data dir), upstream delay "
            f"{args.fleet_chunk_delay} s per 256 KiB"
        )
        url_path = mirror_path(release, archive_document(release))
        context = ssl.create_default_context(cafile=str(first.ca_file))  # the same CA for both
        files = f"/files/{release.namespace}/{release.type}/{release.version}"
        provider = f"/v1/providers/{release.namespace}/{release.type}"
        os_, arch = PLATFORM.split("_")
        upstream_paths = {
            "archive": registry.archive_path(release, PLATFORM),
            "sha256sums": f"{files}/{release.shasums_name}",
            "signature": f"{files}/{release.shasums_name}.sig",
            "versions": f"{provider}/versions",
            "download": f"{provider}/{release.version}/download/{os_}/{arch}",
            "discovery": "/.well-known/terraform.json",
        }
        before = {name: registry.count(path) for name, path in upstream_paths.items()}
        replicas = {"A": first, "B": second}
        probes = {name: ProcessProbe(proxy.process.pid, tree=True) for name, proxy in replicas.items()}
        cpu, idle = {}, {}
        for name, probe in probes.items():
            idle[name] = probe.rss_mib()
            probe.reset_peak()
            cpu[name] = probe.cpu_seconds()
        assignment = ["A" if n % 2 == 0 else "B" for n in range(clients)]
        redis_calls = await load.redis_command_calls(self.redis.port)
        start = asyncio.Barrier(clients)
        registry.archive_chunk_delay = args.fleet_chunk_delay
        try:
            downloads = await asyncio.wait_for(
                asyncio.gather(
                    *(
                        load.download_aiohttp(replicas[name].url + url_path, context, hash_body=True, start=start)
                        for name in assignment
                    )
                ),
                180,
            )
        finally:
            registry.archive_chunk_delay = 0.0
        gets = {name: registry.count(path) - before[name] for name, path in upstream_paths.items()}
        redis_calls = await load.redis_command_calls(self.redis.port) - redis_calls
        expected_sha, expected_size = release.sha256(PLATFORM), len(release.zips[PLATFORM])
        ok = self.check(
            f"fleet: all {clients} clients got 200",
            all(d.status == 200 for d in downloads),
            str(sorted({d.status for d in downloads})),
        )
        ok &= self.check(
            f"fleet: all {clients} bodies have the right size and sha256",
            all(d.size == expected_size and d.sha256 == expected_sha for d in downloads),
            f"{sum(d.sha256 != expected_sha for d in downloads)} wrong",
        )
        self.check(
            "fleet: upstream saw exactly one GET of the archive", gets["archive"] == 1, f"{gets['archive']} GETs"
        )
        wall = max(d.seconds for d in downloads)
        first_bytes = {
            name: [d.first_byte_s for d, n in zip(downloads, assignment, strict=True) if n == name] for name in replicas
        }
        chunks = -(-expected_size // (256 * 1024))
        per_replica = {
            name: {
                "clients": assignment.count(name),
                "idle_rss_mib": round(idle[name], 1),
                "peak_rss_mib": round(probes[name].peak_mib(), 1),
                "peak_rss_mib_each": [round(v, 1) for v in probes[name].peak_mib_each().values()],
                "cpu_s": round(probes[name].cpu_seconds() - cpu[name], 2),
                "first_byte_s": [round(min(first_bytes[name]), 3), round(max(first_bytes[name]), 3)],
            }
            for name in replicas
        }
        self.results["fleet_cold"] = {
            "clients": clients,
            "replicas": 2,
            "workers_per_replica": args.fleet_workers,
            "archive_bytes": expected_size,
            "upstream_chunk_delay_s": args.fleet_chunk_delay,
            "upstream_min_transfer_s": round(chunks * args.fleet_chunk_delay, 2),
            "upstream_gets": gets,
            "redis_commands": redis_calls,
            "wall_s": round(wall, 3),
            "per_client_s": [round(d.seconds, 3) for d in downloads],
            "per_replica": per_replica,
        }
        fb = "; ".join(
            f"{name} {v['first_byte_s'][0]:.1f}-{v['first_byte_s'][1]:.1f} s" for name, v in per_replica.items()
        )
        self.rows.append(
            Row(
                f"cold fleet {clients}x{args.fleet_mib} MiB, 2 replicas x {args.fleet_workers} workers + Redis: wall",
                f"{wall:.1f} s",
                note=f"first byte {fb}; upstream sends it in >= {chunks * args.fleet_chunk_delay:.1f} s; "
                f"CPU A {per_replica['A']['cpu_s']:.1f} s, B {per_replica['B']['cpu_s']:.1f} s",
            )
        )
        self.rows.append(
            Row(
                "cold fleet: peak RSS per replica (its processes summed)",
                " / ".join(f"{v['peak_rss_mib']:.0f}" for v in per_replica.values()) + " MiB",
                note="A / B; idle "
                + " / ".join(f"{v['idle_rss_mib']:.0f}" for v in per_replica.values())
                + f" MiB; {clients // 2} clients each; max per worker (goal < 150 MiB) "
                + " / ".join(f"{max(v['peak_rss_mib_each'][1:]):.0f}" for v in per_replica.values())
                + " MiB",
            )
        )
        self.rows.append(
            Row(
                "cold fleet: upstream GETs archive / SUMS / versions",
                f"{gets['archive']} / {gets['sha256sums']} / {gets['versions']}",
                note=f"SUMS.sig {gets['signature']}, download doc {gets['download']}, "
                f"discovery {gets['discovery']} (an archive request needs no version list); "
                f"all {clients} got 200 + right sha256: {'yes' if ok else 'NO'}",
            )
        )

    # ---- 3. warm archive throughput ------------------------------------------------------------

    async def _fetch_big(self, proxy: ProxyProcess, label: str) -> None:
        """One download of the big archive through `proxy`, so that it has it cached."""
        release = self.world.big
        context = ssl.create_default_context(cafile=str(proxy.ca_file))
        download = await load.download_aiohttp(
            proxy.url + mirror_path(release, archive_document(release)), context, hash_body=True
        )
        self.check(
            f"big archive cached in {label}: 200 and the right sha256",
            download.status == 200 and download.sha256 == release.sha256(PLATFORM),
            str(download.status),
        )

    async def _throughput(self, targets: dict[str, tuple[str, Path, ProcessProbe | None]]) -> dict[str, dict]:
        """Download the big archive from each target: wrk with 8 connections for `--archive-seconds` (and the
        server's CPU seconds per GiB, when it is a process of ours), then 1 and 4 whole downloads (curl);
        `repeats` rounds, interleaved."""
        registry, size = self.world.registry, len(self.world.big.zips[PLATFORM])
        archive_path = registry.archive_path(self.world.big, PLATFORM)
        runs: dict[str, dict] = {name: {"wrk8": [], "cpu_gib": [], 1: [], 4: []} for name in targets}
        upstream_gets = dict.fromkeys(targets, 0)
        for _ in range(self.args.repeats):  # interleaved, so the machine's drift hits every target alike
            for name, (url, ca_file, probe) in targets.items():
                before = registry.count(archive_path)
                if self._use_wrk:
                    cpu = probe.cpu_seconds() if probe is not None else 0.0
                    measured = await load.wrk_throughput(url, connections=8, seconds=self.args.archive_seconds)
                    self.check(
                        f"warm archive from {name}, wrk -c8: no errors",
                        measured.errors == 0,
                        f"{measured.errors} errors",
                    )
                    runs[name]["wrk8"].append(measured.mib_per_s)
                    if probe is not None:
                        gib = measured.mib_per_s * measured.seconds / 1024
                        runs[name]["cpu_gib"].append((probe.cpu_seconds() - cpu) / gib)
                context = ssl.create_default_context(cafile=str(ca_file))
                for clients in (1, 4):
                    wall, downloads = await asyncio.wait_for(
                        load.parallel_downloads(url, ca_file, context, clients), 240
                    )
                    ok = all(d.status == 200 and d.size == size for d in downloads)
                    self.check(
                        f"warm archive from {name} x{clients}: 200 and full size",
                        ok,
                        str([(d.status, d.size) for d in downloads]),
                    )
                    runs[name][clients].append(clients * size / wall / MIB)
                upstream_gets[name] += registry.count(archive_path) - before
        results = {}
        for name, r in runs.items():
            results[name] = {
                "upstream_archive_gets": upstream_gets[name],
                "single_mib_s": round(statistics.median(r[1]), 1),
                "concurrent4_mib_s": round(statistics.median(r[4]), 1),
                "single_runs": [round(v, 1) for v in r[1]],
                "concurrent4_runs": [round(v, 1) for v in r[4]],
            }
            if r["wrk8"]:
                results[name]["wrk8_mib_s"] = round(statistics.median(r["wrk8"]), 1)
                results[name]["wrk8_runs"] = [round(v, 1) for v in r["wrk8"]]
            if r["cpu_gib"]:
                results[name]["wrk8_cpu_s_per_gib"] = round(statistics.median(r["cpu_gib"]), 2)
        return results

    async def warm_archive(self, proxies: dict[str, tuple[ProxyProcess, ProcessProbe]]) -> None:
        """The proxy with 1 and with N workers, nginx, the fake registry (aiohttp from memory), and the ceiling
        of a serve on the proxy's stack: bare aiohttp with N workers streaming the file, hashed and not."""
        async with contextlib.AsyncExitStack() as stack:
            await self._warm_archive(proxies, await self._start_ceilings(stack))

    async def _start_ceilings(self, stack: contextlib.AsyncExitStack) -> dict[str, BareAiohttp]:
        """Bare aiohttp with `--workers` N on uvloop (as the proxy's), streaming the big archive's file in the
        proxy's chunks with its write-buffer limit, BLAKE3 on every chunk or none (`bench.bare`)."""
        world, servers = self.world, {}
        path = mirror_path(world.big, archive_document(world.big))
        loop = "uvloop" if "uvloop" in LOOPS else "asyncio"
        if loop != "uvloop":
            self.note("uvloop is not installed: the archive ceiling runs on asyncio, the proxy's workers do not")
        for name, hashed in CEILINGS.items():
            archive = ArchiveServe(path, CHUNK, WRITE_BUFFER_HIGH, hashed=hashed)
            bare = BareAiohttp(
                self.root / name, world.cert_file, world.key_file, loop, self.args.workers, archive=archive
            )
            bare.put(path, world.big_zip)
            await bare.start(world.ca_file)
            stack.push_async_callback(bare.stop)
            servers[name] = bare
            download = await load.download_aiohttp(bare.url + path, world.client_ssl(), hash_body=True)
            self.check(
                f"{name}: the big archive, 200 and the right sha256",
                download.status == 200 and download.sha256 == world.big.sha256(PLATFORM),
                str(download.status),
            )
        return servers

    async def _warm_archive(
        self, proxies: dict[str, tuple[ProxyProcess, ProcessProbe]], ceilings: dict[str, BareAiohttp]
    ) -> None:
        world = self.world
        client = "curl" if load.CURL else "aiohttp"
        self.progress(
            f"3. warm archive throughput ({'wrk -c8, ' if self._use_wrk else ''}{client} 1 and 4 clients; "
            f"{self.args.repeats} rounds)"
        )
        path = mirror_path(world.big, archive_document(world.big))
        targets = {name: (proxy.url + path, proxy.ca_file, probe) for name, (proxy, probe) in proxies.items()}
        if self.nginx is not None:
            targets["nginx"] = (self.nginx.url + path, world.ca_file, ProcessProbe(self.nginx.process.pid, tree=True))
        for name, bare in ceilings.items():
            targets[name] = (bare.url + path, world.ca_file, ProcessProbe(bare.process.pid, tree=True))
        targets["fake_registry_aiohttp"] = (
            world.registry.url + world.registry.archive_path(world.big, PLATFORM),
            world.ca_file,
            None,
        )  # it runs in this process, with the clients
        cpu = {}
        for name, (_, probe) in proxies.items():
            probe.reset_peak()
            cpu[name] = probe.cpu_seconds()
        result: dict = {"client": client, **await self._throughput(targets)}
        for name, (_, probe) in proxies.items():  # each idles while the others serve
            result[name]["peak_rss_mib"] = round(probe.peak_mib(), 1)
            result[name]["peak_rss_mib_each"] = [round(v, 1) for v in probe.peak_mib_each().values()]
            result[name]["cpu_s"] = round(probe.cpu_seconds() - cpu[name], 2)
            gets = result[name]["upstream_archive_gets"]
            self.check(f"warm archive: {name} made no upstream request", gets == 0, f"{gets} archive GETs upstream")
        self.results["warm_archive"] = result
        self._archive_rows(result, client)

    def _archive_rows(self, result: dict, client: str) -> None:
        nginx, reference = result.get("nginx", {}), result["fake_registry_aiohttp"]
        one, many = result["proxy"], result["proxy_workers"]
        labels = [
            ("single_mib_s", "1 client (curl)" if client == "curl" else "1 client"),
            ("concurrent4_mib_s", "4 clients (curl)" if client == "curl" else "4 clients"),
        ]
        if "wrk8_mib_s" in one:
            labels.insert(0, ("wrk8_mib_s", "8 connections (wrk -c8)"))
        for key, label in labels:
            self.rows.append(
                Row(
                    f"warm archive MiB/s, {label}",
                    f"{one[key]:.0f}",
                    f"{nginx[key]:.0f} (nginx)" if nginx else "-",
                    _ratio(one[key], nginx.get(key)),
                    f"bare aiohttp (fake registry, from memory) {reference[key]:.0f}",
                    f"{many[key]:.0f}",
                    _ratio(many[key], nginx.get(key)),
                )
            )
        if "wrk8_cpu_s_per_gib" in one:
            base = nginx.get("wrk8_cpu_s_per_gib")
            self.rows.append(
                Row(
                    "warm archive: server CPU s per GiB (wrk -c8)",
                    f"{one['wrk8_cpu_s_per_gib']:.2f}",
                    f"{base:.2f} (nginx)" if base else "-",
                    _ratio(one["wrk8_cpu_s_per_gib"], base),
                    "user + system CPU of the server's processes; less depends less on the load",
                    f"{many['wrk8_cpu_s_per_gib']:.2f}",
                    _ratio(many["wrk8_cpu_s_per_gib"], base),
                )
            )
        metrics = [(key, f"warm archive MiB/s, {label}") for key, label in labels]
        if "wrk8_cpu_s_per_gib" in one:
            metrics.append(("wrk8_cpu_s_per_gib", "warm archive: server CPU s per GiB (wrk -c8)"))
        self._ceiling_rows(result, metrics)
        supervisor, *workers = many["peak_rss_mib_each"]
        self.rows.append(
            Row(
                "warm archive: peak RSS per worker",
                f"{one['peak_rss_mib']:.0f} MiB",
                note=f"goal < 150 MiB; N workers: max of {len(workers)}, supervisor {supervisor:.0f} MiB; "
                f"CPU {one['cpu_s']:.1f} s / {many['cpu_s']:.1f} s",
                proxy_workers=f"{max(workers):.0f} MiB",
            )
        )

    def _ceiling_rows(self, result: dict, metrics: list[tuple[str, str]]) -> None:
        """The ceiling's rows: bare aiohttp xN streaming the file, hashed and not, against nginx; the note has the
        proxy xN against the ceiling (and, hashed, what hashing costs the ceiling)."""
        nginx, many, workers = result.get("nginx", {}), result["proxy_workers"], self.args.workers
        plain = result["ceiling_plain"]
        for key, metric in metrics:
            for name, hashed in CEILINGS.items():
                own = result[name]
                note = f"proxy x{workers} / ceiling {_ratio(many[key], own[key])}"
                if hashed:
                    note += f"; hashed / not hashed {_ratio(own[key], plain[key])}"
                kind = "hashed" if hashed else "not hashed"
                self.rows.append(_nginx_row(f"{metric}: ceiling x{workers}, file, {kind}", key, own, nginx, note))

    # ---- 6. archive stores and policy ------------------------------------------------------------

    async def archive_stores(self, stack: contextlib.AsyncExitStack) -> None:
        """The big archive served by one proxy per setup of `--store-setups` (archive store on disk or in S3 on
        moto's server over HTTPS, with or without a policy), each with `--workers` N, against nginx, rounds
        interleaved: MiB/s, the servers' CPU s per GiB, peak RSS per worker."""
        args, world = self.args, self.world
        setups = [s for s in args.store_setups if not (args.no_s3 and _store_of(s) == "s3")]
        if len(setups) < len(args.store_setups):
            self.note("S3 setups of benchmark 6 disabled (--no-s3)")
        if not setups:
            return
        self.progress(f"6. warm archive throughput by archive store and policy: {', '.join(setups)}")
        s3, bucket = None, ""
        if any(_store_of(s) == "s3" for s in setups):
            os.environ.update(CREDENTIALS)  # botocore's default chain, in the proxy processes started below
            s3 = await asyncio.to_thread(S3Server, world.cert_file, world.key_file, world.ca_file)
            stack.callback(s3.stop)
            bucket = await asyncio.to_thread(s3.bucket)  # one for all: a second proxy finds the object there
        policy = self.root / "policy.toml"
        policy.write_text(policy_text(STORE_POLICY_RULES))
        proxies: dict[str, tuple[ProxyProcess, ProcessProbe]] = {}
        for setup in setups:
            name = "stores-" + setup.replace("+", "-")
            extra = ["--workers", str(args.workers)]
            if _store_of(setup) == "s3":
                extra += s3.flags(bucket)
            if setup.endswith("+policy"):
                extra += ["--policy", str(policy), "--audit-log", str(self.root / name / "audit.log")]
            proxy = await self._start_proxy(stack, name, *extra)
            await self._fetch_big(proxy, setup)  # cold: fetched, verified, stored (uploaded to the bucket)
            proxies[setup] = (proxy, ProcessProbe(proxy.process.pid, tree=True))
        if s3 is not None:
            keys = await asyncio.to_thread(s3.keys, bucket)
            self.check("benchmark 6: the big archive is one object in the bucket", len(keys) == 1, str(keys))
        path = mirror_path(world.big, archive_document(world.big))
        targets = {setup: (proxy.url + path, proxy.ca_file, probe) for setup, (proxy, probe) in proxies.items()}
        if self.nginx is not None:
            targets["nginx"] = (self.nginx.url + path, world.ca_file, ProcessProbe(self.nginx.process.pid, tree=True))
        store_probe = ProcessProbe(s3.process.pid) if s3 is not None else None
        store_cpu = store_probe.cpu_seconds() if store_probe is not None else 0.0
        for _, probe in proxies.values():
            probe.reset_peak()
        result: dict = {"setups": setups, "workers": args.workers, **await self._throughput(targets)}
        if store_probe is not None:
            result["s3_server_cpu_s"] = round(store_probe.cpu_seconds() - store_cpu, 2)
        for setup, (proxy, probe) in proxies.items():
            supervisor, *workers = probe.peak_mib_each().values()
            result[setup].update(
                peak_rss_mib_worker=round(max(workers), 1), peak_rss_mib_supervisor=round(supervisor, 1)
            )
            gets = result[setup]["upstream_archive_gets"]
            self.check(f"benchmark 6: {setup} made no upstream request", gets == 0, f"{gets} archive GETs upstream")
            await proxy.stop()
        self.results["archive_stores"] = result
        self._store_rows(result)

    def _store_rows(self, result: dict) -> None:
        nginx, workers = result.get("nginx", {}), result["workers"]
        keys = [("single_mib_s", "1 client MiB/s"), ("concurrent4_mib_s", "4 clients MiB/s")]
        if self._use_wrk:
            keys = [("wrk8_mib_s", "wrk -c8 MiB/s"), *keys, ("wrk8_cpu_s_per_gib", "server CPU s/GiB (wrk -c8)")]
        moto = result.get("s3_server_cpu_s")
        for setup in result["setups"]:
            own = result[setup]
            for key, label in keys:
                note = ""
                if key == "wrk8_cpu_s_per_gib":
                    note = "the proxy's processes only"
                    if moto is not None and _store_of(setup) == "s3":
                        note += f"; moto's CPU over all S3 rounds {moto:.1f} s"
                self.rows.append(_nginx_row(f"archive, {setup} x{workers}: {label}", key, own, nginx, note))
            self.rows.append(
                Row(
                    f"archive, {setup} x{workers}: peak RSS per worker",
                    f"{own['peak_rss_mib_worker']:.0f} MiB",
                    note=f"goal < 150 MiB; supervisor {own['peak_rss_mib_supervisor']:.0f} MiB",
                )
            )

    # ---- 2. warm JSON ----------------------------------------------------------------------------

    async def _load(self, url: str, ca_file: Path) -> load.LoadResult:
        if self._use_wrk:
            return await load.wrk(
                url,
                connections=self.args.connections,
                threads=min(2, os.cpu_count() or 1),
                seconds=self.args.json_seconds,
            )
        context = ssl.create_default_context(cafile=str(ca_file))
        return await load.aiohttp_load(url, context, connections=self.args.connections, seconds=self.args.json_seconds)

    async def warm_json(
        self, proxy: ProxyProcess, probe: ProcessProbe, workers: ProxyProcess, redis_proxy: ProxyProcess | None
    ) -> None:
        """The embedded-store proxy with 1 and N workers, the Redis proxy (one worker, on the fleet's Redis and
        data dir), nginx and the bare aiohttp ceiling, interleaved per document."""
        async with contextlib.AsyncExitStack() as stack:
            await self._warm_json(proxy, probe, workers, redis_proxy, stack)

    async def _start_bare(self, stack: contextlib.AsyncExitStack, bodies: dict[str, bytes]) -> dict[str, BareAiohttp]:
        """The bare aiohttp ceiling servers (one per event loop), answering `bodies` (URL path -> bytes)."""
        world, servers = self.world, {}
        for loop in LOOPS:
            bare = BareAiohttp(self.root / f"bare-{loop}", world.cert_file, world.key_file, loop)
            for path, body in bodies.items():
                bare.put(path, body)
            await bare.start(world.ca_file)
            stack.push_async_callback(bare.stop)
            servers[f"bare_{loop}"] = bare
        if len(LOOPS) == 1:
            self.note("uvloop is not installed: the bare aiohttp ceiling is measured with asyncio only")
        return servers

    async def _warm_json(
        self,
        proxy: ProxyProcess,
        probe: ProcessProbe,
        workers: ProxyProcess,
        redis_proxy: ProxyProcess | None,
        stack: contextlib.AsyncExitStack,
    ) -> None:
        world = self.world
        tool = (
            "wrk"
            if self._use_wrk
            else f"aiohttp load loop ({'--no-wrk' if load.WRK else 'wrk not found'}: the client may be the bottleneck)"
        )
        if not self._use_wrk:
            self.note("wrk not used for the JSON benchmark: " + tool)
        proxies = {"proxy": (proxy, probe), "proxy_workers": (workers, ProcessProbe(workers.process.pid, tree=True))}
        where = {"proxy": "proxy", "proxy_workers": f"proxy x{self.args.workers}", "proxy_redis": "proxy, Redis"}
        if redis_proxy is not None:
            proxies["proxy_redis"] = (redis_proxy, ProcessProbe(redis_proxy.process.pid))
        redis_probe = ProcessProbe(self.redis.process.pid) if redis_proxy is not None and self.redis else None
        self.progress(
            f"2. warm JSON: {tool}, {self.args.connections} connections, {self.args.json_seconds} s each; "
            f"{', '.join(proxies)}{', nginx' if self.nginx else ''}"
        )
        documents = {"index.json": "index.json", ":version.json": f"{world.small.version}.json"}
        bodies: dict[tuple[str, str], bytes] = {}
        for label, name in documents.items():
            path = mirror_path(world.small, name)
            for key, (server, _) in proxies.items():
                context = ssl.create_default_context(cafile=str(server.ca_file))
                for _ in range(2):  # the first request fills the cache, the second must be a hit
                    status, body = await _get(server.url + path, context)
                self.check(f"warm json {label}: 200 ({key})", status == 200, body[:200].decode(errors="replace"))
                bodies[key, label] = body
            if self.nginx is not None:
                self.nginx.put(path, bodies["proxy", label])
        bare = await self._start_bare(
            stack, {mirror_path(world.small, name): bodies["proxy", label] for label, name in documents.items()}
        )
        before = len(world.registry.requests)
        result: dict = {"tool": "wrk" if self._use_wrk else "aiohttp", "connections": self.args.connections}
        for label, name in documents.items():
            path = mirror_path(world.small, name)
            entry: dict = {}
            for key, (server, server_probe) in proxies.items():
                context = ssl.create_default_context(cafile=str(server.ca_file))
                server_probe.reset_peak()
                cpu = server_probe.cpu_seconds()
                redis_cpu = redis_probe.cpu_seconds() if redis_probe and key == "proxy_redis" else None
                redis_calls = await load.redis_command_calls(self.redis.port) if redis_cpu is not None else 0
                measured = entry[key] = (await self._load(server.url + path, server.ca_file)).as_dict()
                measured["peak_rss_mib"] = round(server_probe.peak_mib(), 1)
                measured["peak_rss_mib_each"] = [round(v, 1) for v in server_probe.peak_mib_each().values()]
                measured["cpu_s"] = round(server_probe.cpu_seconds() - cpu, 2)
                if redis_cpu is not None:
                    measured["redis_server_cpu_s"] = round(redis_probe.cpu_seconds() - redis_cpu, 2)
                    redis_calls = await load.redis_command_calls(self.redis.port) - redis_calls
                    measured["redis_commands"] = redis_calls
                    measured["redis_commands_per_request"] = round(redis_calls / max(1, measured["requests"]), 2)
                if key != "proxy":
                    measured["same_body_as_embedded"] = bodies[key, label] == bodies["proxy", label]
                self.check(
                    f"warm json {label}: no errors under load ({where[key]})",
                    measured["errors"] == 0,
                    f"{measured['errors']} errors",
                )
                entry[f"{key}_unloaded"] = await load.sequential_latency(server.url + path, context, requests=200)
            if self.nginx is not None:
                entry["nginx"] = (await self._load(self.nginx.url + path, world.ca_file)).as_dict()
                entry["nginx_unloaded"] = await load.sequential_latency(
                    self.nginx.url + path, world.client_ssl(), requests=200
                )
            for key, server in bare.items():
                entry[key] = (await self._load(server.url + path, world.ca_file)).as_dict()
            result[label] = entry
            self._json_rows(label, entry)
        self.check(
            "warm json: no upstream request during the load",
            len(world.registry.requests) == before,
            f"{len(world.registry.requests) - before} upstream requests",
        )
        self.results["warm_json"] = result

    def _json_rows(self, label: str, entry: dict) -> None:
        def latency(result: dict | None) -> str:
            return f"{result['p50_ms']:.2f} / {result['p99_ms']:.2f}" if result else "-"

        conns = f"{entry['proxy']['tool']}, {self.args.connections} conns, TLS"
        mine, many, base = entry["proxy"], entry["proxy_workers"], entry.get("nginx")
        self.rows.append(
            Row(
                f"warm {label} req/s",
                f"{mine['requests_per_s']:.0f}",
                f"{base['requests_per_s']:.0f} (nginx)" if base else "-",
                _ratio(mine["requests_per_s"], base and base["requests_per_s"]),
                f"embedded store; {conns}",
                f"{many['requests_per_s']:.0f}",
                _ratio(many["requests_per_s"], base and base["requests_per_s"]),
            )
        )
        self.rows.append(
            Row(
                f"warm {label} p50 / p99 ms",
                latency(mine),
                latency(base),
                _ratio(mine["p99_ms"], base and base["p99_ms"]),
                "ratio is of p99",
                latency(many),
                _ratio(many["p99_ms"], base and base["p99_ms"]),
            )
        )
        supervisor, *workers = many["peak_rss_mib_each"]
        self.rows.append(
            Row(
                f"warm {label}: peak RSS per worker",
                f"{mine['peak_rss_mib']:.0f} MiB",
                note=f"goal < 150 MiB; N workers: max of {len(workers)}, supervisor {supervisor:.0f} MiB",
                proxy_workers=f"{max(workers):.0f} MiB",
            )
        )
        for key in (key for key in entry if key.startswith("bare_")):
            bare = entry[key]
            self.rows.append(
                Row(
                    f"warm {label} req/s: bare aiohttp ceiling, {key.removeprefix('bare_')}",
                    f"{bare['requests_per_s']:.0f}",
                    f"{base['requests_per_s']:.0f} (nginx)" if base else "-",
                    _ratio(bare["requests_per_s"], base and base["requests_per_s"]),
                    f"one process, fixed bytes from memory; p50 / p99 {latency(bare)} ms",
                )
            )
        mine, base = entry["proxy_unloaded"], entry.get("nginx_unloaded")
        many = entry["proxy_workers_unloaded"]
        self.rows.append(
            Row(
                f"warm {label} unloaded p50 / p99 ms",
                latency(mine),
                latency(base),
                _ratio(mine["p50_ms"], base and base["p50_ms"]),
                "1 connection, sequential (aiohttp client); ratio is of p50",
                latency(many),
                _ratio(many["p50_ms"], base and base["p50_ms"]),
            )
        )
        redis, embedded = entry.get("proxy_redis"), entry["proxy"]
        if redis is None:
            return
        self.rows.append(
            Row(
                f"warm {label} req/s, Redis store",
                f"{redis['requests_per_s']:.0f}",
                f"{embedded['requests_per_s']:.0f} (embedded)",
                _ratio(redis["requests_per_s"], embedded["requests_per_s"]),
                f"{conns}; Redis commands/request {redis.get('redis_commands_per_request', 0):.2f}, "
                f"redis-server CPU {redis.get('redis_server_cpu_s', 0):.1f} s, "
                f"proxy CPU {redis['cpu_s']:.1f} s (embedded {embedded['cpu_s']:.1f} s)",
            )
        )
        self.rows.append(
            Row(
                f"warm {label} p50 / p99 ms, Redis store",
                latency(redis),
                latency(embedded),
                _ratio(redis["p99_ms"], embedded["p99_ms"]),
                "ratio is of p99",
            )
        )
        redis, embedded = entry["proxy_redis_unloaded"], entry["proxy_unloaded"]
        self.rows.append(
            Row(
                f"warm {label} unloaded p50 / p99 ms, Redis",
                latency(redis),
                latency(embedded),
                _ratio(redis["p50_ms"], embedded["p50_ms"]),
                "ratio is of p50",
            )
        )

    # ---- 4. terraform init ---------------------------------------------------------------------

    async def _init(self, release: Release, base_url: str, ca_file: Path, label: str, *, mode: str = "mirror") -> float:
        """One `terraform init` in a fresh directory with an empty plugin cache, through the mirror at
        `base_url`, through its registry pass-through (`host`), or (`direct`) straight from the registry
        at `base_url`."""
        self._workdirs += 1
        name = f"{self._workdirs:02d}-{label}"
        workdir = self.terraform.workdir(name, _main_tf(release))
        cache = self.root / "tf-plugin-cache" / name
        cache.mkdir(parents=True)
        config = _init_cli_config(mode, base_url, cache)
        self.last_init_started = time.time()  # wall clock, as the proxy's log and the registry's timeline
        started = time.perf_counter()
        code, output = await self.terraform.init(workdir, config, ca_file)
        elapsed = time.perf_counter() - started
        self.check(f"terraform init {label}: exit 0", code == 0, output[-1500:])
        return elapsed

    def _no_terraform(self) -> bool:
        if TERRAFORM is None:
            if "terraform" not in " ".join(self.notes):
                self.note("terraform is not on PATH: the terraform init benchmark is SKIPPED")
            return True
        return False

    async def _publish_static(self, proxy: ProxyProcess, release: Release) -> None:
        """Copy the proxy's (warm) JSON documents into nginx's static network mirror."""
        context = ssl.create_default_context(cafile=str(proxy.ca_file))
        for name in ("index.json", f"{release.version}.json"):
            status, body = await _get(proxy.url + mirror_path(release, name), context)
            self.check(f"{release.type} {name} from the proxy: 200", status == 200)
            if self.nginx is not None:
                self.nginx.put(mirror_path(release, name), body)

    async def _warm_vs_static(self, proxy: ProxyProcess, release: Release, label: str) -> dict:
        warm, static = [], []
        # One warm-up each, reported but not in the median: the first run of each is the noisiest.
        first = {"first_warm_s": round(await self._init(release, proxy.url, proxy.ca_file, f"{label}-warm1"), 3)}
        if self.nginx is not None:
            first["first_static_s"] = round(
                await self._init(release, self.nginx.url, self.world.ca_file, f"{label}-static1"), 3
            )
        for _ in range(self.args.init_repeats):  # interleaved, so drift hits both alike
            warm.append(await self._init(release, proxy.url, proxy.ca_file, f"{label}-warm"))
            if self.nginx is not None:
                static.append(await self._init(release, self.nginx.url, self.world.ca_file, f"{label}-static"))
        result = {
            **first,
            "warm_s": round(statistics.median(warm), 3),
            "warm_min_s": round(min(warm), 3),
            "warm_runs": [round(t, 3) for t in warm],
        }
        if static:
            result["static_nginx_s"] = round(statistics.median(static), 3)
            result["static_nginx_min_s"] = round(min(static), 3)
            result["static_runs"] = [round(t, 3) for t in static]
            result["proxy_overhead_ms"] = round((result["warm_s"] - result["static_nginx_s"]) * 1000)
            result["proxy_overhead_min_ms"] = round((min(warm) - min(static)) * 1000)
        return result

    def _init_rows(self, title: str, result: dict) -> None:
        static = result.get("static_nginx_s")
        overhead = (
            f"overhead {result['proxy_overhead_ms']:+d} ms (min vs min {result['proxy_overhead_min_ms']:+d}); "
            if static
            else ""
        )
        self.rows.append(
            Row(
                f"terraform init {title}, warm",
                f"{result['warm_s']:.2f} s",
                f"{static:.2f} s (nginx static)" if static else "-",
                _ratio(result["warm_s"], static),
                f"{overhead}median of {self.args.init_repeats}",
            )
        )

    async def init_big_warm(self, proxy: ProxyProcess) -> None:
        if self._no_terraform():
            return
        self.progress(f"4b. terraform init of the {self.args.size_mib} MiB provider, warm (and static nginx)")
        release = self.world.big
        await self._publish_static(proxy, release)
        result = await self._warm_vs_static(proxy, release, "big")
        self.results.setdefault("terraform_init", {})["big"] = result
        self._init_rows(f"{self.args.size_mib} MiB provider", result)

    async def _cold_vs_direct(self, stack: contextlib.AsyncExitStack, release: Release, label: str) -> dict:
        """`--init-repeats` cold inits, each through a new, empty proxy (started and idle before the clock
        starts), interleaved with inits straight from the upstream (no proxy)."""
        world, cold, direct, proxies = self.world, [], [], []
        archive_path = world.registry.archive_path(release, PLATFORM)
        before = world.registry.count(archive_path)
        for round_ in range(self.args.init_repeats):
            proxy = await self._start_proxy(stack, f"proxy-{label}-cold{round_}")
            proxies.append(proxy)
            cold.append(await self._init(release, proxy.url, proxy.ca_file, f"{label}-cold"))
            direct.append(
                await self._init(release, world.registry.url, world.ca_file, f"{label}-direct", mode="direct")
            )
            if round_ < self.args.init_repeats - 1:
                await proxy.stop()
        gets = world.registry.count(archive_path) - before
        self.check(
            f"terraform init {label}: each cold proxy made one GET of the archive",
            gets == 2 * len(cold),
            f"{gets} GETs for {len(cold)} cold and {len(direct)} direct inits",
        )
        result = {
            "cold_s": round(statistics.median(cold), 3),
            "cold_runs": [round(t, 3) for t in cold],
            "direct_upstream_s": round(statistics.median(direct), 3),
            "direct_upstream_runs": [round(t, 3) for t in direct],
            "ratio_of_medians": round(statistics.median(cold) / statistics.median(direct), 3),
            "median_of_pair_ratios": round(statistics.median(c / d for c, d in zip(cold, direct, strict=True)), 3),
        }
        result["proxy"] = proxies[-1]  # the last one stays up, warm, for what follows (not in the JSON)
        return result

    def _cold_row(self, title: str, result: dict) -> None:
        self.rows.append(
            Row(
                f"terraform init {title}, cold",
                f"{result['cold_s']:.2f} s",
                f"{result['direct_upstream_s']:.2f} s (direct)",
                _ratio(result["cold_s"], result["direct_upstream_s"]),
                "each run a new empty proxy: discovery, versions, SHA256SUMS+sig, archive; baseline: "
                f"no proxy, straight from the upstream; medians of {len(result['cold_runs'])} "
                f"interleaved; median of pair ratios {result['median_of_pair_ratios']:.2f}x",
            )
        )

    async def init_small(self, stack: contextlib.AsyncExitStack) -> None:
        if self._no_terraform():
            return
        self.progress("4. terraform init of a small provider: cold (empty proxy) vs direct, warm (and static nginx)")
        release = self.world.small
        cold = await self._cold_vs_direct(stack, release, "small")
        proxy = cold.pop("proxy")
        await self._publish_static(proxy, release)
        result = {**cold, **await self._warm_vs_static(proxy, release, "small")}
        self.results.setdefault("terraform_init", {})["small"] = result
        self._cold_row("small provider", result)
        self._init_rows("small provider", result)

    async def init_cold(self, stack: contextlib.AsyncExitStack) -> None:
        """The big provider through an empty proxy against straight from the upstream (not in a default run)."""
        if self._no_terraform():
            return
        self.progress(f"4c. terraform init of the {self.args.size_mib} MiB provider: cold (empty proxy) vs direct")
        result = await self._cold_vs_direct(stack, self.world.big, "big")
        await result.pop("proxy").stop()
        self.results.setdefault("terraform_init", {})["big_cold"] = result
        self._cold_row(f"{self.args.size_mib} MiB provider", result)

    # ---- 7. cold init across a WAN --------------------------------------------------------------

    async def init_wan(self, stack: contextlib.AsyncExitStack) -> None:
        """Cold inits across a WAN of each `--upstream-latency` (`bench/wan.py`): direct, through a new empty
        proxy as a network mirror and through another as a `host` block (and, with `--baseline`,
        both through that checkout's proxy), interleaved per round."""
        if self._no_terraform():
            return
        world = self.world
        release = {"small": world.small, "mid": world.mid, "big": world.big}[self.args.wan_release]
        results = self.results.setdefault(
            "init_wan", {"release": f"{release.namespace}/{release.type}", "wan": self.args.wan}
        )
        modes = self._wan_modes()
        relay = None
        if self.args.wan == "relay":
            relay = WanRelay(world.registry.port)
            await relay.start()
            stack.push_async_callback(relay.stop)
            world.registry.files_base = relay.url  # the download documents name the archive behind the WAN too
        self.wan = relay
        try:
            for latency in self.args.upstream_latency:
                if relay is None:
                    world.registry.latency = latency
                else:
                    relay.latency = latency
                shown = format_duration(latency) if latency else "0 ms"
                self.progress(f"7. cold terraform init of {release.type} across a WAN ({self.args.wan}), {shown}")
                runs: dict[str, list[WanRun]] = {mode: [] for mode in modes}
                for round_ in range(self.args.wan_repeats):
                    for mode in modes:
                        runs[mode].append(await self._wan_init(stack, release, mode, f"wan{round_}", latency))
                result = _wan_result(runs)
                if self.args.timeline:
                    result["timeline"] = {
                        mode: await self._wan_timeline(stack, release, mode, latency) for mode in modes
                    }
                results[shown] = result
                for mode in modes[1:]:
                    self._wan_row(shown, mode, result)
        finally:
            world.registry.latency = 0.0
            world.registry.files_base = None
            self.wan = None

    def _wan_modes(self) -> tuple[str, ...]:
        """The inits of a round, in order: direct, then each proxy mode (after its baseline's, if any)."""
        if self.args.baseline is None:
            return INIT_MODES
        return ("direct", "mirror-base", "mirror", "host-base", "host")

    @property
    def _upstream_url(self) -> str:
        """Where terraform and the proxies reach the upstream: through the WAN relay, if there is one."""
        return self.world.registry.url if self.wan is None else self.wan.url

    async def _wan_init(
        self, stack: contextlib.AsyncExitStack, release: Release, mode: str, label: str, latency: float, *extra: str
    ) -> WanRun:
        """One cold init in `mode`; through a proxy started (and idle) before the clock starts, stopped after,
        its CPU time (with the gpg processes it waited for) taken before it stops."""
        name = f"{label}-{mode}-{latency * 1000:.0f}ms"
        if mode == "direct":
            return WanRun(await self._init(release, self._upstream_url, self.world.ca_file, name, mode=mode))
        proxy = await self._start_proxy(
            stack,
            f"proxy-{name}",
            *extra,
            upstream=self._upstream_url,
            source=self.args.baseline if mode.endswith("-base") else None,
        )
        try:
            before = process_cpu_seconds(proxy.process.pid)
            elapsed = await self._init(release, proxy.url, proxy.ca_file, name, mode=mode.removesuffix("-base"))
            return WanRun(elapsed, process_cpu_seconds(proxy.process.pid) - before)
        finally:
            await proxy.stop()

    async def _wan_timeline(self, stack: contextlib.AsyncExitStack, release: Release, mode: str, latency: float) -> str:
        """One traced cold init in `mode` (the proxy at `--log-level debug`): its timeline as a text table."""
        registry = self.world.registry
        run = await self._wan_init(stack, release, mode, "traced", latency, "--log-level", "debug")
        since = self.last_init_started
        who = "terraform" if mode == "direct" else "proxy"
        steps = [Step(0.0, run.seconds, "terraform", f"init ({mode})"), *upstream_steps(registry.timeline, since, who)]
        if self.wan is not None:
            steps += connection_steps(self.wan.connections, since, who)
        if mode != "direct":
            name = f"proxy-traced-{mode}-{latency * 1000:.0f}ms"
            steps += proxy_steps(next((self.root / name).glob("proxy-*.log")), since)
        table = render(steps)
        print(f"\ntimeline: cold init, {mode}, upstream latency {latency * 1000:.0f} ms\n{table}", file=sys.stderr)
        return table

    def _wan_row(self, shown: str, mode: str, result: dict) -> None:
        proxy_mode = mode.removesuffix("-base")
        title = "network mirror" if proxy_mode == "mirror" else "host block"
        if mode.endswith("-base"):
            title += " (baseline checkout)"
        cpu = f"proxy CPU {result[mode + '_cpu_s'] * 1000:.0f} ms per init; "
        self.rows.append(
            Row(
                f"cold init, upstream latency {shown}, {title}",
                f"{result[mode + '_s']:.2f} s",
                f"{result['direct_s']:.2f} s (direct)",
                _ratio(result[mode + "_s"], result["direct_s"]),
                f"median of pair ratios {result[mode + '_pair_ratio']:.2f}x; {cpu}medians of "
                f"{len(result['direct_runs'])} interleaved; {self.args.wan_release} provider, each run a new empty "
                f"proxy; WAN: {self.args.wan}",
            )
        )

    # ---- report ------------------------------------------------------------------------------

    def table(self) -> str:
        n = self.args.workers
        header = Row("benchmark", "proxy", "baseline", "ratio", "notes", f"proxy x{n}", f"ratio x{n}")
        rows = [header, *self.rows]
        fields = ("metric", "proxy", "proxy_workers", "baseline", "ratio", "ratio_workers")
        widths = [max(len(getattr(r, f)) for r in rows) for f in fields]
        lines = []
        for index, r in enumerate(rows):
            cells = [
                r.metric.ljust(widths[0]),
                *(getattr(r, f).rjust(width) for f, width in zip(fields[1:], widths[1:], strict=True)),
                r.note,
            ]
            lines.append("  ".join(cells).rstrip())
            if index == 0:
                lines.append("-" * max(len(line) for line in lines))
        return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Benchmark the registry proxy (see bench/README.md).")
    parser.add_argument("--size-mib", type=int, default=200, help="size of the big archive (default 200)")
    parser.add_argument("--clients", type=int, default=10, help="concurrent clients of the cold fan-out")
    parser.add_argument(
        "--workers",
        type=int,
        default=max(2, os.cpu_count() or 1),
        help="worker processes of the proxy in the `proxy xN` column (default: the CPUs, at least 2)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="warm archive downloads per configuration")
    parser.add_argument(
        "--archive-seconds", type=float, default=6, help="duration of each wrk run on the big archive (8 connections)"
    )
    parser.add_argument("--json-seconds", type=float, default=8, help="duration of each JSON load run")
    parser.add_argument("--connections", type=int, default=64, help="connections of the JSON load")
    parser.add_argument(
        "--init-repeats",
        type=int,
        default=5,
        help="measured warm (and static) terraform inits each, after one warm-up each",
    )
    parser.add_argument(
        "--fleet-clients",
        type=int,
        default=100,
        help="concurrent cold clients of the fleet fan-out, split across replicas A and B",
    )
    parser.add_argument("--fleet-mib", type=int, default=20, help="size of the fleet fan-out archive (default 20)")
    parser.add_argument(
        "--fleet-chunk-delay",
        type=float,
        default=0.02,
        help="fake upstream's pause per 256 KiB of archive in the fleet fan-out (default 0.02 s)",
    )
    parser.add_argument("--fleet-lock-ttl", default="15s", help="the replicas' --fleet-lock-ttl (default 15s)")
    parser.add_argument(
        "--fleet-workers",
        type=int,
        default=2,
        help="worker processes of each fleet replica (`serve --workers`, default 2)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=(*PHASES, *ON_REQUEST),
        help="run only these benchmarks (repeatable): cold (1), archive (3 and 6), stores (6), fleet (5), "
        "json (2), init-big (4, warm), init-small (4, cold vs direct and warm); init-cold (the big "
        "provider's init through an empty proxy vs direct) and init-wan (7, cold inits across a WAN) "
        "run only when asked for",
    )
    parser.add_argument(
        "--upstream-latency",
        type=_latencies,
        default=_latencies("0,50ms,150ms"),
        help="init-wan: the delays added to every answer of the fake upstream, comma-separated (default "
        "0,50ms,150ms); terraform straight from it and the proxy see them alike",
    )
    parser.add_argument(
        "--wan-release",
        choices=("small", "mid", "big"),
        default="mid",
        help="init-wan: the provider (small: kilobytes, three platforms; mid: --fleet-mib; big: --size-mib)",
    )
    parser.add_argument("--wan-repeats", type=int, default=5, help="init-wan: interleaved rounds per latency")
    parser.add_argument(
        "--wan",
        choices=("relay", "answers"),
        default="relay",
        help="init-wan: how the latency is added: relay (a TCP relay in front of the fake upstream delays every "
        "segment, connection set-up included; the default) or answers (the fake upstream delays each answer)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="init-wan: another checkout of the project (e.g. the main branch's) whose proxy runs too, "
        "interleaved, for a before/after comparison in one run",
    )
    parser.add_argument(
        "--timeline", action="store_true", help="init-wan: one traced init per mode and latency, its timeline printed"
    )
    parser.add_argument("--no-nginx", action="store_true", help="skip the nginx baselines")
    parser.add_argument("--no-redis", action="store_true", help="skip the Redis benchmarks (fleet, Redis JSON)")
    parser.add_argument(
        "--store-setups",
        type=_store_setups,
        default=list(STORE_SETUPS),
        help="benchmark 6: the proxies to serve the big archive, comma-separated (default "
        f"{','.join(STORE_SETUPS)}: archive store on disk or in S3 (moto), with a policy of "
        f"{STORE_POLICY_RULES} rules and the audit log, or without)",
    )
    parser.add_argument("--no-s3", action="store_true", help="leave the S3 setups out of benchmark 6")
    parser.add_argument("--no-wrk", action="store_true", help="use the aiohttp load loop even if wrk exists")
    parser.add_argument("--time-limit", type=float, default=720, help="abort the whole run after this many s")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write the JSON results")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    return parser.parse_args(argv)


def _store_setups(text: str) -> list[str]:
    """`disk,s3+policy` → the setups of benchmark 6, checked."""
    setups = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [s for s in setups if s not in STORE_SETUPS]
    if unknown or not setups:
        raise argparse.ArgumentTypeError(f"unknown setup(s) {unknown}: choose from {', '.join(STORE_SETUPS)}")
    return setups


def _store_of(setup: str) -> str:
    """`s3+policy` → `s3`."""
    return setup.partition("+")[0]


def _latencies(text: str) -> list[float]:
    """`0,50ms,150ms` → seconds."""
    try:
        return [parse_duration(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _wan_result(runs: dict[str, list[WanRun]]) -> dict:
    """Medians of each mode's runs, each proxy mode's ratios to direct (of the medians; median of the per-round
    ratios) and the proxy's median CPU time per init."""
    direct = [run.seconds for run in runs["direct"]]
    result: dict = {"direct_s": round(statistics.median(direct), 3), "direct_runs": [round(t, 3) for t in direct]}
    for mode, mode_runs in runs.items():
        if mode == "direct":
            continue
        times = [run.seconds for run in mode_runs]
        result[mode + "_s"] = round(statistics.median(times), 3)
        result[mode + "_runs"] = [round(t, 3) for t in times]
        result[mode + "_ratio"] = round(statistics.median(times) / statistics.median(direct), 3)
        result[mode + "_pair_ratio"] = round(statistics.median(p / d for p, d in zip(times, direct, strict=True)), 3)
        result[mode + "_cpu_s"] = round(statistics.median(run.cpu_seconds for run in mode_runs), 3)
    return result


def _quiet_reference_server() -> None:
    """wrk drops its connections mid-body when its time is up: the fake registry, which runs in this
    process, would log every write after that (asyncio) and every reset (aiohttp) on the console."""
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


async def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _quiet_reference_server()
    root = Path(tempfile.mkdtemp(prefix="registry-proxy-bench-"))
    suite = Suite(args, root)
    started = time.perf_counter()
    error = None
    try:
        async with asyncio.timeout(args.time_limit):
            await suite.run()
    except Exception as exc:  # report what was measured so far, then fail
        error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        print(f"benchmark aborted: {error}", file=sys.stderr)
    finally:
        if args.keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    suite.results.update(
        duration_s=round(time.perf_counter() - started, 1), checks=suite.checks, notes=suite.notes, error=error
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(suite.results, indent=2) + "\n")
    print()
    print(suite.table())
    failed = [c["check"] for c in suite.checks if not c["ok"]]
    print(
        f"\nchecks: {len(suite.checks) - len(failed)} passed, {len(failed)} failed"
        + (f" ({'; '.join(failed)})" if failed else "")
    )
    for text in suite.notes:
        print(f"note: {text}")
    print(f"results: {args.output} ({suite.results['duration_s']} s)")
    return 1 if error or failed else 0
