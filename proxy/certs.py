"""A local certificate authority for running without `--tls-cert`.

On first start the proxy creates a CA and a server certificate in `DATA_DIR/tls/` and
reuses them afterwards; the server certificate is renewed when it nears expiry or when
the names it must cover change. Users trust `ca.pem` (SSL_CERT_FILE or the OS store).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=3650)
SERVER_VALIDITY = dt.timedelta(days=397)
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class LocalTLS:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    created: bool


def ensure_local_tls(directory: Path, names: list[str]) -> LocalTLS:
    """Create (or reuse) the local CA and a server certificate valid for `names`.

    Replicas sharing one data dir may start together: a file lock makes one create the CA.
    """
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure_locked(directory, names)


def _ensure_locked(directory: Path, names: list[str]) -> LocalTLS:
    ca_cert_path, ca_key_path = directory / "ca.pem", directory / "ca-key.pem"
    cert_path, key_path = directory / "server.pem", directory / "server-key.pem"
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
    return LocalTLS(ca_cert_path, cert_path, key_path, created)


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
