"""Issue 18 item 7: the memory a burst of idle TLS connections took goes back to the system once they close,
against a real `python -m proxy serve` process. (bench/idle_soak.py soaks it: 20 bursts of 1,000-3,000.)

asyncio's TLS protocol zero-fills a 256 KiB read buffer per connection, so a burst's memory is plain to see
in the RSS; uvloop's buffer is touched only as far as data arrives (the soak shows its drift).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

from bench.load import ProcessProbe
from tests.fakes.process import ProxyProcess, wait_for
from tests.fakes.rawclients import RawClient, open_tls

BURST = 120


async def _burst(proc: ProxyProcess, count: int) -> list[RawClient]:
    context = ssl.create_default_context(cafile=str(proc.ca_file))
    gate = asyncio.Semaphore(32)

    async def one() -> RawClient:
        async with gate:
            return await open_tls("127.0.0.1", proc.port, context, timeout=30)

    return await asyncio.gather(*(one() for _ in range(count)))


async def _close(clients: list[RawClient]) -> None:
    for client in clients:
        client.abort()
    await asyncio.wait_for(asyncio.gather(*(asyncio.shield(c.closed) for c in clients)), 30)


async def _settle(probe: ProcessProbe, below: float, timeout: float) -> float:
    """Poll the RSS until it is below `below` MiB (or `timeout` passes); the last value."""
    samples = []

    def low() -> bool:
        samples.append(probe.rss_mib())
        return samples[-1] < below

    with contextlib.suppress(AssertionError):
        await wait_for(low, timeout, "the RSS to come down")
    return samples[-1]


async def test_the_memory_of_a_burst_of_idle_tls_connections_is_returned_once_they_close(proxy_process):
    held_long = ("--client-header-timeout", "60s", "--keepalive-timeout", "60s")  # a loaded machine's handshakes
    proc = await proxy_process("--event-loop", "asyncio", "--max-connections", str(2 * BURST), *held_long)
    probe = ProcessProbe(proc.process.pid)
    await _close(await _burst(proc, BURST // 4))  # the first connections' one-time costs (caches, code paths)
    before = probe.rss_mib()

    clients = await _burst(proc, BURST)
    held = probe.rss_mib()
    assert all(not c.closed.done() for c in clients), "the proxy closed idle connections too early"
    assert held - before > BURST * 0.2, f"{BURST} idle TLS connections took only {held - before:.1f} MiB"

    await _close(clients)
    # Before the fix the freed read buffers stayed in malloc's heap: the RSS did not come down at all.
    allowed = before + 0.25 * (held - before)
    after = await _settle(probe, allowed, 10)
    assert after < allowed, (
        f"RSS {before:.1f} MiB before the burst, {held:.1f} held, still {after:.1f} after the connections closed"
    )
