"""The TLS certificate an upstream presents, for `doctor`: whether it verifies with the trust the proxy uses, and
if not, who issued it (the CA the operator would have to trust, with `--upstream-ca-file`).

A handshake only, no request: once with the proxy's TLS context; when that refuses the certificate, once more
without verification to read the certificate presented (only read, never trusted). Direct connections: not
for a host reached through an egress proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass

from cryptography import x509


@dataclass(frozen=True)
class PresentedCertificate:
    """What a host's certificate says: verified (error empty), or why not and who issued it."""

    verified: bool
    error: str
    issuer: str  # RFC 4514, e.g. "CN=Corp Root CA,O=Corp"
    subject: str
    code: int = 0  # OpenSSL's X509_V_ERR_* of the refusal (62: the name does not match; 10: expired)


async def presented_certificate(host: str, port: int, trust: ssl.SSLContext) -> PresentedCertificate:
    """The certificate `host:port` presents, checked against `trust`; raises OSError when no handshake is made
    (the caller bounds the time)."""
    try:
        der = await _handshake(host, port, trust)
    except ssl.SSLCertVerificationError as exc:
        error = exc.verify_message or exc.reason or str(exc)
        unverified = ssl.create_default_context()
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        return _described(await _handshake(host, port, unverified), False, error, exc.verify_code or 0)
    return _described(der, True, "", 0)


async def _handshake(host: str, port: int, context: ssl.SSLContext) -> bytes:
    """The DER of the leaf certificate after a TLS handshake with `host:port` (the connection closed at once)."""
    _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        return ssl_object.getpeercert(binary_form=True) or b""
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def _described(der: bytes, verified: bool, error: str, code: int) -> PresentedCertificate:
    if not der:
        return PresentedCertificate(verified, error or "no certificate presented", "", "", code)
    certificate = x509.load_der_x509_certificate(der)
    return PresentedCertificate(
        verified, error, certificate.issuer.rfc4514_string(), certificate.subject.rfc4514_string(), code
    )
