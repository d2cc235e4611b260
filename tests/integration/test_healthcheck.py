"""`registry-proxy healthcheck` run for real against a real `serve` process: plain HTTP, the generated
CA, a configured certificate, a dead port, a not-ready proxy, a bad setting. Settings come from the
REGISTRY_PROXY_* variables, as the container image's HEALTHCHECK gets them."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
import trustme

from tests.fakes.process import REPO_ROOT, ProxyProcess

PREFIX = "registry-proxy healthcheck: "


async def healthcheck(env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run the command in a clean environment plus `env`; its exit code and output."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("REGISTRY_PROXY_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "healthcheck",
        *args,
        cwd=REPO_ROOT,
        env={**clean, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    text = output.decode()
    assert len(text.strip().splitlines()) == 1, f"not one line: {text!r}"
    assert text.startswith(PREFIX) and "Traceback" not in text
    return process.returncode, text.strip()


async def test_plain_http_from_the_environment(proxy_process):
    proxy = await proxy_process("--plain-http")
    code, line = await healthcheck(
        {"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{proxy.port}", "REGISTRY_PROXY_PLAIN_HTTP": "true"}
    )
    assert code == 0, line
    assert line == f"{PREFIX}ready: http://127.0.0.1:{proxy.port}/readyz answered 200"


async def test_tls_trusts_the_generated_ca_and_probes_a_wildcard_listen_on_loopback(proxy_process, tmp_path):
    proxy = await proxy_process()
    env = {"REGISTRY_PROXY_LISTEN": f"0.0.0.0:{proxy.port}", "REGISTRY_PROXY_DATA_DIR": str(proxy.data_dir)}
    code, line = await healthcheck(env)
    assert code == 0, line
    assert line == f"{PREFIX}ready: https://127.0.0.1:{proxy.port}/readyz answered 200"
    # plain HTTP against the TLS listener is not healthy
    code, line = await healthcheck({**env, "REGISTRY_PROXY_PLAIN_HTTP": "1"})
    assert code == 1, line


async def test_tls_with_another_ca_is_unhealthy(proxy_process, tmp_path):
    proxy = await proxy_process()
    other = tmp_path / "other"
    (other / "tls").mkdir(parents=True)
    trustme.CA().cert_pem.write_to_path(str(other / "tls" / "ca.pem"))
    code, line = await healthcheck(
        {"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{proxy.port}", "REGISTRY_PROXY_DATA_DIR": str(other)}
    )
    assert code == 1
    assert "TLS to https://127.0.0.1:" in line and "CERTIFICATE_VERIFY_FAILED" in line


class ConfiguredCertProxy(ProxyProcess):
    """A proxy serving a certificate of the test CA, which its start-up wait trusts."""

    def __init__(self, test_ca_file: Path, *args) -> None:
        super().__init__(*args)
        self.test_ca_file = test_ca_file

    @property
    def ca_file(self) -> Path:
        return self.test_ca_file


@pytest.fixture
async def configured_cert_proxy(tmp_path, registry, ca_file, server_cert_files):
    cert, key = server_cert_files
    proxy = ConfiguredCertProxy(
        ca_file, tmp_path / "data", registry.url, ca_file, "--tls-cert", str(cert), "--tls-key", str(key)
    )
    await proxy.start()
    yield proxy
    await proxy.stop()


@pytest.mark.process
async def test_a_configured_certificate_is_trusted_as_it_is(configured_cert_proxy, server_cert_files, tmp_path):
    proxy = configured_cert_proxy
    cert, _ = server_cert_files
    env = {"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{proxy.port}", "REGISTRY_PROXY_TLS_CERT": str(cert)}
    code, line = await healthcheck(env)
    assert code == 0, line
    # a certificate the server does not present (another CA's) is not trusted
    stranger = tmp_path / "stranger.pem"
    trustme.CA().issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(str(stranger))
    code, line = await healthcheck({**env, "REGISTRY_PROXY_TLS_CERT": str(stranger)})
    assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in line, line


@pytest.mark.process
async def test_a_dead_port_is_unhealthy(refused_port):
    port = refused_port
    code, line = await healthcheck({"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{port}", "REGISTRY_PROXY_PLAIN_HTTP": "1"})
    assert code == 1
    assert line.startswith(f"{PREFIX}unhealthy: cannot reach http://127.0.0.1:{port}/readyz"), line


async def test_not_ready_below_the_free_space_floor(proxy_process):
    proxy = await proxy_process("--plain-http", "--min-free-space", "99.99%")
    code, line = await healthcheck({"REGISTRY_PROXY_PLAIN_HTTP": "1"}, "--listen", f"127.0.0.1:{proxy.port}")
    assert code == 1
    assert line.startswith(f"{PREFIX}unhealthy: not ready: http://127.0.0.1:{proxy.port}/readyz answered 503"), line
    assert "disk_space" in line


@pytest.mark.process
async def test_a_bad_setting_exits_1_not_docker_reserved_2(tmp_path):
    code, line = await healthcheck({"REGISTRY_PROXY_LISTEN": "no-port-here"})
    assert code == 1
    assert "invalid --listen" in line
    code, line = await healthcheck({"REGISTRY_PROXY_DATA_DIR": str(tmp_path / "nothing")})
    assert code == 1
    assert "cannot read the generated CA" in line, line
