"""The verification chain for a provider archive, as the clients apply it (docs/protocol.md#verification-chain).

1. the signed SHA256SUMS has a line for `filename` whose digest equals the registry's `shasum`;
2. the archive's SHA-256 equals that digest;
3. (done by `gpg`) the detached signature over the raw SHA256SUMS bytes verifies with one
   of the registry's signing keys.
Pure: every failure raises VerificationError with a message naming what failed.
"""

from __future__ import annotations

from proxy.errors import ChecksumMismatchError, VerificationError
from proxy.hashes import HashFormatError, parse_shasums


def parse_signed_sums(document: bytes, source: str) -> dict[str, str]:
    """Parse a SHA256SUMS document whose signature has been verified."""
    try:
        return parse_shasums(document)
    except HashFormatError as exc:
        raise VerificationError(f"SHA256SUMS at {source} is malformed: {exc}") from None


def expected_digest(sums: dict[str, str], filename: str, shasum: str) -> str:
    """The digest the archive must have: the SHA256SUMS line, which must agree with `shasum`."""
    listed = sums.get(filename)
    if listed is None:
        raise VerificationError(f"the signed SHA256SUMS has no line for {filename}")
    if listed != shasum.lower():
        raise ChecksumMismatchError(
            f"the signed SHA256SUMS lists {listed} for {filename}, but the registry's shasum is {shasum.lower()}"
        )
    return listed


def check_archive_digest(actual: str, expected: str, filename: str) -> None:
    if actual != expected:
        raise ChecksumMismatchError(
            f"archive {filename} has SHA-256 {actual}, but the signed SHA256SUMS "
            f"lists {expected}: the download was tampered with or corrupted"
        )
