"""Signing-key continuity: which keys may sign a provider's releases. Pure: parse, record and decide, no I/O.

The clients trust whatever keys a registry's download document lists. A compromised registry (or a TLS
interception with a trusted corporate CA) can list a new key and sign anything with it. So the proxy
records, per provider, the fingerprints of the keys that signed its releases (`KeyRecord`, sealed in the
metadata store by `proxy.governance.signing_keys`), and the policy file says what happens when a release is
signed by a key never seen for its provider while earlier releases were signed by another:

    key-change = "warn"         # "hold": refused until `registry-proxy trust accept`; "allow": recorded only

    [[pin]]                     # the keys allowed for a set of providers, whatever key-change says
    name = "acme"
    providers = ["registry.example.com/acme/*"]        # HOST/NAMESPACE/TYPE globs
    keys = ["0123456789ABCDEF0123456789ABCDEF01234567"]  # full (40-hex) primary-key fingerprints

    default-pins = true         # false: the shipped pin (`DEFAULT_PINS`) is not in force

The first key seen for a provider is trusted on first use (a missing record cannot be told from a provider
never seen). A record that is present but fails its seal is a key change ("unreadable record"): held in
hold mode, loudly served in the others, never rewritten as if it were new.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from proxy.governance.globs import NAME, address_globs, compile_globs, one_line
from proxy.metadata_store import decode_record, encode_record

KEY_CHANGES = ("hold", "warn", "allow")
DEFAULT_KEY_CHANGE = "warn"
KEYS = frozenset({"key-change", "pin", "default-pins"})  # the policy file's top-level keys of this module
_PIN_KEYS = frozenset({"name", "providers", "keys", "reason"})
_FINGERPRINT = re.compile(r"^[0-9A-F]{40}\Z")
RECENT_CHANGES = 20  # key changes kept in a provider's record (newest last)

# HashiCorp's release signing key, the one Terraform embeds to mark the official tier: `HashicorpPublicKey` in
# hashicorp/terraform's internal/getproviders/public_keys.go ("also available at https://www.hashicorp.com/security").
# Its fingerprint, read by gpg from that armoured block (tests/data/hashicorp-public-key.asc), key id 34365D9472D7468F.
HASHICORP_FINGERPRINT = "C874011F0AB405110D02105534365D9472D7468F"


class KeyTrustError(ValueError):
    """A `key-change`, `default-pins` or `[[pin]]` of the policy file is malformed (one line, like PolicyError)."""


def normal_fingerprint(text: str) -> str | None:
    """A fingerprint as recorded (upper-case hex, spaces dropped), or None if `text` is not 40 hex digits."""
    cleaned = "".join(text.split()).upper().removeprefix("0X")
    return cleaned if _FINGERPRINT.match(cleaned) else None


@dataclass(frozen=True)
class Pin:
    """One `[[pin]]`: the only keys that may sign the releases of the providers its globs select."""

    name: str
    providers: re.Pattern[str]
    keys: frozenset[str]
    globs: tuple[str, ...]
    reason: str = ""

    def selects(self, address: str) -> bool:
        return self.providers.match(address) is not None


def _pin(name: str, globs: tuple[str, ...], keys: frozenset[str], reason: str = "") -> Pin:
    return Pin(name, compile_globs(globs), keys, globs, reason)


DEFAULT_PINS = (
    _pin(
        "hashicorp-official",
        ("registry.terraform.io/hashicorp/*",),
        frozenset({HASHICORP_FINGERPRINT}),
        "HashiCorp's official providers are signed by HashiCorp's release key (the key Terraform embeds)",
    ),
)


@dataclass(frozen=True)
class KeyTrust:
    """What the policy says about signing keys: the key-change mode, the pins, and whether the shipped ones
    count (after the file's own)."""

    key_change: str = DEFAULT_KEY_CHANGE
    pins: tuple[Pin, ...] = ()
    default_pins: bool = True

    @cached_property
    def in_force(self) -> tuple[Pin, ...]:
        """The pins in the order they are asked: the file's, then the shipped ones (unless switched off)."""
        return self.pins + (DEFAULT_PINS if self.default_pins else ())

    def pin_for(self, address: str) -> Pin | None:
        """The first pin that selects the provider `address` (`HOST/NAMESPACE/TYPE`), the file's before the
        shipped ones."""
        for pin in self.in_force:
            if pin.selects(address):
                return pin
        return None

    def describe(self) -> list[str]:
        """One line each (for `policy check`)."""
        lines = [f"key-change: {self.key_change}"]
        for pin in self.in_force:
            lines.append(f"pin {pin.name}: {', '.join(pin.globs)} signed by {', '.join(sorted(pin.keys))}")
        return lines


DEFAULT_TRUST = KeyTrust()


def parse_key_trust(data: Mapping[str, object], source: str) -> KeyTrust:
    """The signing-key part of a parsed policy file (its top-level `key-change`, `default-pins`, `[[pin]]`)."""
    mode = data.get("key-change", DEFAULT_KEY_CHANGE)
    if mode not in KEY_CHANGES:
        raise KeyTrustError(f'{source}: key \'key-change\': must be "hold", "warn" or "allow", not {mode!r}')
    default_pins = data.get("default-pins", True)
    if not isinstance(default_pins, bool):
        raise KeyTrustError(f"{source}: key 'default-pins': must be true or false")
    tables = data.get("pin", [])
    if not isinstance(tables, list):
        raise KeyTrustError(f"{source}: key 'pin': write each pin as a [[pin]] table")
    pins, names = [], set()
    for index, table in enumerate(tables, 1):
        pin = _parse_pin(source, index, table)
        if pin.name in names:
            raise KeyTrustError(f"{source}: pin {pin.name!r} (#{index}): key 'name': another pin has this name")
        names.add(pin.name)
        pins.append(pin)
    return KeyTrust(str(mode), tuple(pins), default_pins)


def _parse_pin(source: str, index: int, table: object) -> Pin:
    where = f"{source}: pin #{index}"
    if not isinstance(table, dict):
        raise KeyTrustError(f"{where}: must be a [[pin]] table")
    name = table.get("name", f"pin-{index}")
    if not isinstance(name, str) or not NAME.match(name):
        raise KeyTrustError(f"{where}: key 'name': use 1-64 letters, digits, '_', '-', '.'")
    where = f"{source}: pin {name!r} (#{index})"
    unknown = set(table) - _PIN_KEYS
    if unknown:
        raise KeyTrustError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_PIN_KEYS))})")
    malformed = KeyTrustError(f"{where}: key 'providers': must be a list of HOST/NAMESPACE/TYPE globs")
    globs = address_globs(table.get("providers"), 3, "HOST/NAMESPACE/TYPE", lambda _why: malformed)
    if globs is None:
        raise malformed
    given = table.get("keys")
    if not isinstance(given, list) or not given or not all(isinstance(k, str) for k in given):
        raise KeyTrustError(f"{where}: key 'keys': must be a list of key fingerprints (40 hex digits each)")
    keys = set()
    for text in given:
        fingerprint = normal_fingerprint(text)
        if fingerprint is None:
            raise KeyTrustError(
                f"{where}: key 'keys': {text!r} is not a full fingerprint (40 hex digits; a 16-digit key id is "
                "not enough: another key can have it)"
            )
        keys.add(fingerprint)
    reason = table.get("reason", "")
    if not isinstance(reason, str):
        raise KeyTrustError(f"{where}: key 'reason': must be a string")
    return _pin(name, globs, frozenset(keys), one_line(reason))


# ---- the record of a provider's keys ----------------------------------------------------------------


@dataclass(frozen=True)
class KnownKey:
    """A key that signed a provider's releases (or was accepted for it): since when, first for which version,
    and who accepted it (empty: seen, trusted on first use or in warn/allow mode)."""

    key_id: str
    since: float
    version: str = ""
    accepted_by: str = ""


@dataclass(frozen=True)
class KeyChange:
    """A release signed by a key never seen for its provider: what was decided (`hold`, `warn`, `allow`)."""

    at: float
    version: str
    old: tuple[str, ...]  # key ids known before ("unreadable record": the record failed its seal)
    new: str  # the new key's id
    fingerprint: str
    decision: str


@dataclass(frozen=True)
class KeyRecord:
    """A provider's keys: those known (fingerprint → `KnownKey`), those held back in hold mode (so `trust
    accept` can name them by key id), and the last changes."""

    known: dict[str, KnownKey] = field(default_factory=dict)
    held: dict[str, KnownKey] = field(default_factory=dict)
    changes: tuple[KeyChange, ...] = ()

    def with_known(self, fingerprint: str, key: KnownKey) -> KeyRecord:
        held = {fpr: k for fpr, k in self.held.items() if fpr != fingerprint}
        return replace(self, known={**self.known, fingerprint: key}, held=held)

    def with_held(self, fingerprint: str, key: KnownKey) -> KeyRecord:
        return replace(self, held={**self.held, fingerprint: key})

    def with_change(self, change: KeyChange) -> KeyRecord:
        return replace(self, changes=(*self.changes, change)[-RECENT_CHANGES:])

    def key_ids(self) -> tuple[str, ...]:
        return tuple(key.key_id for key in self.known.values())

    def resolve(self, given: str) -> str | None:
        """The fingerprint `given` names: a full fingerprint, or the key id (16 hex) of a known or held key."""
        fingerprint = normal_fingerprint(given)
        if fingerprint is not None:
            return fingerprint
        key_id = "".join(given.split()).upper()
        matches = {fpr for fpr in (*self.known, *self.held) if fpr.endswith(key_id) and len(key_id) >= 16}
        return matches.pop() if len(matches) == 1 else None

    def encode(self) -> bytes:
        def key(k: KnownKey) -> dict:
            return {"key_id": k.key_id, "since": k.since, "version": k.version, "accepted_by": k.accepted_by}

        return encode_record(
            {
                "v": 1,
                "known": {fpr: key(k) for fpr, k in self.known.items()},
                "held": {fpr: key(k) for fpr, k in self.held.items()},
                "changes": [
                    {
                        "at": c.at,
                        "version": c.version,
                        "old": list(c.old),
                        "new": c.new,
                        "fingerprint": c.fingerprint,
                        "decision": c.decision,
                    }
                    for c in self.changes
                ],
            }
        )


def read_key_record(raw: bytes | None) -> KeyRecord | None:
    """A stored record (None: missing, or not a record this proxy wrote)."""
    data = decode_record(raw)
    if data is None or data.get("v") != 1:
        return None
    try:
        known = {str(fpr): _known(k) for fpr, k in data["known"].items()}
        held = {str(fpr): _known(k) for fpr, k in data.get("held", {}).items()}
        changes = tuple(
            KeyChange(
                float(c["at"]),
                str(c["version"]),
                tuple(str(o) for o in c["old"]),
                str(c["new"]),
                str(c["fingerprint"]),
                str(c["decision"]),
            )
            for c in data.get("changes", [])
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not all(normal_fingerprint(fpr) == fpr for fpr in (*known, *held)):
        return None
    return KeyRecord(known, held, changes)


def _known(value: Mapping[str, object]) -> KnownKey:
    return KnownKey(
        str(value["key_id"]), float(value["since"]), str(value.get("version", "")), str(value.get("accepted_by", ""))
    )


# ---- the decision ---------------------------------------------------------------------------------------

UNREADABLE = "unreadable record"


@dataclass(frozen=True)
class KeyVerdict:
    """What a release's signing key means for its provider.

    `kind`: `known` (a key seen or accepted before), `first` (no record: trusted on first use), `changed` (a
    key never seen, earlier releases signed by another, or the record unreadable), `pinned` (a pin selects
    the provider and lists the key), `unpinned` (a pin selects it and does not list the key: refused).
    `decision`: `allow`, `warn` or `hold` (`hold` and `unpinned` refuse)."""

    kind: str
    decision: str
    pin: Pin | None = None
    old: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return self.decision == "hold"


def judge(trust: KeyTrust, address: str, fingerprint: str, record: KeyRecord | None, *, unreadable: bool) -> KeyVerdict:
    """The verdict on a release of the provider `address` signed by `fingerprint`, given its provider's record
    (`unreadable`: a record is stored but failed its seal or does not parse)."""
    pin = trust.pin_for(address)
    if pin is not None:
        if fingerprint in pin.keys:
            return KeyVerdict("pinned", "allow", pin)
        return KeyVerdict("unpinned", "hold", pin)
    if unreadable:
        return KeyVerdict("changed", trust.key_change, old=(UNREADABLE,))
    if record is None or not record.known:
        return KeyVerdict("first", "allow")
    if fingerprint in record.known:
        return KeyVerdict("known", "allow")
    return KeyVerdict("changed", trust.key_change, old=record.key_ids())
