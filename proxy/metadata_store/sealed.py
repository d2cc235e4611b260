"""The metadata store is an untrusted cache: every value is sealed with an HMAC bound to its key.

Whoever can write to Redis (or the SQLite file) could otherwise rewrite records: copy 1.0.0's
download, SHA256SUMS and archive records under 1.1.0's keys and the proxy would serve the
1.0.0 zip as 1.1.0 with matching hashes. So every value written becomes

    b"rps1." + hex(HMAC-SHA256(secret, context || len(key) || key || value)) + b"." + value

and every read checks the MAC against the key it was read under: a record moved to another
key, edited, forged without the secret, or written by an older version (no seal) is a miss,
logged once per key as `security.metadata_poisoned`, counted, and re-fetched; never served.
The key is the value's whole name in its store, namespace included: one `Seal` serves every
namespace of a store (the records and documents through `SealedStore`, Redis's remembered 404s
under `negative:KEY` through `proxy.metadata_store.redis.RedisNegatives`), and a value moved from one
namespace to another fails it like one moved between keys.

The secret is the operator's (`--metadata-secret` or `--metadata-secret-file`, the same on
every replica); for the embedded store without one, a random secret is made in the data dir.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from proxy.domain.lru import Lru
from proxy.metadata_store import MetadataStore, StoreWrapper
from proxy.settings.config import ConfigError, Settings

if TYPE_CHECKING:
    from proxy.metadata_store.fleet_secret import FleetSecret

log = structlog.get_logger(__name__)

MAGIC = b"rps1."
_CONTEXT = b"registry-proxy metadata seal v1\x00"
_MAC_HEX = 64
MIN_SECRET_BYTES = 16
SECRET_FILE = "metadata.secret"
_REPORTED_KEYS = 10_000  # keys refused and logged, each logged once while remembered (the first reported go first)


def _mac(secret: bytes, key: str, value: bytes) -> bytes:
    name = key.encode()
    message = b"".join((_CONTEXT, len(name).to_bytes(4, "big"), name, value))
    return hmac.new(secret, message, hashlib.sha256).hexdigest().encode()


def seal(secret: bytes, key: str, value: bytes) -> bytes:
    """`value` as stored under `key`."""
    return MAGIC + _mac(secret, key, value) + b"." + value


def unseal(secret: bytes, key: str, stored: bytes) -> tuple[bytes | None, str]:
    """(value, "") when `stored` was sealed under `key` with `secret`, else (None, why not)."""
    head = len(MAGIC) + _MAC_HEX + 1
    if not stored.startswith(MAGIC) or len(stored) < head or stored[head - 1 : head] != b".":
        return None, "no seal (forged, or written by an older version)"
    value = stored[head:]
    if not hmac.compare_digest(stored[len(MAGIC) : head - 1], _mac(secret, key, value)):
        return None, "bad seal (edited, moved from another key, or sealed with another secret)"
    return value, ""


class Seal:
    """One store's secret: seals values under the keys they are written to, opens what is read, and reports
    (once per key, counting every time) each value it refuses."""

    def __init__(
        self,
        secret: bytes,
        *,
        store: str,
        accepted: tuple[bytes, ...] = (),
        on_reject: Callable[[str, str], None] | None = None,
    ) -> None:
        self._secret = secret
        self._accepted = tuple(other for other in accepted if other != secret)  # also opened, never sealed with
        self.store = store
        self._on_reject = on_reject
        self._reported: Lru[str, None] = Lru(_REPORTED_KEYS)  # a use: a key's first report (not a repeat)

    def close(self, key: str, value: bytes) -> bytes:
        """`value` sealed to be stored under `key` (the full name it is stored under, namespace included)."""
        if key in self._reported:
            self._reported.pop(key)
        return seal(self._secret, key, value)

    def open(self, key: str, stored: bytes | None) -> bytes | None:
        """The value sealed under `key`, or None: nothing stored, or a value refused (and reported)."""
        if stored is None:
            return None
        value, _, why = self.unseal(key, stored)
        if value is None:
            self.refuse(key, why, "no_seal" if why.startswith("no seal") else "bad_seal")
        elif key in self._reported:  # (almost never: a membership test, not a call, on every read)
            self._reported.pop(key)
        return value

    def unseal(self, key: str, stored: bytes) -> tuple[bytes | None, bool, str]:
        """(value, whether it was sealed with this seal's own secret, "") when `stored` opens under `key` with
        the secret or one of the accepted ones (a rotation under way); else (None, False, why not). Reports
        nothing."""
        value, why = unseal(self._secret, key, stored)
        if value is not None:
            return value, True, ""
        for other in self._accepted if why.startswith("bad seal") else ():
            value, _ = unseal(other, key, stored)
            if value is not None:
                return value, False, ""
        return None, False, why

    def refuse(self, key: str, why: str, reason: str) -> None:
        """Report a value found under `key` that is never used: counted by `reason`, logged once per key."""
        if self._on_reject is not None:
            self._on_reject(self.store, reason)
        if key in self._reported:
            return
        self._reported.put(key, None)
        log.error(
            "security.metadata_poisoned",
            key=key,
            store=self.store,
            reason=why,
            effect="treated as a miss and fetched again; never served",
        )


class SealedStore(StoreWrapper):
    """MetadataStore wrapper that seals what it writes and refuses what it cannot verify; while the fleet's
    marker (`fleet`) does not open with its secrets, it neither reads nor writes (a miss, a write skipped)."""

    def __init__(self, inner: MetadataStore, seal: Seal, fleet: FleetSecret | None = None) -> None:
        super().__init__(inner)
        self.seal = seal
        self.fleet = fleet

    @property
    def problem(self) -> str | None:
        """The secret's mismatch with the fleet's, else why the store under this wrapper is unusable, or None."""
        return (self.fleet.problem if self.fleet is not None else None) or self.inner.problem

    async def require_fleet(self) -> None:
        """Check the fleet's secret marker once the store answers (ConfigError, exit 2, when this secret does not
        open it: `proxy.metadata_store.fleet_secret`); a store that does not answer is said by the store itself."""
        if self.fleet is not None and await self.ping():
            await self.fleet.require()

    async def usable(self) -> bool:
        """False while the fleet's marker does not open with this seal's secrets (checked again now and then)."""
        return self.fleet is None or await self.fleet.confirm()

    async def get(self, key: str) -> bytes | None:
        if not await self.usable():
            return None
        return self.seal.open(key, await self.inner.get(key))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not await self.usable():
            return [None] * len(keys)
        return [self.seal.open(key, raw) for key, raw in zip(keys, await self.inner.get_many(keys), strict=True)]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        if await self.usable():
            await self.inner.set(key, self.seal.close(key, value), ttl)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def adopt_unsealed(self) -> int:
        """Seal in place every value without a seal; only for the embedded file on the start that makes its
        secret (upgrading from a version without seals), which this data dir trusted until then."""
        keys = [key async for key in self.inner.keys()]  # noqa: SIM118 - an async iterator, not a dict
        adopted = 0
        for key in keys:
            raw = await self.inner.get(key)
            if raw is not None and not raw.startswith(MAGIC):
                await self.inner.set(key, self.seal.close(key, raw))
                adopted += 1
        return adopted


def metadata_secret(settings: Settings) -> bytes:
    """The operator's secret, or (embedded store only) the data dir's own, made on first start."""
    secret = given_secret(settings)
    if secret is not None:
        return secret
    if settings.metadata.redis_url:  # Settings refuses this already; never fall back to a per-replica secret
        raise ConfigError("a shared Redis store needs --metadata-secret or --metadata-secret-file")
    return _local_secret(settings.cache_dir / SECRET_FILE)


def given_secret(settings: Settings) -> bytes | None:
    """The operator's secret (`--metadata-secret` or `--metadata-secret-file`), or None: none given."""
    metadata = settings.metadata
    return _given_secret(metadata.metadata_secret, metadata.metadata_secret_file, "--metadata-secret-file")


def accepted_secrets(settings: Settings) -> tuple[bytes, ...]:
    """The secrets accepted for reading besides `metadata_secret` (--metadata-secret-accepted, for a rotation)."""
    metadata = settings.metadata
    accepted = _given_secret(
        metadata.metadata_secret_accepted, metadata.metadata_secret_accepted_file, "--metadata-secret-accepted-file"
    )
    return () if accepted is None else (accepted,)


def _given_secret(value: str | None, file: Path | None, flag: str) -> bytes | None:
    """A secret given as text or in a file (ConfigError when the file cannot be read or holds too little)."""
    if value:
        return value.strip().encode()
    if file is None:
        return None
    try:
        secret = file.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {flag} {file}: {exc.strerror or exc}") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"{flag} {file} must hold at least {MIN_SECRET_BYTES} bytes (e.g. `openssl rand -hex 32`)")
    return secret


def _local_secret(path: Path) -> bytes:
    """Read the data dir's secret, or create it (0600, atomically: two processes agree on one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        secret = path.read_bytes().strip()
    except FileNotFoundError:
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_hex(32).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)  # fails if another process made one first: then theirs is used
            log.info("metadata.secret_created", path=str(path))
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
        secret = path.read_bytes().strip()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"{path} holds no usable metadata secret; delete it to have a new one made")
    return secret
