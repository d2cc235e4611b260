"""Signing-key continuity at work: each provider's signing keys recorded for the fleet, and a new one decided.

`SigningKeys.check` is told the key of every release whose SHA256SUMS signature has just verified
(`proxy.providers.release_sums`, before the release is recorded) and decides with the policy's key trust
(`proxy.governance.key_trust`, pure): a pin that does not list the key refuses the release
(`SigningKeyNotPinnedError`), a key never seen for a provider whose earlier releases another key signed is a
key change, decided by `key-change` (hold: `SigningKeyChangedError`; warn: served, logged
`security.signing_key_changed` at warning, audited, counted and shown on the page; allow: recorded). The
record (`keys.signing_keys`) is sealed like every value, written under the fleet lock of its key, and never
expires. A record present but unreadable (it fails its seal: edited, forged, or sealed with another secret)
is a key change from an unknown key, logged at error, and never rewritten as if the provider were new.
`accept` (`registry-proxy trust accept`) records a key on purpose, with who did it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from proxy.domain.addresses import ProviderAddr, Version
from proxy.errors import SigningKeyChangedError, SigningKeyNotPinnedError
from proxy.governance.audit import AuditLog
from proxy.governance.key_trust import (
    DEFAULT_TRUST,
    UNREADABLE,
    KeyChange,
    KeyRecord,
    KeyTrust,
    KeyVerdict,
    KnownKey,
    judge,
    read_key_record,
)
from proxy.metadata_store import keys
from proxy.metadata_store.sealed import SealedStore
from proxy.runtime.coalescing import FleetLocks, no_recheck
from proxy.runtime.memo import Memo
from proxy.runtime.metrics import Metrics

log = structlog.get_logger(__name__)
RECENT_EVENTS = 50  # key changes and pin refusals kept in memory for the page
ACCEPT_COMMAND = "registry-proxy trust accept"


class TrustAcceptError(ValueError):
    """`trust accept` cannot tell which key is meant."""


@dataclass(frozen=True)
class KeyEvent:
    """A key change or pin refusal, for the page (of this server process; the audit trail has them all)."""

    time: float
    address: str
    version: str
    old: tuple[str, ...]
    new: str
    decision: str  # hold, warn, allow, or unpinned
    detail: str


@dataclass(frozen=True)
class Stored:
    """A provider's record as read: the record (None: missing or unreadable), and why it cannot be used when one
    may be stored that cannot be read (`unreadable`: it fails its seal, or the store is unavailable)."""

    record: KeyRecord | None
    why_unreadable: str = ""

    @property
    def unreadable(self) -> bool:
        return bool(self.why_unreadable)


class SigningKeys:
    """The signing keys of every provider, shared by the fleet, and the decisions on new ones."""

    def __init__(
        self,
        store: SealedStore,
        locks: FleetLocks,
        *,
        trust: Callable[[], KeyTrust] = lambda: DEFAULT_TRUST,
        audit: AuditLog | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._locks = locks
        self.trust = trust
        self.audit = audit or AuditLog()
        self._metrics = metrics
        self.clock = clock
        self._known: Memo[tuple[str, str], bool] = Memo()  # (provider, fingerprint) known to the record
        self._writing = asyncio.Lock()  # this process's writes of records, one at a time
        self.recent: deque[KeyEvent] = deque(maxlen=RECENT_EVENTS)

    async def read(self, addr: ProviderAddr) -> Stored:
        """The provider's record, and whether one may be stored that cannot be read: present and failing its seal
        (logged by the seal, and here), or not known because the store is unavailable (a missing record is a
        provider never seen only while the store answers)."""
        stored = await self._read(addr)
        if not stored.unreadable:
            return stored
        log.error(
            "security.signing_keys_unreadable",
            provider=str(addr),
            key=keys.signing_keys(addr),
            reason=stored.why_unreadable,
            effect="a key not known to this process counts as a key change (held in hold mode) until the record "
            "can be read, or `trust accept` records one",
        )
        return stored

    async def _read(self, addr: ProviderAddr) -> Stored:
        """`read`, without the log line."""
        key = keys.signing_keys(addr)
        if not await self._store.usable():  # the fleet's marker does not open: nothing of the store is believed
            return Stored(None, f"the metadata store is unavailable ({self._store.problem})")
        raw = await self._store.inner.get(key)
        if raw is None:
            problem = self._store.problem
            return Stored(None) if problem is None else Stored(None, f"the metadata store is unavailable ({problem})")
        record = read_key_record(self._store.seal.open(key, raw))
        return Stored(record) if record is not None else Stored(None, UNREADABLE)

    def pinned(self, addr: ProviderAddr) -> bool:
        """Whether a pin in force selects the provider `addr`."""
        return self.trust().pin_for(str(addr)) is not None

    def check_pin(self, addr: ProviderAddr, version: Version, key_id: str, fingerprint: str) -> None:
        """Refuse a release (recorded already) whose key a pin selecting its provider does not list. Pure and
        cheap: asked every time a release's recorded SHA256SUMS is used. An unsigned release (no `fingerprint`,
        admitted by `--unsigned-providers`) of a pinned provider is refused too."""
        verdict = judge(self.trust(), str(addr), fingerprint, None, unreadable=False)
        if verdict.kind == "unpinned":
            self._refuse_unpinned(addr, version, key_id, fingerprint, verdict)

    async def check(self, addr: ProviderAddr, version: Version, key_id: str, fingerprint: str) -> None:
        """Decide about a release whose signature just verified with the key `fingerprint` (empty: an unsigned
        release, admitted by `--unsigned-providers`: refused if a pin selects its provider, else nothing to
        decide), recording the key as the verdict says; raises when the release is refused."""
        if not fingerprint:
            self.check_pin(addr, version, key_id, fingerprint)
            return
        address = str(addr)
        trust = self.trust()
        if self._known.get((address, fingerprint)):
            self.check_pin(addr, version, key_id, fingerprint)  # a pin added by a reload still counts
            return
        seen = (await self._read(addr)).record  # no lock for a key known already (unless a pin refuses it)
        known = seen is not None and fingerprint in seen.known
        if known and judge(trust, address, fingerprint, seen, unreadable=False).kind in ("known", "pinned"):
            self._known.put((address, fingerprint), True)
            return
        key = keys.signing_keys(addr)
        async with self._writing, self._locks.hold(key, no_recheck):
            stored = await self.read(addr)
            verdict = judge(trust, address, fingerprint, stored.record, unreadable=stored.unreadable)
            if verdict.kind == "unpinned":
                self._refuse_unpinned(addr, version, key_id, fingerprint, verdict)
            record = stored.record or KeyRecord()
            now = self.clock()
            new_key = KnownKey(key_id, now, str(version))
            changed = None
            if verdict.kind == "changed":
                old = (stored.why_unreadable,) if stored.unreadable else verdict.old
                changed = KeyChange(now, str(version), old, key_id, fingerprint, verdict.decision)
                first_time = fingerprint not in record.held  # a held key is recorded once, however often asked
                if verdict.refused:
                    if first_time and not stored.unreadable:
                        await self._write(key, record.with_held(fingerprint, new_key).with_change(changed))
                elif not stored.unreadable:
                    await self._write(key, record.with_known(fingerprint, new_key).with_change(changed))
            elif fingerprint not in record.known and not stored.unreadable:
                await self._write(key, record.with_known(fingerprint, new_key))
        if changed is not None:
            self._changed(addr, version, fingerprint, changed, unreadable=stored.unreadable)
        elif not stored.unreadable:
            self._known.put((address, fingerprint), True)

    async def accept(self, addr: ProviderAddr, given: str, by: str) -> tuple[str, KnownKey]:
        """Record the key `given` (a full fingerprint, or the key id of a key held or seen for the provider) as
        accepted for it by `by`; an unreadable record is replaced. Audited. Raises TrustAcceptError when the
        key cannot be told."""
        key = keys.signing_keys(addr)
        async with self._writing, self._locks.hold(key, no_recheck):
            stored = await self.read(addr)
            self._check_available()
            record = stored.record or KeyRecord()
            fingerprint = record.resolve(given)
            if fingerprint is None:
                held = ", ".join(f"{k.key_id} ({fpr})" for fpr, k in record.held.items()) or "none"
                raise TrustAcceptError(
                    f"{given!r} names no key held or seen for {addr} (held: {held}); give the key's full "
                    "fingerprint (40 hex digits) to accept a key the proxy has not seen"
                )
            before = record.held.get(fingerprint) or record.known.get(fingerprint)
            accepted = KnownKey(
                before.key_id if before is not None else fingerprint[-16:],
                self.clock(),
                before.version if before is not None else "",
                by,
            )
            await self._write(key, record.with_known(fingerprint, accepted))
            self._check_available()  # a write the store did not take is no acceptance
        self.audit.write(
            "signing_key_accepted",
            provider=str(addr),
            fingerprint=fingerprint,
            key_id=accepted.key_id,
            by=by,
            replaced_unreadable_record=stored.unreadable,
        )
        log.warning("trust.key_accepted", provider=str(addr), fingerprint=fingerprint, key_id=accepted.key_id, by=by)
        return fingerprint, accepted

    def _check_available(self) -> None:
        problem = self._store.problem
        if problem is not None:
            raise TrustAcceptError(f"the metadata store is unavailable ({problem}): nothing was accepted")

    async def _write(self, key: str, record: KeyRecord) -> None:
        await self._store.set(key, record.encode())

    def _changed(
        self, addr: ProviderAddr, version: Version, fingerprint: str, change: KeyChange, *, unreadable: bool
    ) -> None:
        """Log, audit, count and keep for the page a key change, then refuse it in hold mode."""
        old = ", ".join(change.old) or "none"
        accept = f"{ACCEPT_COMMAND} {addr} {change.new}"
        if self._metrics is not None:
            self._metrics.signing_key_changes.labels(change.decision).inc()
        facts = {
            "provider": str(addr),
            "version": str(version),
            "old_keys": list(change.old),
            "new_key": change.new,
            "fingerprint": fingerprint,
            "decision": change.decision,
        }
        if unreadable:
            log.error("security.signing_key_changed", **facts, reason=f"the provider's key record: {old}")
        elif change.decision == "allow":
            log.info("security.signing_key_changed", **facts)
        else:
            log.warning("security.signing_key_changed", **facts, accept=accept)
        self.audit.write("signing_key_changed", **facts)
        detail = f"signed by {change.new}, earlier releases by {old}"
        self.recent.appendleft(
            KeyEvent(change.at, str(addr), str(version), change.old, change.new, change.decision, detail)
        )
        if change.decision == "hold":
            reason = (
                f"{addr} {version} is signed by key {change.new} ({fingerprint}), never seen for this provider, "
                f"whose earlier releases were signed by {old}; if the rotation is expected, accept it: `{accept}`"
            )
            raise SigningKeyChangedError(
                f"provider {addr} {version} is held by the policy's key-change: {reason}",
                rule="key-change",
                reason=reason,
            )

    def _refuse_unpinned(
        self, addr: ProviderAddr, version: Version, key_id: str, fingerprint: str, verdict: KeyVerdict
    ) -> None:
        pin = verdict.pin
        assert pin is not None
        allowed = ", ".join(sorted(pin.keys))
        signer = f"signed by key {key_id} ({fingerprint})" if fingerprint else "unsigned (no signing keys listed)"
        reason = f"{addr} {version} is {signer}: pin {pin.name} allows only {allowed}" + (
            f" ({pin.reason})" if pin.reason else ""
        )
        if self._metrics is not None:
            self._metrics.signing_key_changes.labels("unpinned").inc()
        facts = {"provider": str(addr), "version": str(version), "key_id": key_id, "fingerprint": fingerprint}
        log.error("security.signing_key_not_pinned", **facts, pin=pin.name)
        self.audit.write("signing_key_refused", **facts, pin=pin.name)
        self.recent.appendleft(
            KeyEvent(
                self.clock(), str(addr), str(version), tuple(sorted(pin.keys)), key_id or "none", "unpinned", reason
            )
        )
        raise SigningKeyNotPinnedError(
            f"provider {addr} {version} is refused by pin {pin.name}: {reason}", rule=f"pin {pin.name}", reason=reason
        )
