"""`registry-proxy trust accept ADDRESS KEY_ID` and `registry-proxy trust list ADDRESS`: a provider's signing keys.

Both open the metadata store `serve` uses (sealed with the same secret, Redis for a fleet) and work on the
provider's record through `proxy.governance.signing_keys.SigningKeys`, under the fleet lock of its key.
"""

from __future__ import annotations

import argparse
import getpass
import os

from proxy.commands import CommandError
from proxy.domain.addresses import AddressError, ProviderAddr
from proxy.governance.audit import AuditLog
from proxy.governance.policy import utc_timestamp
from proxy.governance.signing_keys import SigningKeys, TrustAcceptError
from proxy.metadata_store.embedded import FAILURES as EMBEDDED_FAILURES
from proxy.metadata_store.factory import open_metadata_store
from proxy.metadata_store.redis import FAILURES as REDIS_FAILURES
from proxy.settings.config import Settings


async def run_trust(args: argparse.Namespace, settings: Settings) -> int:
    try:
        addr = ProviderAddr.parse(*_parts(args.address))
    except AddressError as exc:
        raise CommandError(str(exc)) from None
    store, locks = await open_metadata_store(settings)
    try:
        await store.require_fleet()  # another fleet's secret: exit 2, nothing read or accepted
    except BaseException:
        await store.close()
        raise
    audit = AuditLog.open(settings.policy.audit_log)
    try:
        signing = SigningKeys(store, locks, audit=audit)
        if args.trust_command == "accept":
            if not args.key_id:
                raise CommandError("trust accept needs the KEY_ID (or fingerprint) to accept")
            by = args.by or f"cli:{os.environ.get('SUDO_USER') or getpass.getuser()}"
            fingerprint, key = await signing.accept(addr, args.key_id, by)
            print(f"accepted key {key.key_id} ({fingerprint}) for {addr}, by {by}")
            return 0
        stored = await signing.read(addr)
    except TrustAcceptError as exc:
        raise CommandError(str(exc)) from None
    except (*REDIS_FAILURES, *EMBEDDED_FAILURES) as exc:
        raise CommandError(f"the metadata store could not be used ({exc})") from None
    finally:
        audit.close()
        await store.close()
    if stored.unreadable:
        print(f"{addr}: the record of signing keys cannot be read (a wrong --metadata-secret, or it was edited)")
        return 1
    record = stored.record
    if record is None:
        print(f"{addr}: no signing key recorded yet (the first release verified records its key)")
        return 0
    print(f"{addr}:")
    for fingerprint, key in record.known.items():
        how = f"accepted by {key.accepted_by}" if key.accepted_by else f"seen first with {key.version or '?'}"
        print(f"  key {key.key_id} {fingerprint}: {how}, {utc_timestamp(key.since)}")
    for fingerprint, key in record.held.items():
        print(f"  HELD key {key.key_id} {fingerprint}: signed {key.version}, {utc_timestamp(key.since)}")
    for change in record.changes:
        old = ", ".join(change.old) or "none"
        when = utc_timestamp(change.at)
        print(f"  change {when}: {change.version} signed by {change.new} (before: {old}): {change.decision}")
    return 0


def _parts(address: str) -> list[str]:
    parts = address.split("/")
    if len(parts) != 3:
        raise AddressError(f"{address!r}: expected a provider address, HOST/NAMESPACE/TYPE")
    return parts
