"""Unit tests for proxy.web.local_ca.ensure_local_tls: the generated local CA and server certificate."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from proxy.web import local_ca as certs
from proxy.web.local_ca import ensure_local_tls

NAMES = ["localhost", "127.0.0.1", "::1", "proxy.internal"]


def _certs(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


def _sans(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return dns, ips


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_creates_files(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    local = ensure_local_tls(directory, NAMES)
    assert local.created is True
    assert local.ca_cert == directory / "ca.pem"
    assert local.server_cert == directory / "server.pem"
    assert local.server_key == directory / "server-key.pem"
    for path in (local.ca_cert, local.server_cert, local.server_key, directory / "ca-key.pem"):
        assert path.is_file()
        assert path.stat().st_size > 0
    assert _mode(local.server_key) == 0o600
    assert _mode(directory / "ca-key.pem") == 0o600
    assert _mode(directory) & 0o077 == 0


def test_keys_are_loadable_private_keys(tmp_path: Path) -> None:
    local = ensure_local_tls(tmp_path, NAMES)
    for path in (local.server_key, tmp_path / "ca-key.pem"):
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
    server_key = serialization.load_pem_private_key(local.server_key.read_bytes(), password=None)
    server_cert = _certs(local.server_cert)[0]
    assert server_cert.public_key().public_numbers() == server_key.public_key().public_numbers()


def test_reuse_on_second_call(tmp_path: Path) -> None:
    first = ensure_local_tls(tmp_path, NAMES)
    ca_bytes = first.ca_cert.read_bytes()
    server_bytes = first.server_cert.read_bytes()
    key_bytes = first.server_key.read_bytes()
    second = ensure_local_tls(tmp_path, NAMES)
    assert second.created is False
    assert second.ca_cert.read_bytes() == ca_bytes
    assert second.server_cert.read_bytes() == server_bytes
    assert second.server_key.read_bytes() == key_bytes


def test_subset_of_names_reuses_certificate(tmp_path: Path) -> None:
    first = ensure_local_tls(tmp_path, NAMES)
    server_bytes = first.server_cert.read_bytes()
    again = ensure_local_tls(tmp_path, ["localhost", "127.0.0.1"])
    assert again.created is False
    assert again.server_cert.read_bytes() == server_bytes


def test_new_name_makes_new_server_cert_with_same_ca(tmp_path: Path) -> None:
    first = ensure_local_tls(tmp_path, NAMES)
    ca_bytes = first.ca_cert.read_bytes()
    old_server = _certs(first.server_cert)[0]
    second = ensure_local_tls(tmp_path, [*NAMES, "new.example"])
    assert second.created is True
    assert second.ca_cert.read_bytes() == ca_bytes
    new_server = _certs(second.server_cert)[0]
    assert new_server.serial_number != old_server.serial_number
    dns, _ = _sans(new_server)
    assert "new.example" in dns
    assert "new.example" not in _sans(old_server)[0]
    _assert_signed_by_ca(second.server_cert, second.ca_cert)


def test_new_ip_makes_new_server_cert(tmp_path: Path) -> None:
    ensure_local_tls(tmp_path, NAMES)
    second = ensure_local_tls(tmp_path, [*NAMES, "192.0.2.10"])
    assert second.created is True
    assert "192.0.2.10" in _sans(_certs(second.server_cert)[0])[1]


def test_server_cert_near_expiry_is_renewed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_local_tls(tmp_path, NAMES)
    ca_bytes = first.ca_cert.read_bytes()
    old_server = _certs(first.server_cert)[0]
    # 380 days later the 397-day certificate has less than 30 days left.
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=380)
    monkeypatch.setattr(certs, "_now", lambda: later)
    renewed = ensure_local_tls(tmp_path, NAMES)
    assert renewed.created is True
    assert renewed.ca_cert.read_bytes() == ca_bytes
    new_server = _certs(renewed.server_cert)[0]
    assert new_server.not_valid_after_utc > old_server.not_valid_after_utc + datetime.timedelta(days=300)
    _assert_signed_by_ca(renewed.server_cert, renewed.ca_cert)


def test_missing_ca_key_regenerates_everything(tmp_path: Path) -> None:
    first = ensure_local_tls(tmp_path, NAMES)
    ca_bytes = first.ca_cert.read_bytes()
    (tmp_path / "ca-key.pem").unlink()
    second = ensure_local_tls(tmp_path, NAMES)
    assert second.created is True
    assert second.ca_cert.read_bytes() != ca_bytes
    _assert_signed_by_ca(second.server_cert, second.ca_cert)


def test_missing_server_key_regenerates_server_cert(tmp_path: Path) -> None:
    first = ensure_local_tls(tmp_path, NAMES)
    ca_bytes = first.ca_cert.read_bytes()
    first.server_key.unlink()
    second = ensure_local_tls(tmp_path, NAMES)
    assert second.created is True
    assert second.server_key.is_file()
    assert second.ca_cert.read_bytes() == ca_bytes
    assert _mode(second.server_key) == 0o600


def _assert_signed_by_ca(server_cert_path: Path, ca_cert_path: Path) -> None:
    ca = _certs(ca_cert_path)[0]
    server = _certs(server_cert_path)[0]
    assert server.issuer == ca.subject
    server.verify_directly_issued_by(ca)


def test_certificate_contents(tmp_path: Path) -> None:
    local = ensure_local_tls(tmp_path, NAMES)
    (ca,) = _certs(local.ca_cert)
    chain = _certs(local.server_cert)
    server = chain[0]
    # server.pem carries the chain: server certificate then the CA
    assert len(chain) == 2
    assert chain[1] == ca

    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.issuer == ca.subject
    ca.verify_directly_issued_by(ca)

    assert server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert ExtendedKeyUsageOID.SERVER_AUTH in server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    _assert_signed_by_ca(local.server_cert, local.ca_cert)

    dns, ips = _sans(server)
    assert dns == {"localhost", "proxy.internal"}
    assert ips == {"127.0.0.1", "::1"}
    assert all(isinstance(ipaddress.ip_address(ip), ipaddress.IPv4Address | ipaddress.IPv6Address) for ip in ips)
    assert server.not_valid_before_utc < server.not_valid_after_utc
    assert server.not_valid_after_utc <= ca.not_valid_after_utc


def test_duplicate_names_are_collapsed(tmp_path: Path) -> None:
    local = ensure_local_tls(tmp_path, ["localhost", "localhost", "127.0.0.1", "127.0.0.1"])
    dns, ips = _sans(_certs(local.server_cert)[0])
    assert dns == {"localhost"}
    assert ips == {"127.0.0.1"}


def test_certificate_verifies_in_a_real_tls_handshake(tmp_path: Path) -> None:
    local = ensure_local_tls(tmp_path, NAMES)
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(str(local.server_cert), str(local.server_key))
    client_context = ssl.create_default_context(cafile=str(local.ca_cert))

    for name in ("localhost", "proxy.internal", "127.0.0.1"):
        peer = _handshake(server_context, client_context, name)
        assert peer is not None

    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server_context, client_context, "not-in-the-cert.example")

    other = ensure_local_tls(tmp_path / "other", NAMES)
    stranger = ssl.create_default_context(cafile=str(other.ca_cert))
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(server_context, stranger, "localhost")


def _handshake(server_context: ssl.SSLContext, client_context: ssl.SSLContext, server_hostname: str) -> dict:
    """Do a TLS handshake over a socketpair; return the verified peer certificate."""
    client_sock, server_sock = socket.socketpair()
    client_sock.settimeout(10)
    server_sock.settimeout(10)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server_context.wrap_socket(server_sock, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client_context.wrap_socket(client_sock, server_hostname=server_hostname) as tls:
            peer = tls.getpeercert()
            tls.sendall(b"x")
            return peer
    finally:
        client_sock.close()
        thread.join(timeout=10)
        server_sock.close()


# The bundle for clients' SSL_CERT_FILE: this host's roots plus the CA.


@pytest.fixture
def system_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[trustme.CA]]:
    """A stand-in for the system's bundle (two public CAs), the only place the proxy looks for roots."""
    roots = [trustme.CA(), trustme.CA()]
    path = tmp_path / "system" / "ca-certificates.crt"
    path.parent.mkdir()
    path.write_bytes(b"# a comment, as some bundles have\n" + b"".join(ca.cert_pem.bytes() for ca in roots))
    monkeypatch.setattr(certs, "root_bundle_candidates", lambda: [None, tmp_path / "missing.pem", path])
    return path, roots


def _bodies(path: Path) -> list[bytes]:
    return [b"".join(block.split()) for block in certs.pem_certificates(path.read_bytes())]


def test_the_bundle_is_the_system_roots_then_the_ca(tmp_path: Path, system_bundle) -> None:
    system, _ = system_bundle
    local = ensure_local_tls(tmp_path / "tls", NAMES)
    assert local.ca_bundle == tmp_path / "tls" / "ca-bundle.pem"
    assert local.system_roots == system
    assert _bodies(local.ca_bundle) == _bodies(system) + _bodies(local.ca_cert)
    assert len(_certs(local.ca_bundle)) == 3
    assert _mode(local.ca_bundle) & 0o044 == 0o044  # certificates are public: anyone may read them


def test_the_bundle_verifies_the_proxy_and_every_system_trusted_server(tmp_path: Path, system_bundle) -> None:
    _, roots = system_bundle
    local = ensure_local_tls(tmp_path / "tls", NAMES)
    client = ssl.create_default_context(cafile=str(local.ca_bundle))
    proxy_server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    proxy_server.load_cert_chain(str(local.server_cert), str(local.server_key))
    assert _handshake(proxy_server, client, "localhost")
    for root in roots:
        elsewhere = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        root.issue_cert("registry.example.org").configure_cert(elsewhere)
        assert _handshake(elsewhere, client, "registry.example.org")
    # what SSL_CERT_FILE=ca.pem gives instead: the proxy only
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(elsewhere, ssl.create_default_context(cafile=str(local.ca_cert)), "registry.example.org")


def test_the_bundle_follows_the_system_roots_and_is_rewritten_only_when_they_change(
    tmp_path: Path, system_bundle
) -> None:
    system, _ = system_bundle
    first = ensure_local_tls(tmp_path / "tls", NAMES)
    before = first.ca_bundle.stat()
    again = ensure_local_tls(tmp_path / "tls", NAMES)
    assert (again.ca_bundle.stat().st_ino, again.ca_bundle.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    added = trustme.CA()
    system.write_bytes(system.read_bytes() + added.cert_pem.bytes())
    updated = ensure_local_tls(tmp_path / "tls", NAMES)
    assert _bodies(updated.ca_bundle) == _bodies(system) + _bodies(updated.ca_cert)
    assert [p.name for p in (tmp_path / "tls").iterdir() if p.name.endswith(".tmp")] == []


def test_a_ca_already_in_the_system_roots_is_listed_once(tmp_path: Path, system_bundle) -> None:
    system, _ = system_bundle
    local = ensure_local_tls(tmp_path / "tls", NAMES)
    system.write_bytes(system.read_bytes() + local.ca_cert.read_bytes().replace(b"\n", b"\r\n"))
    again = ensure_local_tls(tmp_path / "tls", NAMES)
    assert len(_certs(again.ca_bundle)) == 3


def test_ssl_cert_file_names_the_system_roots_unless_it_is_the_proxys_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corporate = tmp_path / "corporate.pem"
    corporate.write_bytes(trustme.CA().cert_pem.bytes())
    monkeypatch.setenv("SSL_CERT_FILE", str(corporate))
    assert certs.root_bundle_candidates()[0] == str(corporate)
    assert certs.root_bundle_candidates()[2:] == list(certs.SYSTEM_BUNDLES)

    local = ensure_local_tls(tmp_path / "tls", NAMES)
    fallback = tmp_path / "os-bundle.pem"
    fallback.write_bytes(trustme.CA().cert_pem.bytes())
    copy_of_ca = tmp_path / "registry-proxy-ca.pem"
    copy_of_ca.write_bytes(local.ca_cert.read_bytes())
    # a shell that followed the old advice (SSL_CERT_FILE=ca.pem), or already uses the bundle
    for own in (copy_of_ca, local.ca_cert, local.ca_bundle):
        assert certs.system_roots(local.ca_cert, local.ca_bundle, [str(own), None, fallback]) == fallback
    assert certs.system_roots(local.ca_cert, local.ca_bundle, [corporate, fallback]) == corporate


def test_without_system_roots_the_bundle_is_the_ca_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty.pem"
    empty.write_text("no certificates here\n")
    monkeypatch.setattr(certs, "root_bundle_candidates", lambda: [str(tmp_path / "missing.pem"), empty])
    local = ensure_local_tls(tmp_path / "tls", NAMES)
    assert local.system_roots is None
    assert _bodies(local.ca_bundle) == _bodies(local.ca_cert)
