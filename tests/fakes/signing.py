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

    def __init__(self, home: Path, name: str) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._gpg("--quick-generate-key", "--passphrase", "", f"{name} <{name}@example.test>",
                  "rsa2048", "sign", "never")
        listing = self._gpg("--list-keys", "--with-colons").decode()
        self.fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        self.key_id = self.fingerprint[-16:]
        self.armored_public_key = self._gpg("--armor", "--export", self.fingerprint).decode()

    def close(self) -> None:
        """Stop the gpg-agent that signing started for this home."""
        stop_gpg_agent(self.home)

    def sign(self, data: bytes) -> bytes:
        return self._gpg("--detach-sign", "--local-user", self.fingerprint, input_=data)

    def _gpg(self, *args: str, input_: bytes | None = None) -> bytes:
        command = ["gpg", "--batch", "--yes", "--no-tty", "--pinentry-mode", "loopback",
                   "--homedir", str(self.home), *args]
        return subprocess.run(command, input=input_, capture_output=True, check=True).stdout
