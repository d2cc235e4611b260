"""Each provider release's SHA256SUMS: fetched once per fleet, verified by the chain, recorded only once verified.

A release (a provider version) has one SHA256SUMS and detached signature for all its packages,
named by their download documents. Both are fetched in metadata slots while the registry's keys are
imported, the signature is verified (`proxy.providers.verification`, in a worker thread: gpg blocks), and only then
is the pair recorded in the metadata store as fetched (byte-identical for the clients). Releases of
a private host are recorded under a key of their own (`--upstream-credentials`): a public release
never shares a record with a private one. A client given a package's download document asks for its
SHA256SUMS next: `verify_early` starts that fetch and verification at once, without waiting for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from proxy.domain.addresses import ProviderAddr, Version
from proxy.metadata_store import keys
from proxy.metadata_store.records import SumsRecord
from proxy.protocol.provider_registry import DownloadInfo
from proxy.providers.signatures import Keyring
from proxy.providers.verification import SignedSums, VerificationChain
from proxy.runtime.background import BackgroundTasks
from proxy.runtime.deadline import detached_context
from proxy.runtime.memo import Memo
from proxy.services.documents import DocumentCache
from proxy.services.shared_fetches import SharedFetches
from proxy.settings.config import Settings
from proxy.storage import DiskSpace, is_disk_full

log = structlog.get_logger(__name__)


def sums_key(addr: ProviderAddr, d: DownloadInfo, private_hosts: frozenset[str]) -> str:
    """The metadata-store key of a release's SHA256SUMS record, scoped to its host when the host is private."""
    host = str(addr.hostname)
    return keys.sums(d, scope=host if host in private_hosts else "")


class ReleaseSums:
    """The verified SHA256SUMS of provider releases."""

    def __init__(
        self,
        settings: Settings,
        documents: DocumentCache,
        shared_fetches: SharedFetches,
        keyring: Keyring,
        chain: VerificationChain,
        space: DiskSpace,
    ) -> None:
        self._settings = settings
        self._documents = documents
        self._shared_fetches = shared_fetches
        self._keyring = keyring
        self._chain = chain
        self._space = space
        self._private_hosts = settings.upstreams.upstream_credentials.private_hosts
        self._early = BackgroundTasks("sums.early_failed")
        self._started_early: Memo[str, bool] = Memo()  # keys of the releases `verify_early` was asked for
        # Told the SHA256SUMS's Last-Modified (a publish time for the policy's min-age) when one is fetched.
        self.on_dated: Callable[[ProviderAddr, Version, str], Awaitable[None]] | None = None
        self.dates_wanted: Callable[[], bool] = _never  # whether such a time may hold a release back now
        # Told the key of each release whose signature verified, before it is recorded, and of a recorded one when it
        # is used (may refuse it: raises); `check_signer`: the pins alone, without I/O (key continuity, the policy's).
        self.on_signed: Callable[[ProviderAddr, Version, str, str], Awaitable[None]] | None = None
        self.check_signer: Callable[[ProviderAddr, Version, str, str], None] | None = None
        # whether a pin selects the provider (its releases' signers must be known to serve them)
        self.pinned: Callable[[ProviderAddr], bool] = _no_pins

    def key(self, addr: ProviderAddr, d: DownloadInfo) -> str:
        """The metadata-store key of the release's record (`sums_key`)."""
        return sums_key(addr, d, self._private_hosts)

    async def verified(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> SignedSums:
        """The release's SHA256SUMS once verified (fetched and verified once, for the whole fleet, if not yet)."""
        return self._signed(addr, d, await self.record(addr, version, d))

    def verify_early(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> None:
        """Start `verified` without waiting for it, once per release in this process (detached from the request:
        a failure is logged by the verification and left for the request that asks for the SHA256SUMS)."""
        key = self.key(addr, d)
        if self._started_early.get(key):
            return
        self._started_early.put(key, True)
        self._early.start(self.verified(addr, version, d), context=detached_context())

    async def recorded(self, addr: ProviderAddr, d: DownloadInfo, version: Version | None = None) -> SignedSums | None:
        """The release's verified SHA256SUMS if it is recorded, never fetching it (given its `version`, its signing
        key checked against the pins)."""
        record = await self._documents.record(self.key(addr, d), SumsRecord)
        if record is not None and version is not None:
            self._check_signer(addr, version, record)
        return None if record is None else self._signed(addr, d, record)

    def _check_signer(self, addr: ProviderAddr, version: Version, record: SumsRecord) -> None:
        if self.check_signer is not None:  # (an unsigned release has no key: a pin refuses it)
            self.check_signer(addr, version, record.key_id, record.fingerprint)

    def _signed(self, addr: ProviderAddr, d: DownloadInfo, record: SumsRecord) -> SignedSums:
        return self._documents.parsed(self.key(addr, d), record, lambda r: self._chain.recorded_sums(d, r))

    async def record(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> SumsRecord:
        """SHA256SUMS and signature as fetched, recorded (and so cached) only once verified."""
        self._chain.admit(addr, version, d)
        key = self.key(addr, d)

        async def recorded() -> SumsRecord | None:
            return await self._documents.record(key, SumsRecord)

        record = await recorded()
        if record is None:
            record = await self._shared_fetches.once_for_the_fleet(
                key,
                recorded,
                lambda: self._fetch(key, addr, version, d),
                str(d.shasums_url.with_query(None)),
            )
        elif self.on_signed is not None:  # known keys: from memory; a pin: checked again (an unsigned release too)
            await self.on_signed(addr, version, record.key_id, record.fingerprint)
        return record

    async def _fetch(self, key: str, addr: ProviderAddr, version: Version, d: DownloadInfo) -> SumsRecord:
        limit = self._settings.limits.max_metadata_bytes
        # The keys are imported while the documents they verify arrive (a gpg process less to wait for).
        (document, last_modified), signature, _ = await asyncio.gather(
            self._documents.dated_blob(d.shasums_url, limit, "SHA256SUMS"),
            self._documents.blob(d.shasums_signature_url, limit, "SHA256SUMS signature"),
            asyncio.to_thread(self._keyring.import_quietly, list(d.signing_keys)),
        )
        try:
            sums = await asyncio.to_thread(self._chain.verify_sums, addr, version, d, document, signature)
        except OSError as exc:  # gpg needs a little room in DATA_DIR/gnupg: a full disk is no forgery
            if not is_disk_full(exc):
                raise
            raise self._space.full(exc, f"verify the SHA256SUMS of {addr} {version}") from None
        if self.on_signed is not None:  # a new key (or none, for a pinned provider) may refuse it: not recorded
            await self.on_signed(addr, version, sums.key_id, sums.fingerprint)
        record = self._chain.sums_record(sums, document, signature)
        await self._documents.put_record(key, record)
        if self.on_dated is not None and last_modified is not None:
            await self.on_dated(addr, version, last_modified)
        if sums.unsigned:  # admitted by --unsigned-providers; the signature is kept as sent, for the clients
            log.info(
                "verify.signature_skipped",
                provider=str(addr),
                version=str(version),
                reason="the registry lists no signing keys",
                policy=str(self._chain.policy),
            )
        else:
            log.info("verify.signature_ok", provider=str(addr), version=str(version), key_id=sums.key_id)
        return record


def _never() -> bool:
    return False


def _no_pins(addr: ProviderAddr) -> bool:
    return False
