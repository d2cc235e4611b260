"""The verification chain of a provider package, assembled once (docs/protocol.md#verification-chain).

As the clients apply it (OpenTofu's getproviders/package_authentication.go), in order:

1. admission: a release whose registry lists no signing keys is refused, unless `--unsigned-providers`
   admits its host and both its download answer and its SHA256SUMS came over TLS (`proxy.domain.unsigned_policy`).
   `admit` (a package before anything of it is fetched) and `admit_stored` (a stored archive before it
   is served) go through the one place where a provider version and platform is admitted;
2. the signature: the detached signature over the raw SHA256SUMS bytes verifies with one of the
   registry's signing keys (`proxy.providers.signatures`), and the document parses (`SignedSums`);
3. the file's line: the signed SHA256SUMS lists the package's file name with the `zh:` hash the
   registry's `shasum` names (`expected`);
4. the archive: its SHA-256 is that line (`check_archive`; a relay that resumes after bytes sent
   already also checks those, `check_sent`);
5. its hashes: both `h1:` forms of the archive, a readable zip (`archive_hashes`), with the `zh:` of
   step 3: a `PackageHashes`, which becomes the archive's record.

A stored archive is held to the same facts before it is served (`admit_stored`, `agrees`). Every
refusal is a VerificationError naming what failed; given metrics, it is also logged and counted as
a security event (`proxy.runtime.security_events`). Used by the provider service (`proxy.providers.mirror` and its
parts), bundle import (`proxy.commands.bundle`) and `registry-proxy verify` (`proxy.commands.verify`).
`verify_sums` and `archive_hashes` block (gpg, file reads): call them from a worker thread on the
event loop.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import structlog

from proxy.domain.addresses import Platform, ProviderAddr, Version
from proxy.domain.hashes import Hash, HashFormatError, h1_of_zip, parse_shasums
from proxy.domain.unsigned_policy import UnsignedPolicy
from proxy.domain.ziphash import StreamedZipMismatchError, ZipStreamHasher, h1_of_streamed_zip
from proxy.errors import ChecksumMismatchError, SignatureInvalidError, UnsignedRefusedError, VerificationError
from proxy.metadata_store.records import ArchiveRecord, SumsRecord
from proxy.protocol.provider_registry import DownloadInfo
from proxy.providers.signatures import SignatureError, SignatureResult
from proxy.runtime.metrics import Metrics
from proxy.runtime.security_events import security_event

log = structlog.get_logger(__name__)


class Signer(Protocol):
    """Verifies detached OpenPGP signatures (`proxy.providers.signatures.Keyring`)."""

    def verify_detached(self, data: bytes, signature: bytes, armored_keys: list[str]) -> SignatureResult: ...


@dataclass(frozen=True)
class SignedSums:
    """A release's SHA256SUMS once its signature verified: each file's `zh:` hash and the key that signed it
    (`unsigned`: admitted without keys, checked only against TLS and the registry's `shasum`)."""

    lines: Mapping[str, Hash]
    key_id: str = ""
    fingerprint: str = ""
    unsigned: bool = False

    @property
    def hashes(self) -> frozenset[Hash]:
        """The `zh:` hash of every file of the release (every platform's, as lock files record them)."""
        return frozenset(self.lines.values())

    def listed(self, d: DownloadInfo) -> Hash | None:
        """The hash the document lists for the package, if it agrees with the registry's `shasum`."""
        listed = self.lines.get(d.filename)
        return listed if listed == d.shasum else None


@dataclass(frozen=True)
class PackageHashes:
    """What the chain established for one package: its `zh:` (its line in the signed SHA256SUMS, which
    its SHA-256 matched) and both `h1:` forms of its archive (the zip's entries, the unpacked files)."""

    zh: Hash
    h1_zip: Hash
    h1_dir: Hash

    def record(self, size: int, filename: str, *, unsigned: bool) -> ArchiveRecord:
        """The archive's record in the metadata store."""
        return ArchiveRecord(self.zh.sha256, size, filename, str(self.h1_zip), str(self.h1_dir), unsigned=unsigned)

    @staticmethod
    def zh_of(record: ArchiveRecord) -> Hash | None:
        """The `zh:` hash of a recorded archive (None if its digest does not parse)."""
        try:
            return Hash.zh(record.sha256)
        except HashFormatError:
            return None

    @classmethod
    def of_record(cls, record: ArchiveRecord) -> PackageHashes | None:
        """The hashes an archive record holds (None if they do not parse: no record this proxy wrote)."""
        try:
            return cls(Hash.zh(record.sha256), Hash.parse(record.h1_zip), Hash.parse(record.h1_dir))
        except HashFormatError:
            return None


class VerificationChain:
    """The checks of a provider package, in the order the clients apply them (see the module docstring)."""

    def __init__(self, signer: Signer, policy: UnsignedPolicy, metrics: Metrics | None = None) -> None:
        self._signer = signer
        self.policy = policy
        self._metrics = metrics

    # ---- 1. admission -------------------------------------------------------------------------

    def admit(self, addr: ProviderAddr, version: Version, d: DownloadInfo) -> None:
        """Admit a package its registry's download document describes, before anything of it is fetched:
        a release whose registry lists no signing keys only if the policy admits its host and both its
        download answer and its SHA256SUMS came over TLS (verified, as every upstream connection is). A
        registry that lists keys always needs a valid signature (`verify_sums`)."""
        over_tls = all(url is not None and url.scheme == "https" for url in (d.document_url, d.shasums_url))
        self._admit(addr, version, d.platform, d.filename, unsigned=d.unsigned, over_tls=over_tls, stored=False)

    def admit_stored(self, addr: ProviderAddr, version: Version, platform: Platform, record: ArchiveRecord) -> None:
        """Admit a stored archive before it is served: a stored unsigned archive whose host the policy no
        longer admits is refused (it came over TLS, or it would not have been stored)."""
        self._admit(addr, version, platform, record.filename, unsigned=record.unsigned, over_tls=True, stored=True)

    def _admit(
        self,
        addr: ProviderAddr,
        version: Version,
        platform: Platform,
        filename: str,
        *,
        unsigned: bool,
        over_tls: bool,
        stored: bool,
    ) -> None:
        """The one place where a provider version and platform is admitted, fetched or stored (a policy
        engine deciding per provider, version and platform belongs here)."""
        if not unsigned:
            return
        reason = None
        if not self.policy.allows(addr.hostname) and stored:
            reason = (
                f"the stored archive {filename} of {addr} {version} is unsigned (its registry lists no "
                f"signing keys), and unsigned providers from {addr.hostname} are refused "
                f"(--unsigned-providers {self.policy})"
            )
        elif not self.policy.allows(addr.hostname):
            reason = (
                f"the registry lists no signing keys for {addr} {version}: unsigned providers from "
                f"{addr.hostname} are refused (--unsigned-providers {self.policy})"
            )
        elif not over_tls:
            reason = (
                f"the registry lists no signing keys for {addr} {version}, and its download answer or "
                "SHA256SUMS did not come over https: without a signature, TLS is all that vouches for them"
            )
        if reason is not None:
            self._refuse("unsigned", addr, version, platform, filename, reason, UnsignedRefusedError)

    # ---- 2. the signature ---------------------------------------------------------------------

    def verify_sums(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, sums: bytes, signature: bytes
    ) -> SignedSums:
        """The release's SHA256SUMS, once its signature verified with the registry's keys (an admitted unsigned
        release: parsed only). Blocking (gpg). Raises OSError when gpg finds no room (the caller tells a full
        disk from other failures)."""
        self.admit(addr, version, d)
        if d.unsigned:
            return SignedSums(self._lines(sums, d), unsigned=True)
        try:
            signed = self._signer.verify_detached(sums, signature, list(d.signing_keys))
        except SignatureError as exc:
            reason = f"SHA256SUMS of {addr} {version} failed verification: {exc}"
            self._refuse_download("signature", addr, version, d, reason, SignatureInvalidError)
        return SignedSums(self._lines(sums, d), signed.key_id, signed.fingerprint)

    def recorded_sums(self, d: DownloadInfo, record: SumsRecord) -> SignedSums:
        """The SHA256SUMS of a record written once it verified (`sums_record`): parsed, not verified again."""
        return SignedSums(self._lines(record.sums, d), record.key_id, record.fingerprint, record.unsigned)

    @staticmethod
    def sums_record(sums: SignedSums, document: bytes, signature: bytes) -> SumsRecord:
        """What is kept of a verified SHA256SUMS: the document and signature as fetched, and who signed."""
        return SumsRecord(document, signature, sums.key_id, sums.fingerprint, unsigned=sums.unsigned)

    @staticmethod
    def _lines(document: bytes, d: DownloadInfo) -> dict[str, Hash]:
        try:
            return parse_shasums(document)
        except HashFormatError as exc:
            raise VerificationError(f"SHA256SUMS at {d.shasums_url} is malformed: {exc}") from None

    # ---- 3. the file's line -------------------------------------------------------------------

    def expected(self, addr: ProviderAddr, version: Version, d: DownloadInfo, sums: SignedSums) -> Hash:
        """The `zh:` hash the archive must have: its line in the signed SHA256SUMS, which must agree with the
        registry's `shasum`."""
        listed = sums.lines.get(d.filename)
        if listed is None:
            reason = f"the signed SHA256SUMS has no line for {d.filename}"
            self._refuse_download("shasums_line", addr, version, d, reason)
        if listed != d.shasum:
            reason = (
                f"the signed SHA256SUMS lists {listed.value} for {d.filename}, but the registry's shasum is "
                f"{d.shasum.value}"
            )
            self._refuse_download("shasums_line", addr, version, d, reason, ChecksumMismatchError)
        return listed

    # ---- 4. the archive -----------------------------------------------------------------------

    def check_archive(self, addr: ProviderAddr, version: Version, d: DownloadInfo, sha256: str, expected: Hash) -> None:
        """The archive's SHA-256 (hex) must be its line of the signed SHA256SUMS."""
        if sha256 != expected.sha256:
            reason = (
                f"archive {d.filename} has SHA-256 {sha256}, but the signed SHA256SUMS lists {expected.sha256}: "
                "the download was tampered with or corrupted"
            )
            self._refuse_download("archive", addr, version, d, reason, ChecksumMismatchError)

    def check_sent(
        self, addr: ProviderAddr, version: Version, d: DownloadInfo, length: int, sha256: str, sent_sha256: str
    ) -> None:
        """A relay that resumes after `length` bytes a client has already: the upstream's first `length` bytes
        (their SHA-256, `sha256`) must be the ones sent (`sent_sha256`), or the client would end up with a
        mix of two downloads."""
        if sha256 != sent_sha256:
            reason = (
                f"the first {length} bytes of {d.filename} sent from the failed download are not the "
                "upstream's first bytes: the download was tampered with or corrupted"
            )
            self._refuse_download("archive", addr, version, d, reason, ChecksumMismatchError)

    # ---- 5. the hashes ------------------------------------------------------------------------

    def archive_hashes(
        self,
        addr: ProviderAddr,
        version: Version,
        d: DownloadInfo,
        path: Path,
        expected: Hash,
        streamed: ZipStreamHasher | None = None,
    ) -> PackageHashes:
        """The package's hashes, its archive at `path` already checked against `expected`: both `h1:` forms
        from the digests `streamed` while it downloaded once its central directory confirms them, else by
        reading the whole file. A file that is not a readable zip fails verification. Blocking."""
        if streamed is not None:
            streamed.finish()
            try:
                with open(path, "rb") as handle:
                    hashes = PackageHashes(expected, *h1_of_streamed_zip(streamed, handle))
            except (StreamedZipMismatchError, OSError) as exc:
                log.debug("archive.h1_not_streamed", file=path.name, reason=str(exc))
            else:
                log.debug("archive.h1_streamed", file=path.name, members=len(streamed.entries))
                return hashes
        try:
            with open(path, "rb") as handle:
                return PackageHashes(expected, *h1_of_zip(handle))
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
            self._refuse_download("archive", addr, version, d, f"archive is not a valid zip file: {exc}")

    # ---- a stored archive -----------------------------------------------------------------------

    @staticmethod
    def agrees(record: ArchiveRecord, d: DownloadInfo, sums: SignedSums) -> bool:
        """Whether an archive record names the file, digest and signing state that the release's verified
        SHA256SUMS lists for its download (defence in depth behind the sealed metadata store)."""
        listed = sums.listed(d)
        return (listed, d.filename, d.unsigned) == (PackageHashes.zh_of(record), record.filename, record.unsigned)

    def _refuse_download(
        self,
        check: str,
        addr: ProviderAddr,
        version: Version,
        d: DownloadInfo,
        reason: str,
        error: type[VerificationError] = VerificationError,
    ) -> NoReturn:
        self._refuse(check, addr, version, d.platform, d.filename, reason, error)

    def _refuse(
        self,
        check: str,
        addr: ProviderAddr,
        version: Version,
        platform: Platform,
        filename: str,
        reason: str,
        error: type[VerificationError] = VerificationError,
    ) -> NoReturn:
        if self._metrics is not None:
            security_event(
                self._metrics,
                check,
                addr,
                version=str(version),
                platform=str(platform),
                filename=filename,
                reason=reason,
            )
        raise error(reason)
