"""Real Redis for tests (no fakeredis): a `redis-server` on a free loopback port, and Redis as users run
it for availability, made of the same processes: Sentinel (a master, its replica and a sentinel watching
them) and Cluster (three masters sharing the 16384 slots).

Every port is chosen free at start (`tests.fakes.ports`), and chosen again if another process takes it
first; a server counts as up only once `/proc` shows that it listens on its ports itself, so parallel test
workers each start their own and never talk to another's.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from proxy.metadata_store.redis import RedisStore
from tests.fakes.ports import PORT_ATTEMPTS, PortTakenError, free_port, listening_ports

__all__ = ["METADATA_SECRET", "REDIS_SETUPS", "ClusterSetup", "RedisServer", "SentinelSetup", "Tls", "free_port"]

# Every proxy on a shared Redis needs the fleet's metadata secret (`--metadata-secret`); tests share this one.
METADATA_SECRET = "test-fleet-metadata-secret-0123456789"
START_TIMEOUT = 10.0
# The setups the contract suites and the fleet's tests run over, by name: the fixture of tests/conftest.py each is.
REDIS_SETUPS = {"redis": "redis_server", "redis-sentinel": "redis_sentinel", "redis-cluster": "redis_cluster"}
# The sentinel's periods, in ms, scaled down from 10 s (INFO) and 2 s (hello): it sees a replica, a promotion
# and an old master back within a second, and turns the old master into a replica 4 hello periods later.
SENTINEL_TIMINGS = ("info-period", 500, "publish-period", 250, "ping-period", 250, "ask-period", 250)
LINGERING_PUBLISH_PERIOD = 60_000  # an old master is demoted 4 minutes after a failover: see `failover()`


def wait_until(condition: Callable[[], Any], what: str, timeout: float = START_TIMEOUT) -> Any:
    """Poll `condition` until it returns something true (errors count as not yet); that value."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (redis.RedisError, OSError) as exc:
            last, value = exc, None
        if value:
            return value
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


class KeptClient:
    """A client made on first use and kept until `drop()`, for the fakes' own polling (INFO, CLUSTER INFO,
    the sentinel's view): one connection, where a client per poll would make a TLS context and handshake
    (tens of ms of CPU) every 20 ms while a test waits for a failover or a cluster."""

    def __init__(self, make: Callable[[], redis.Redis]) -> None:
        self._make = make
        self._client: redis.Redis | None = None

    def __call__(self) -> redis.Redis:
        if self._client is None:
            self._client = self._make()
        return self._client

    def drop(self) -> None:
        """Close the kept client (its server stops, or another starts in its place)."""
        if self._client is not None:
            self._client.close()
            self._client = None


@dataclass(frozen=True)
class Tls:
    """A server certificate for 127.0.0.1 and the CA that issued it: Redis over TLS (`rediss://`)."""

    cert: Path
    key: Path
    ca: Path

    def server_options(self) -> list[str]:
        return [
            "--tls-cert-file",
            str(self.cert),
            "--tls-key-file",
            str(self.key),
            "--tls-ca-cert-file",
            str(self.ca),
            "--tls-auth-clients",
            "no",
        ]

    def client_options(self) -> dict[str, Any]:
        return {"ssl": True, "ssl_ca_certs": str(self.ca)}


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make test`, which installs the Debian package")
    return binary


class RedisSetup:
    """What a store or a proxy needs to reach a setup besides its `url`: the CA of its TLS, the sentinels' password."""

    url: str
    tls: Tls | None = None
    sentinel_password: str | None = None

    def store_options(self) -> dict[str, Any]:
        """The keywords of a `RedisStore` on this setup, but for the URL."""
        options: dict[str, Any] = {"ca_file": str(self.tls.ca)} if self.tls else {}
        if self.sentinel_password:
            options["sentinel_password"] = self.sentinel_password
        return options

    def open_store(self, **options: Any) -> RedisStore:
        """A `RedisStore` on this setup (`options`: its keywords, `prefix` first of all)."""
        return RedisStore(self.url, **self.store_options(), **options)

    def proxy_args(self) -> list[str]:
        """The options of `registry-proxy serve` that point it at this setup."""
        args = ["--redis-url", self.url]
        if self.tls:
            args += ["--redis-ca-file", str(self.tls.ca)]
        if self.sentinel_password:
            args += ["--redis-sentinel-password", self.sentinel_password]
        return args


class RedisServer(RedisSetup):
    """Start, stop and restart a redis-server; data is not persisted. `port`: keep this one (restarts reuse
    it); else one is chosen free, and chosen again if it is taken before the server binds it."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *,
        password: str | None = None,
        tls: Tls | None = None,
        options: Sequence[str] = (),
        cluster: bool = False,
    ) -> None:
        self.binary = _binary()
        self.workdir = workdir
        self._fixed_port = port is not None
        self.port = port or free_port()
        self.password = password
        self.tls = tls
        self.options = list(options)
        # a cluster node's bus port: given, not PORT+10000 (which may be taken, or above 65535)
        self.cluster_port = free_port() if cluster else None
        self.process: subprocess.Popen | None = None
        self.kept_client = KeptClient(self.client)

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        credentials = f":{self.password}@" if self.password else ""
        return f"{scheme}://{credentials}127.0.0.1:{self.port}/0"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, **options: Any) -> redis.Redis:
        """A plain (synchronous) client of this server."""
        tls = self.tls.client_options() if self.tls else {}
        return redis.Redis(port=self.port, password=self.password, socket_timeout=5, **tls, **options)

    def command_line(self) -> list[str]:
        listen = ["--port", "0", "--tls-port", str(self.port)] if self.tls else ["--port", str(self.port)]
        return [
            self.binary,
            *listen,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--repl-diskless-sync-delay",
            "0",  # a replica (re)joining syncs at once, not after 5 s
            "--dir",
            str(self.workdir),
            *(["--requirepass", self.password, "--masterauth", self.password] if self.password else []),
            *([*self.tls.server_options(), "--tls-replication", "yes"] if self.tls else []),
            *(["--cluster-enabled", "yes", "--cluster-port", str(self.cluster_port)] if self.cluster_port else []),
            *self.options,
        ]

    def start(self) -> None:
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start_once()
                return
            except PortTakenError:
                if self._fixed_port or attempt == PORT_ATTEMPTS - 1:
                    raise
                self.port = free_port()  # taken meanwhile by another process: other ports
                self.cluster_port = self.cluster_port and free_port()

    def ports(self) -> set[int]:
        """The ports this server must listen on itself: its client port and, in a cluster, its bus port."""
        return {self.port, *([self.cluster_port] if self.cluster_port else [])}

    def _start_once(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command_line(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.workdir
        )
        process = self.process

        def listening() -> bool:
            if process.poll() is not None:
                return True  # exited: it could not bind a port (someone else has it)
            return self.ports() <= listening_ports(process.pid)

        try:
            wait_until(listening, f"redis-server to listen on port {self.port}")
        except RuntimeError:
            self.stop()
            raise
        if self._exited():
            self.process = None
            raise PortTakenError(f"redis-server could not listen on port {self.port}")
        with self.client(socket_connect_timeout=0.2) as client:
            wait_until(client.ping, f"redis-server on port {self.port}")
        self._fixed_port = True  # a restart keeps the port its clients know

    def _exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def stop(self) -> None:
        self.kept_client.drop()
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, as when its host is lost."""
        self.kept_client.drop()
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def info(self, section: str) -> dict[str, Any]:
        return self.kept_client().info(section)


class SentinelSetup(RedisSetup):
    """A master, its replica and one sentinel (quorum 1) watching them as `service`, all on loopback, with
    passwords (the servers' and the sentinel's own) and, given `tls`, only TLS ports.

    The sentinel runs at scaled timings (`SENTINEL_TIMINGS`). `failover()` makes it promote the replica;
    `settle()` waits until the setup is whole again."""

    def __init__(
        self, workdir: Path, *, service: str, password: str, sentinel_password: str, tls: Tls | None = None
    ) -> None:
        self.workdir = workdir
        self.service = service
        self.password = password
        self.sentinel_password = sentinel_password
        self.tls = tls
        self.servers = [RedisServer(workdir / name, password=password, tls=tls) for name in ("a", "b")]
        self.sentinel_port = free_port()
        self.sentinel: subprocess.Popen | None = None
        self._kept_sentinel_client = KeptClient(self.sentinel_client)

    @property
    def url(self) -> str:
        """The proxy's `--redis-url` (the sentinel's password goes in `--redis-sentinel-password`)."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        return f"{scheme}://:{self.password}@127.0.0.1:{self.sentinel_port}/{self.service}"

    def client(self) -> redis.Redis:
        """A plain client of the master (the one the sentinel names now)."""
        return self.master().client()

    def sentinel_client(self) -> redis.Redis:
        tls = self.tls.client_options() if self.tls else {}
        return redis.Redis(port=self.sentinel_port, password=self.sentinel_password, socket_timeout=5, **tls)

    def start(self) -> None:
        first, second = self.servers
        first.start()
        second.options = ["--replicaof", "127.0.0.1", str(first.port)]
        second.start()
        self._wait_replicating(second)
        for _ in range(PORT_ATTEMPTS):
            self._start_sentinel(first)
            if self._sentinel_up():
                break
            self.sentinel_port = free_port()
        else:
            raise RuntimeError("the sentinel did not start")
        self.settle()

    def _start_sentinel(self, master: RedisServer) -> None:
        self._kept_sentinel_client.drop()
        listen = ["port 0", f"tls-port {self.sentinel_port}"] if self.tls else [f"port {self.sentinel_port}"]
        tls = []
        if self.tls:
            tls = [
                f"tls-cert-file {self.tls.cert}",
                f"tls-key-file {self.tls.key}",
                f"tls-ca-cert-file {self.tls.ca}",
                "tls-auth-clients no",
                "tls-replication yes",  # the sentinel talks to the servers over TLS too
            ]
        config = self.workdir / "sentinel.conf"  # the sentinel rewrites it: its own file, written afresh
        config.write_text(
            "\n".join(
                [
                    *listen,
                    "bind 127.0.0.1",
                    f"dir {self.workdir}",
                    f"requirepass {self.sentinel_password}",
                    f"sentinel monitor {self.service} 127.0.0.1 {master.port} 1",
                    f"sentinel auth-pass {self.service} {self.password}",
                    f"sentinel down-after-milliseconds {self.service} 1000",
                    f"sentinel failover-timeout {self.service} 10000",
                    *tls,
                    "",
                ]
            )
        )
        self.sentinel = subprocess.Popen(
            [_binary(), str(config), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def _sentinel_up(self) -> bool:
        """Whether the sentinel started listens on its port itself (not another test's process)."""
        sentinel = self.sentinel

        def listening() -> bool:
            if sentinel is None or sentinel.poll() is not None:
                return True  # exited (its port was taken): stop waiting
            return self.sentinel_port in listening_ports(sentinel.pid)

        wait_until(listening, "the sentinel to listen")
        if sentinel is None or sentinel.poll() is not None:
            self.sentinel = None
            return False
        with self.sentinel_client() as client:
            wait_until(client.ping, "the sentinel")
        return True

    def _wait_replicating(self, replica: RedisServer) -> None:
        wait_until(
            lambda: replica.info("replication").get("master_link_status") == "up",
            f"the replica on port {replica.port} to replicate",
        )

    def master_port(self) -> int:
        return int(self._kept_sentinel_client().sentinel_get_master_addr_by_name(self.service)[1])

    def master(self) -> RedisServer:
        port = self.master_port()
        return next(server for server in self.servers if server.port == port)

    def replica(self) -> RedisServer:
        port = self.master_port()
        return next(server for server in self.servers if server.port != port)

    def settle(self) -> None:
        """Until the setup is whole: the sentinel at its scaled timings, and the master's replica replicating
        and known to the sentinel as fit to promote (after a failover: the old master, turned replica)."""
        with self.sentinel_client() as client:
            client.execute_command("SENTINEL DEBUG", *SENTINEL_TIMINGS)

        def whole() -> bool:
            master, replica = self.master(), self.replica()
            if master.info("replication").get("role") != "master":
                return False
            if replica.info("replication").get("master_link_status") != "up":
                return False
            known = self._kept_sentinel_client().sentinel_slaves(self.service)
            return any(
                entry["port"] == replica.port
                and entry.get("master-link-status") == "ok"
                and not entry["is_sdown"]
                and not entry["is_odown"]
                for entry in known
            )

        wait_until(whole, "the sentinel setup to be whole", timeout=30)

    def failover(self, *, old_master_lingers: bool = False) -> RedisServer:
        """Promote the replica (`SENTINEL FAILOVER`); the new master, once the sentinel names it and it acts
        as one. The sentinel turns the old master into the new one's replica about a second later (this
        waits for it) or, with `old_master_lingers`, only at `settle()`: until then the old master still
        takes writes, as one the sentinels cannot reach would, and what is written there is lost."""
        self.settle()
        old = self.master()
        with self.sentinel_client() as client:
            if old_master_lingers:  # it demotes an old master 4 publish periods after seeing it again
                client.execute_command("SENTINEL DEBUG", "publish-period", LINGERING_PUBLISH_PERIOD)
            client.execute_command("SENTINEL FAILOVER", self.service)
        wait_until(lambda: self.master_port() != old.port, "the sentinel to name the new master", timeout=30)
        new = self.master()
        wait_until(lambda: new.info("replication").get("role") == "master", "the new master to act as one")
        if not old_master_lingers:
            self._wait_replicating(old)
        return new

    def stop(self) -> None:
        self._kept_sentinel_client.drop()
        if self.sentinel is not None:
            self.sentinel.terminate()
            self.sentinel.wait(10)
            self.sentinel = None
        for server in self.servers:
            server.stop()


class ClusterSetup(RedisSetup):
    """A Redis Cluster of three masters (no replicas) on loopback, each owning a third of the slots, with a
    password and, given `tls`, TLS on the client ports and the cluster bus."""

    def __init__(self, workdir: Path, *, password: str, tls: Tls | None = None) -> None:
        self.password = password
        self.tls = tls
        self.nodes = [
            RedisServer(
                workdir / f"node{number}",
                password=password,
                tls=tls,
                cluster=True,
                options=[
                    "--cluster-config-file",
                    str(workdir / f"node{number}" / "nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    *(["--tls-cluster", "yes"] if tls else []),
                ],
            )
            for number in range(3)
        ]

    @property
    def url(self) -> str:
        """The proxy's `--redis-url`: two of the three nodes to start from, as operators give them."""
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://:{self.password}@{self.nodes[0].address},{self.nodes[1].address}"

    def client(self) -> redis.RedisCluster:
        """A plain (synchronous) cluster client."""
        tls = self.tls.client_options() if self.tls else {}
        first = self.nodes[0]
        return redis.RedisCluster(host="127.0.0.1", port=first.port, password=self.password, socket_timeout=5, **tls)

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        slots = 16384
        for number, node in enumerate(self.nodes):
            with node.client() as client:
                first, last = number * slots // 3, (number + 1) * slots // 3 - 1
                client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
        with self.nodes[0].client() as client:
            for node in self.nodes[1:]:
                client.execute_command("CLUSTER MEET", "127.0.0.1", node.port, node.cluster_port)

        def whole() -> bool:
            for node in self.nodes:
                info = node.kept_client().execute_command("CLUSTER INFO")
                if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != "3":
                    return False
            return True

        wait_until(whole, "the cluster to form")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
