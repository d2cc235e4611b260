"""The fleet's secret marker: a replica whose metadata secret differs from the fleet's does not start.

Every record is sealed with the metadata secret (`proxy.metadata_store.sealed`), so a replica given another
one would read every record as forged (`security.metadata_poisoned`, logged per key like an attack) and fetch
everything again, while its own writes looked forged to the rest of the fleet. So the store holds a marker,
`fleet-secret` (`PREFIX:fleet-secret` in Redis, a row of the embedded file), written by the first replica to
find none (atomically: SET NX, INSERT OR IGNORE) and never expiring: a random fleet id sealed under the key
with the secret, i.e. the id and HMAC-SHA256(secret, label, key, id). It holds nothing the sealed records do
not already give away: guessing the secret offline costs one HMAC per guess, as against any record.

`serve` and the commands that open the store check it before anything else (`require`: exit 2 with one line
when it does not open); a running replica checks it again on every `/readyz` and at most every
`CHECK_INTERVAL` while it uses the store (`confirm`). A marker that opens with no secret of the replica makes
it stop using the store (no read, no write: `SealedStore`) and answer `/readyz` with 503 and the line, logged
once as `metadata.secret_mismatch`, until it opens again. A lost marker (FLUSHDB, an eviction, Redis
restarted without persistence) is written again by the next replica to check, with its own secret: a replica
with another secret that was running meanwhile then finds the mismatch at its next check, not at its next
start. A marker that opens only with an accepted secret (`--metadata-secret-accepted`) is a rotation under
way: accepted, and sealed with the new secret by `registry-proxy rotate-secret`.
"""

from __future__ import annotations

import enum
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import structlog

from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import Seal
from proxy.settings.config import ConfigError

log = structlog.get_logger(__name__)

CHECK_INTERVAL = 10.0  # seconds between two checks of a serving replica, but for those of /readyz


class MarkerStore(Protocol):
    """What the marker needs of a store (`RedisStore`, `EmbeddedStore`): values read, written and replaced
    as they are, without the seal's wrapper and without an expiry."""

    async def get_kept(self, key: str) -> bytes | None: ...

    async def add(self, key: str, value: bytes) -> bool | None: ...

    async def swap(self, key: str, old: bytes, new: bytes) -> bool | None: ...

    def sealed_keys(self) -> AsyncIterator[str]: ...


class Standing(enum.Enum):
    """What the marker says of this replica's secrets."""

    OWN = "sealed with this replica's secret"
    ACCEPTED = "sealed with an accepted secret: a rotation under way"
    OTHER = "sealed with another secret"
    UNKNOWN = "not read: the store did not answer"


class FleetSecret:
    """The marker of one store, checked with one seal; `problem` is the mismatch line while there is one."""

    def __init__(
        self,
        store: MarkerStore,
        seal: Seal,
        *,
        mismatch: str,
        clock: Callable[[], float] = time.monotonic,
        interval: float = CHECK_INTERVAL,
    ) -> None:
        self._store = store
        self._seal = seal
        self._mismatch = mismatch
        self._clock = clock
        self._interval = interval
        self._next_check = 0.0
        self.standing = Standing.UNKNOWN

    @property
    def problem(self) -> str | None:
        """The one line saying the secret differs from the fleet's, while it does (else None)."""
        return self._mismatch if self.standing is Standing.OTHER else None

    async def check(self, *, loud: bool = True) -> Standing:
        """Read the marker (written first if there is none) and note what it says of this replica's secrets
        (a change logged, if `loud`); the store not answering leaves the last standing as it was."""
        self._next_check = self._clock() + self._interval
        stored = await self._store.get_kept(FLEET_SECRET)
        if stored is None:
            stored = await self._mark()
        if stored is None:
            return Standing.UNKNOWN
        standing = self._standing(stored)
        self._note(standing, loud)
        return standing

    async def inspect(self) -> Standing | None:
        """What the marker says of this replica's secrets, read without writing one (`doctor`: a secret being
        diagnosed must not mark a flushed store as its fleet's): None when there is no marker, or the store did
        not answer (ask it first). Nothing is noted or logged."""
        stored = await self._store.get_kept(FLEET_SECRET)
        return None if stored is None else self._standing(stored)

    @property
    def mismatch(self) -> str:
        """The line that says this replica's secret differs from the one that sealed the marker."""
        return self._mismatch

    def _standing(self, stored: bytes) -> Standing:
        value, own, _ = self._seal.unseal(FLEET_SECRET, stored)
        return Standing.OTHER if value is None else Standing.OWN if own else Standing.ACCEPTED

    async def require(self) -> Standing:
        """`check`, raising ConfigError with the mismatch line when the marker opens with no secret of this
        replica (the one line `serve` and the commands exit 2 with)."""
        standing = await self.check(loud=False)  # the ConfigError is the one line
        if standing is Standing.OTHER:
            raise ConfigError(self._mismatch)
        return standing

    async def confirm(self) -> bool:
        """Whether this replica may use the store: `check` again once `CHECK_INTERVAL` has passed since the
        last (one caller checks, the others go on with the last standing meanwhile)."""
        if self._clock() >= self._next_check:
            await self.check()
        return self.standing is not Standing.OTHER

    async def reseal(self) -> bool:
        """Seal the marker with this replica's own secret, if it opens with an accepted one (`rotate-secret`):
        whether it is sealed with the own secret now."""
        stored = await self._store.get_kept(FLEET_SECRET)
        if stored is None:
            return await self._mark() is not None
        value, own, _ = self._seal.unseal(FLEET_SECRET, stored)
        if value is None:
            return False
        if own:
            return True
        return bool(await self._store.swap(FLEET_SECRET, stored, self._seal.close(FLEET_SECRET, value)))

    async def _mark(self) -> bytes | None:
        """Write a new marker unless one is there; the marker there now (None: the store did not answer)."""
        marker = self._seal.close(FLEET_SECRET, secrets.token_hex(16).encode())
        written = await self._store.add(FLEET_SECRET, marker)
        if written is None:
            return None
        if not written:  # another replica wrote one first: that one counts
            return await self._store.get_kept(FLEET_SECRET)
        if self.standing is Standing.UNKNOWN:
            log.info("metadata.fleet_secret_marked", effect="replicas with another metadata secret will not start")
        else:
            log.warning(
                "metadata.fleet_secret_marked",
                reason="the marker was gone (FLUSHDB, an eviction, or Redis restarted without persistence)",
                effect="written again with this replica's secret; a replica with another one turns unready",
            )
        return marker

    def _note(self, standing: Standing, loud: bool) -> None:
        """Take `standing` as the replica's, logging a change to or from a mismatch if `loud`."""
        if standing is self.standing:
            return
        if loud and standing is Standing.OTHER:
            log.error(
                "metadata.secret_mismatch",
                error=self._mismatch,
                effect="this replica neither reads nor writes the metadata store and /readyz answers 503; "
                "restart it with the fleet's secret (docs/operations.md, 'Rotating the metadata secret')",
            )
        elif loud and self.standing is Standing.OTHER:
            log.warning("metadata.secret_matched", standing=standing.value, effect="the metadata store is used again")
        self.standing = standing
