"""How long the metadata store takes to follow a Sentinel failover, and whether any answer is wrong meanwhile.

```
.venv/bin/python bench/redis_failover.py [--rounds 3] [--concurrency 16]
```

Starts a real Sentinel setup on loopback (`tests/fakes/redis_server.py`: a master, its replica, one sentinel
at scaled timings: `down-after-milliseconds` 1000) and a `RedisStore` on it, with `--concurrency` tasks
reading and writing keys whose right values are known. Each round is one of:

- `SENTINEL FAILOVER` with the old master lingering (it still takes writes, as one the sentinels cannot
  reach would): the time from the sentinel naming the new master to the first write of the store that
  lands there;
- the master killed (SIGKILL): the time from the kill to the first write of the store that lands on the
  new master (the sentinel's down-after-milliseconds and election included).

Prints, per round, those times and the answers given meanwhile: right, misses (Redis down: the proxy then
serves from disk and upstream) and wrong (a value other than the one written: must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.redis_server import RedisServer, SentinelSetup


class Traffic:
    def __init__(self, store, concurrency: int) -> None:
        self.store = store
        self.concurrency = concurrency
        self.right = self.misses = self.wrong = 0
        self.running = True

    async def worker(self, number: int) -> None:
        n = 0
        while self.running:
            n += 1
            key = f"k:{number}:{n % 50}"
            value = f"{number}:{n % 50}".encode()
            await self.store.set(key, value)
            found = await self.store.get(key)
            if found is None:
                self.misses += 1
            elif found == value:
                self.right += 1
            else:
                self.wrong += 1
            await asyncio.sleep(0)

    async def run(self) -> None:
        await asyncio.gather(*(self.worker(n) for n in range(self.concurrency)))


def holds(server: RedisServer, name: str) -> bool:
    with server.client() as client:
        return bool(client.exists(name))


async def followed(setup: SentinelSetup, store, new: RedisServer) -> float:
    """When a write of the store first lands on `new` (monotonic)."""
    probe = 0
    while True:
        probe += 1
        key = f"probe:{uuid.uuid4().hex}"
        await store.set(key, b"p")
        if await asyncio.to_thread(holds, new, store.key(key)):
            return time.monotonic()
        await asyncio.sleep(0.005)


async def one_round(setup: SentinelSetup, kind: str, concurrency: int) -> dict[str, object]:
    await asyncio.to_thread(setup.settle)
    store = setup.open_store(prefix=f"failover-{uuid.uuid4().hex[:8]}")  # the proxy's 2 s retry
    store.follow_failovers()  # as the proxy does (proxy/metadata_store/factory.py)
    traffic = Traffic(store, concurrency)
    running = asyncio.create_task(traffic.run())
    await asyncio.sleep(0.5)  # traffic under way (a measurement, not a test)
    old = setup.master()
    if kind == "failover":
        await asyncio.to_thread(setup.failover, old_master_lingers=True)
        start = time.monotonic()  # the sentinel names the new master
        new = setup.master()
    else:
        new = setup.replica()
        start = time.monotonic()
        old.kill()
    at = await followed(setup, store, new)
    await asyncio.sleep(0.5)
    traffic.running = False
    await running
    await store.close()
    if kind == "kill":
        old.start()  # back, as the new master's replica
    return {
        "round": kind,
        "followed_s": round(at - start, 3),
        "right": traffic.right,
        "misses": traffic.misses,
        "wrong": traffic.wrong,
    }


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as temp:
        setup = SentinelSetup(Path(temp), service="bench", password="benchpw", sentinel_password="sentpw")
        setup.start()
        try:
            for _ in range(args.rounds):
                for kind in ("failover", "kill"):
                    print(await one_round(setup, kind, args.concurrency), flush=True)
        finally:
            setup.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
