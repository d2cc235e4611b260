"""Upstream slots: a global cap on requests in flight, and a smaller cap per upstream host.

One slow host can then hold at most its own share of the slots, never all of them. A slot
is waited for at most a given time; after that the caller gets an `UpstreamBusyError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from yarl import URL

from proxy.errors import UpstreamBusyError
from proxy.settings.config import Limits


class HostSlots:
    """At most `total` holders at once, at most `per_host` of them for one host (`host:port`)."""

    def __init__(self, total: int, per_host: int) -> None:
        self._total = asyncio.Semaphore(total)
        self._per_host = min(per_host, total)
        self._hosts: dict[str, tuple[asyncio.Semaphore, int]] = {}  # host -> (slots, users)

    @classmethod
    def for_upstream(cls, limits: Limits) -> HostSlots:
        """Slots sized by `--upstream-concurrency`, `--upstream-host-concurrency` for each host."""
        return cls(limits.upstream_concurrency, limits.upstream_host_concurrency)

    @contextlib.asynccontextmanager
    async def hold(self, url: URL, wait: float, what: str) -> AsyncIterator[None]:
        """A slot for fetching `url`, waited for at most `wait` seconds."""
        host = f"{url.host}:{url.port}"
        host_slots = self._enter(host)
        try:
            try:
                async with asyncio.timeout(wait):
                    await host_slots.acquire()
                    try:
                        await self._total.acquire()
                    except BaseException:
                        host_slots.release()
                        raise
            except TimeoutError:
                raise UpstreamBusyError(
                    f"too many upstream requests in flight (to {url.host} or in all); "
                    f"gave up waiting {wait:g}s for a slot to fetch {what}"
                ) from None
            try:
                yield
            finally:
                self._total.release()
                host_slots.release()
        finally:
            self._leave(host)

    def _enter(self, host: str) -> asyncio.Semaphore:
        slots, users = self._hosts.get(host) or (asyncio.Semaphore(self._per_host), 0)
        self._hosts[host] = (slots, users + 1)
        return slots

    def _leave(self, host: str) -> None:
        slots, users = self._hosts[host]
        if users <= 1:
            del self._hosts[host]  # no one holds or waits: forget the host
        else:
            self._hosts[host] = (slots, users - 1)
