"""Real OpenPGP keys for tests, made with the `gpg` binary in a throwaway home."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def stop_gpg_agent(home: Path) -> None:
    """Stop the gpg daemons that gpg started for `home` (before `home` is deleted)."""
    gpgconf = shutil.which("gpgconf")
    if gpgconf is not None and home.is_dir():
        subprocess.run([gpgconf, "--homedir", str(home), "--kill", "all"], capture_output=True, timeout=10)


class SigningKey:
    """An RSA signing key in its own GnuPG home; signs detached, binary signatures."""

    def __init__(
        self, home: Path, name: str, *, algorithm: str = "rsa2048", expires: str = "never", made_at: str | None = None
    ) -> None:
        """`made_at` (gpg's `--faked-system-time`, e.g. "20200101T000000"): the key is made, and
        signs, at that time; with `expires` (e.g. "1d") it can be long expired today."""
        self.home = home
        self._clock = ("--faked-system-time", made_at) if made_at else ()
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._gpg(
            "--quick-generate-key", "--passphrase", "", f"{name} <{name}@example.test>", algorithm, "sign", expires
        )
        listing = self._gpg("--list-keys", "--with-colons").decode()
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        self.key_id = self.fingerprint[-16:]
        self.armored_public_key = self._gpg("--armor", "--export", self.fingerprint).decode()
        self._signatures: dict[bytes, bytes] = {}

    def close(self) -> None:
        """Stop the gpg-agent that signing started for this home."""
        stop_gpg_agent(self.home)

    def sign(self, data: bytes) -> bytes:
        """A detached signature of `data`. The same bytes signed again get the first signature (as valid
        as a new one): the session's keys sign the same few SHA256SUMS in hundreds of tests, and a gpg
        run costs tens of milliseconds."""
        if data not in self._signatures:
            self._signatures[data] = self._gpg("--detach-sign", "--local-user", self.fingerprint, input_=data)
        return self._signatures[data]

    def revoke(self) -> None:
        """Revoke the key with the certificate gpg made with it; `armored_public_key` then carries it."""
        certificate = (self.home / "openpgp-revocs.d" / f"{self.fingerprint}.rev").read_text()
        self._gpg("--import", input_=certificate.replace(":-----BEGIN", "-----BEGIN").encode())
        self._signatures.clear()  # a signature asked for from now on is made by the revoked key
        self.armored_public_key = self._gpg("--armor", "--export", self.fingerprint).decode()

    def _gpg(self, *args: str, input_: bytes | None = None) -> bytes:
        command = [
            "gpg",
            "--batch",
            "--yes",
            "--no-tty",
            "--pinentry-mode",
            "loopback",
            "--homedir",
            str(self.home),
            *self._clock,
            *args,
        ]
        return subprocess.run(command, input=input_, capture_output=True, check=True).stdout
