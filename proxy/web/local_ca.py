"""A local certificate authority for running without `--tls-cert`.

On first start the proxy creates a CA and a server certificate in `DATA_DIR/tls/` and
reuses them afterwards; the server certificate is renewed when it nears expiry or when
the names it must cover change. Users trust `ca.pem` in the OS store, or point SSL_CERT_FILE
at `ca-bundle.pem`: this host's trusted roots plus the CA, rewritten on every start, so a shell
that trusts the proxy still trusts every other HTTPS server (SSL_CERT_FILE replaces the
system's bundle; set to `ca.pem` alone, other registries would fail).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from proxy.settings.config import CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY

CA_VALIDITY = dt.timedelta(days=3650)
SERVER_VALIDITY = dt.timedelta(days=397)
RENEW_BEFORE = dt.timedelta(days=30)
BUNDLE_NAME = "ca-bundle.pem"
# Where systems keep their bundle of trusted roots, in the order Go's crypto/x509 (terraform, tofu) tries them.
SYSTEM_BUNDLES = (
    Path("/etc/ssl/certs/ca-certificates.crt"),  # Debian, Ubuntu, Alpine, Arch
    Path("/etc/pki/tls/certs/ca-bundle.crt"),  # Fedora, RHEL
    Path("/etc/ssl/ca-bundle.pem"),  # openSUSE
    Path("/etc/pki/tls/cacert.pem"),  # OpenELEC
    Path("/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem"),  # CentOS, RHEL 7
    Path("/etc/ssl/cert.pem"),  # Alpine, the BSDs
)
_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+?-----END CERTIFICATE-----")


@dataclass(frozen=True)
class LocalTLS:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    created: bool
    ca_bundle: Path  # the system's roots and the CA: what clients' SSL_CERT_FILE should name
    system_roots: Path | None  # the bundle the system's roots came from (None: none found, only the CA)


def ensure_local_tls(directory: Path, names: list[str]) -> LocalTLS:
    """Create (or reuse) the local CA and a server certificate valid for `names`.

    Replicas sharing one data dir may start together: a file lock makes one create the CA.
    """
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_locked(directory, names)


def _ensure_locked(directory: Path, names: list[str]) -> LocalTLS:
    ca_cert_path, ca_key_path = directory / CA_CERT, directory / CA_KEY
    cert_path, key_path = directory / SERVER_CERT, directory / SERVER_KEY
    created = False
    if not (ca_cert_path.exists() and ca_key_path.exists()):
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_cert = _build_ca(ca_key)
        _write_private(ca_key_path, ca_key)
        ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        cert_path.unlink(missing_ok=True)
        created = True
    ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    if created or _needs_new_server_cert(cert_path, key_path, names):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _build_server(key, ca_cert, ca_key, names)
        _write_private(key_path, key)
        cert_path.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(serialization.Encoding.PEM)
        )
        created = True
    bundle_path, system = directory / BUNDLE_NAME, system_roots(ca_cert_path, directory / BUNDLE_NAME)
    write_bundle(bundle_path, system, ca_cert_path.read_bytes())
    return LocalTLS(ca_cert_path, cert_path, key_path, created, bundle_path, system)


def pem_certificates(data: bytes) -> list[bytes]:
    """The PEM certificate blocks of a file, each as it stands (other blocks and comments left out)."""
    return _PEM_CERTIFICATE.findall(data)


def _body(block: bytes) -> bytes:
    """A PEM block without its line breaks, for comparing two spellings of one certificate."""
    return b"".join(block.split())


def root_bundle_candidates() -> list[str | Path | None]:
    """Where this host's trusted roots may be, in order: SSL_CERT_FILE (it replaces the system's bundle, for
    OpenSSL and Go alike), OpenSSL's default file, then SYSTEM_BUNDLES."""
    paths = ssl.get_default_verify_paths()
    return [os.environ.get(paths.openssl_cafile_env), paths.openssl_cafile, *SYSTEM_BUNDLES]


def system_roots(own_ca: Path, own_bundle: Path, candidates: list[str | Path | None] | None = None) -> Path | None:
    """The bundle of roots this host trusts by default: the first readable of `candidates`
    (`root_bundle_candidates()`) that holds a certificate. The proxy's own bundle is skipped, and so is a
    file holding no certificate but the proxy's CA (an SSL_CERT_FILE set to a copy of `ca.pem`), so the
    bundle never loses the system's roots."""
    own = {_body(block) for block in pem_certificates(own_ca.read_bytes())}
    for candidate in root_bundle_candidates() if candidates is None else candidates:
        if not candidate:
            continue
        path = Path(candidate)
        try:
            if path.resolve() == own_bundle.resolve():
                continue
            blocks = pem_certificates(path.read_bytes())
        except OSError:
            continue
        if any(_body(block) not in own for block in blocks):
            return path
    return None


def write_bundle(path: Path, system: Path | None, ca_pem: bytes) -> None:
    """`path`: every certificate of `system` and then the CA (once), readable by all (certificates are public);
    replaced atomically, and only when its content changes."""
    blocks = pem_certificates(system.read_bytes()) if system is not None else []
    seen = {_body(block) for block in blocks}
    blocks += [block for block in pem_certificates(ca_pem) if _body(block) not in seen]
    content = b"".join(block + b"\n" for block in blocks)
    try:
        if path.read_bytes() == content:
            return
    except OSError:
        pass
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
    os.replace(temporary, path)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _build_ca(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "registry-proxy"),
            x509.NameAttribute(NameOID.COMMON_NAME, "registry-proxy local CA"),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _san(names: list[str]) -> list[x509.GeneralName]:
    result: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


def _build_server(key, ca_cert: x509.Certificate, ca_key, names: list[str]) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + SERVER_VALIDITY)
        .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def _needs_new_server_cert(cert_path: Path, key_path: Path, names: list[str]) -> bool:
    if not (cert_path.exists() and key_path.exists()):
        return True
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    if cert.not_valid_after_utc - _now() < RENEW_BEFORE:
        return True
    try:
        present = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True
    return set(_san(names)) - set(present) != set()
