"""One shell, one SSL_CERT_FILE: `terraform init` trusts the proxy's generated CA and every server the system
trusts, with SSL_CERT_FILE naming the proxy's `DATA_DIR/tls/ca-bundle.pem` (not `ca.pem`, which replaces the
system's roots).

The machine's trust store is left alone: a test CA stands for a publicly trusted one, added to a copy of the
system's bundle that both the proxy (as its system roots) and terraform see through SSL_CERT_FILE, and
SSL_CERT_DIR names an empty directory, so roots come from that one file (on Linux Go and OpenSSL would also
read /etc/ssl/certs, where the test CA is not).
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from aiohttp import web

from tests.conftest import PROVIDER
from tests.fakes.packages import module_tar_gz

pytestmark = pytest.mark.e2e

MODULE = module_tar_gz({"main.tf": 'output "greeting" {\n  value = "hello"\n}\n'})


async def module_archive(_: web.Request) -> web.Response:
    return web.Response(body=MODULE, content_type="application/gzip")


@contextlib.asynccontextmanager
async def https_server(public_ca: trustme.CA) -> AsyncIterator[str]:
    """Another HTTPS server, with a certificate from `public_ca`, serving a module archive; yields its URL."""
    app = web.Application()
    app.router.add_get("/modules/greeting.tar.gz", module_archive)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    public_ca.issue_cert("localhost").configure_cert(context)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    try:
        yield f"https://localhost:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def system_like_bundle(path: Path, public_ca: trustme.CA) -> Path:
    """A copy of this machine's bundle of roots (when it has one) plus `public_ca`."""
    system = Path(ssl.get_default_verify_paths().openssl_cafile)
    path.write_bytes((system.read_bytes() if system.is_file() else b"") + public_ca.cert_pem.bytes())
    return path


def untrusted(output: str) -> str | None:
    """The URL terraform could not verify the certificate of (its messages wrap over lines)."""
    found = re.search(
        r'Get "([^"]+)": tls: failed to verify certificate: x509: certificate signed by unknown',
        " ".join(output.split()),
    )
    return found and found[1]


def main_tf(other_server: str) -> str:
    """A provider through the proxy (network mirror) and a module straight from another HTTPS server."""
    return (
        f'terraform {{\n  required_providers {{\n    foo = {{\n      source  = "{PROVIDER}"\n'
        f'      version = "1.0.0"\n    }}\n  }}\n}}\n\n'
        f'module "greeting" {{\n  source = "{other_server}/modules/greeting.tar.gz"\n}}\n'
    )


async def test_the_bundle_trusts_the_proxy_and_every_server_the_system_trusts(
    registry, proxy_process, terraform, tmp_path, monkeypatch
):
    public_ca = trustme.CA()
    system_roots = system_like_bundle(tmp_path / "system-roots.pem", public_ca)
    (tmp_path / "no-cert-dir").mkdir()
    monkeypatch.setenv("SSL_CERT_FILE", str(system_roots))  # the proxy's system roots; terraform's is set per run
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "no-cert-dir"))
    proxy = await proxy_process()
    bundle = proxy.data_dir / "tls" / "ca-bundle.pem"
    cli_config = f'provider_installation {{\n  network_mirror {{\n    url = "{proxy.url}/mirror/v1/"\n  }}\n}}\n'

    async with https_server(public_ca) as other:
        # the old advice: SSL_CERT_FILE=ca.pem trusts the proxy and nothing else
        code, output = await terraform.init(terraform.workdir("ca-only", main_tf(other)), cli_config, proxy.ca_file)
        assert code != 0 and untrusted(output) == f"{other}/modules/greeting.tar.gz", output
        # the system's roots alone do not trust the proxy
        code, output = await terraform.init(terraform.workdir("system", main_tf(other)), cli_config, system_roots)
        assert code != 0 and untrusted(output).startswith(f"{proxy.url}/mirror/v1/"), output

        workdir = terraform.workdir("bundle", main_tf(other))
        code, output = await terraform.init(workdir, cli_config, bundle)
    assert code == 0, output
    assert f"Installed {PROVIDER} v1.0.0" in output, output
    assert (workdir / ".terraform" / "modules" / "greeting" / "main.tf").is_file(), output
    (logged,) = proxy.events("tls.local_ca")  # the proxy names the bundle, and where its system roots came from
    assert logged["system_roots"] == str(system_roots)
    assert f"export SSL_CERT_FILE={bundle.resolve()} " in logged["hint"]
