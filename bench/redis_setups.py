"""What the metadata store costs on each way of running Redis: one server, Sentinel, Cluster; plain and TLS.

```
.venv/bin/python bench/redis_setups.py [--seconds 3] [--concurrency 32]
```

Starts real Redis setups on loopback (`tests/fakes/redis_server.py`: a server; a master, its replica and a
sentinel; three cluster masters; each once without and once with TLS, with passwords) and, in this one
process, drives a `RedisStore` on each for `--seconds` with `--concurrency` tasks doing what a request does
most: a read of one key (GETEX), a read of ten (one pipeline) and, one time in ten, a write. Prints
operations per second and their ratio to the plain single server measured in the same run. The client (this
process) is the bottleneck on purpose: the numbers are the client-side cost of each setup, which is what a
proxy worker pays.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.redis_server import ClusterSetup, RedisServer, SentinelSetup, Tls


def tls_files(folder: Path) -> Tls:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    return Tls(folder / "cert.pem", folder / "key.pem", folder / "ca.pem")


async def drive(setup, seconds: float, concurrency: int) -> float:
    """Operations per second of `concurrency` tasks on a store on `setup`."""
    store = setup.open_store(prefix=f"bench-{uuid.uuid4().hex[:8]}")
    keys = [f"versions:registry.example/acme/p{n}" for n in range(200)]
    for key in keys:
        await store.set(key, b"x" * 2048)
    done = 0
    deadline = time.monotonic() + seconds

    async def worker(offset: int) -> None:
        nonlocal done
        n = offset
        while time.monotonic() < deadline:
            n += 1
            await store.get(keys[n % 200])
            await store.get_many(keys[n % 190 : n % 190 + 10])
            if n % 10 == 0:
                await store.set(keys[n % 200], b"y" * 2048)
            done += 3 if n % 10 == 0 else 2
        assert store.available, store.problem

    started = time.monotonic()
    await asyncio.gather(*(worker(number * 7) for number in range(concurrency)))
    rate = done / (time.monotonic() - started)
    await store.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        tls = tls_files(root)
        setups = {}
        for secure in (None, tls):
            kind = "tls" if secure else "plain"
            setups[f"server {kind}"] = RedisServer(root / f"server-{kind}", password="benchpw", tls=secure)
            setups[f"sentinel {kind}"] = SentinelSetup(
                root / f"sentinel-{kind}", service="bench", password="benchpw", sentinel_password="sentpw", tls=secure
            )
            setups[f"cluster {kind}"] = ClusterSetup(root / f"cluster-{kind}", password="benchpw", tls=secure)
        try:
            for setup in setups.values():
                setup.start()
            rates = {name: asyncio.run(drive(setup, args.seconds, args.concurrency)) for name, setup in setups.items()}
        finally:
            for setup in setups.values():
                setup.stop()
    base = rates["server plain"]
    print(f"{'setup':<16} {'ops/s':>10} {'vs server plain':>16}")
    for name, rate in rates.items():
        print(f"{name:<16} {rate:>10.0f} {rate / base:>16.2f}")


if __name__ == "__main__":
    main()
