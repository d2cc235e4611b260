"""The only module that touches OpenPGP: verify a detached signature against given keys.

Keys come from the upstream's `signing_keys` and are imported into a private keyring
inside the data directory (never the user's). A signature is accepted only when it is
cryptographically valid *and* was made by one of the keys handed in for this check, so
keys imported for one provider can never vouch for another. Expired keys are tolerated,
as the clients tolerate them; revoked keys are not.

A key block is imported once per process (the same armored text gives the same keys; a keyring
that lost them since is noticed by the verification, which then imports them again), so a
verification usually costs one gpg process, and `import_quietly` lets callers import the keys
while they fetch the signed document.

Importing public keys and verifying need no secret keys, so gpg runs with `--no-autostart`:
it never starts a `gpg-agent` (one per home, which outlived the proxy). `close()` stops any
daemon an earlier version or an operator left running for the home.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import gnupg
import structlog

log = structlog.get_logger(__name__)


class SignatureError(Exception):
    """The signature did not verify with any of the given keys."""


@dataclass(frozen=True)
class SignatureResult:
    key_id: str
    fingerprint: str


class Keyring:
    """A private GnuPG home used only for verification. Blocking: call from a worker thread."""

    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(home, 0o700)
        self._home = home
        self._gpg = gnupg.GPG(gnupghome=str(home), options=["--no-autostart"])
        self._gpg.encoding = "utf-8"
        self._import_lock = threading.Lock()
        self._imported: dict[str, frozenset[str]] = {}  # SHA-256 of an armored block: its fingerprints

    def close(self) -> None:
        """Stop any gpg daemon (agent, keyboxd, dirmngr) running for this home; never starts one."""
        try:
            subprocess.run(
                ["gpgconf", "--homedir", str(self._home), "--kill", "all"], capture_output=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("gpg.close_failed", home=str(self._home), error=str(exc))

    def import_keys(self, armored_keys: list[str], *, again: bool = False) -> set[str]:
        """Import public keys; returns the primary fingerprints that were in the given blocks.
        A block imported before is not imported again unless `again`."""
        fingerprints: set[str] = set()
        with self._import_lock:
            for armor in armored_keys:
                digest = hashlib.sha256(armor.encode()).hexdigest()
                known = None if again else self._imported.get(digest)
                if known is None:
                    started = time.monotonic()
                    result = self._gpg.import_keys(armor)
                    log.debug("gpg.imported", seconds=round(time.monotonic() - started, 4))
                    if not result.fingerprints and "No space left on device" in (result.stderr or ""):
                        raise OSError(errno.ENOSPC, f"no space left for the keyring in {self._home}")
                    known = frozenset(fp.upper() for fp in result.fingerprints if fp)
                    if known:
                        self._imported[digest] = known
                fingerprints.update(known)
        return fingerprints

    def import_quietly(self, armored_keys: list[str]) -> None:
        """`import_keys` ahead of a verification, errors left for the verification to raise."""
        try:
            self.import_keys(armored_keys)
        except Exception as exc:  # verify_detached imports again and reports it
            log.debug("gpg.early_import_failed", error=str(exc))

    def verify_detached(self, data: bytes, signature: bytes, armored_keys: list[str]) -> SignatureResult:
        """Verify `signature` over `data` with one of `armored_keys`, or raise SignatureError."""
        allowed = self.import_keys(armored_keys)
        if not allowed:
            raise SignatureError("none of the upstream's signing keys could be read as an OpenPGP public key")
        verified = self._verify(data, signature)
        if verified.status == "no public key":  # the keyring lost keys imported earlier: import them again
            self.import_keys(armored_keys, again=True)
            verified = self._verify(data, signature)
        if verified.status != "signature valid":  # set only by gpg's VALIDSIG: the signature is good
            if verified.status == "no public key":
                reason = f"signed by unknown key {verified.key_id}"
            else:
                reason = verified.status or "no valid OpenPGP signature found"
            raise SignatureError(f"signature verification failed: {reason}")
        if getattr(verified, "key_status", None) == "signing key was revoked":
            raise SignatureError(f"signature verification failed: key {verified.key_id} is revoked")
        primary = (verified.pubkey_fingerprint or verified.fingerprint or "").upper()
        if primary not in allowed:
            raise SignatureError(
                f"signed by key {verified.key_id or primary}, which is not among the upstream's signing keys"
            )
        return SignatureResult(key_id=verified.key_id or primary[-16:], fingerprint=primary)

    def _verify(self, data: bytes, signature: bytes) -> gnupg.Verify:
        """`signature` goes through a file of its own (gpg reads the data from stdin), removed whatever happens:
        a `NamedTemporaryFile` whose closing flush fails (a full disk) is left to the garbage collector."""
        descriptor, path = tempfile.mkstemp(dir=self._home, prefix="sig-", suffix=".sig")
        try:
            with open(descriptor, "wb") as sig_file:
                sig_file.write(signature)
            started = time.monotonic()
            verified = self._gpg.verify_data(path, data)
            log.debug("gpg.verified", seconds=round(time.monotonic() - started, 4), status=verified.status)
            return verified
        finally:
            os.unlink(path)
