"""`registry-proxy healthcheck` against a serving proxy: plain HTTP, the generated CA, a configured
certificate, a dead port, a not-ready proxy, a bad setting. Settings come from the REGISTRY_PROXY_*
variables, as the container image's HEALTHCHECK gets them.

The command runs as a real process where its exit code is what is checked (healthy, a bad setting: what
Docker sees); otherwise its `main` runs in this process (`healthcheck_in_process`), a second apart from
process starts. The proxy runs in this process too, but for the generated CA, which `serve` makes.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
import threading

import pytest
import trustme

from proxy.cli import main
from proxy.settings.config import SpaceFloor
from tests.conftest import serve_proxy
from tests.fakes.process import REPO_ROOT

PREFIX = "registry-proxy healthcheck: "
NEVER_ENOUGH = SpaceFloor(2**62)


def clean_environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith("REGISTRY_PROXY_")}


def one_line(output: str) -> str:
    """The command's one line (it printed exactly one, with its prefix, and no traceback)."""
    assert len(output.strip().splitlines()) == 1, f"not one line: {output!r}"
    assert output.startswith(PREFIX) and "Traceback" not in output
    return output.strip()


async def healthcheck(env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run the command as a process in a clean environment plus `env`; its exit code and line."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "healthcheck",
        *args,
        cwd=REPO_ROOT,
        env={**clean_environment(), **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, one_line(output.decode())


class ThreadOutput(io.TextIOBase):
    """A stand-in for sys.stdout/stderr: what one thread writes goes to its own buffer, what the others
    write (the proxy serving in this process logs) goes where it went before."""

    def __init__(self, before, thread: int, buffer: io.StringIO) -> None:
        self.before, self.thread, self.buffer = before, thread, buffer

    def write(self, text: str) -> int:
        return (self.buffer if threading.get_ident() == self.thread else self.before).write(text)

    def flush(self) -> None:
        self.before.flush()


@pytest.fixture
def healthcheck_in_process(monkeypatch):
    """`healthcheck(env, *args)` through the CLI's `main` in a thread of this process (the command blocks),
    with only `env` of the REGISTRY_PROXY_* variables; what that thread prints is its output."""

    async def run(env: dict[str, str], *args: str) -> tuple[int, str]:
        for name in os.environ:
            if name.startswith("REGISTRY_PROXY_"):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        output = io.StringIO()

        def command() -> int:
            with monkeypatch.context() as patch:
                thread = threading.get_ident()
                patch.setattr(sys, "stdout", ThreadOutput(sys.stdout, thread, output))
                patch.setattr(sys, "stderr", ThreadOutput(sys.stderr, thread, output))
                return main(["healthcheck", *args])

        code = await asyncio.to_thread(command)
        return code, one_line(output.getvalue())

    return run


@pytest.mark.process
async def test_plain_http_from_the_environment(make_local_settings, client_ssl):
    settings = make_local_settings(plain_http=True, tls_cert=None, tls_key=None)
    async with serve_proxy(settings, client_ssl) as proxy:
        port = proxy.url.rsplit(":", 1)[1]
        code, line = await healthcheck(
            {"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{port}", "REGISTRY_PROXY_PLAIN_HTTP": "true"}
        )
    assert code == 0, line
    assert line == f"{PREFIX}ready: http://127.0.0.1:{port}/readyz answered 200"


@pytest.fixture
async def generated_ca_proxy(proxy_process):
    """A `serve` process that generated its own CA (under its data dir)."""
    return await proxy_process()


async def test_tls_trusts_the_generated_ca_and_probes_a_wildcard_listen_on_loopback(
    generated_ca_proxy, healthcheck_in_process
):
    proxy = generated_ca_proxy
    env = {"REGISTRY_PROXY_LISTEN": f"0.0.0.0:{proxy.port}", "REGISTRY_PROXY_DATA_DIR": str(proxy.data_dir)}
    code, line = await healthcheck_in_process(env)
    assert code == 0, line
    assert line == f"{PREFIX}ready: https://127.0.0.1:{proxy.port}/readyz answered 200"
    # plain HTTP against the TLS listener is not healthy
    code, line = await healthcheck_in_process({**env, "REGISTRY_PROXY_PLAIN_HTTP": "1"})
    assert code == 1, line
    # nor is TLS trusting another CA than the one the proxy generated
    other = proxy.data_dir.parent / "other"
    (other / "tls").mkdir(parents=True)
    trustme.CA().cert_pem.write_to_path(str(other / "tls" / "ca.pem"))
    code, line = await healthcheck_in_process({**env, "REGISTRY_PROXY_DATA_DIR": str(other)})
    assert code == 1
    assert "TLS to https://127.0.0.1:" in line and "CERTIFICATE_VERIFY_FAILED" in line


async def test_a_configured_certificate_is_trusted_as_it_is(
    make_local_settings, client_ssl, server_cert_files, tmp_path, healthcheck_in_process
):
    cert, key = server_cert_files
    async with serve_proxy(make_local_settings(tls_cert=cert, tls_key=key), client_ssl) as proxy:
        port = proxy.url.rsplit(":", 1)[1]
        env = {"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{port}", "REGISTRY_PROXY_TLS_CERT": str(cert)}
        code, line = await healthcheck_in_process(env)
        assert code == 0, line
        # a certificate the server does not present (another CA's) is not trusted
        stranger = tmp_path / "stranger.pem"
        trustme.CA().issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(str(stranger))
        code, line = await healthcheck_in_process({**env, "REGISTRY_PROXY_TLS_CERT": str(stranger)})
    assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in line, line


async def test_a_dead_port_is_unhealthy(refused_port, healthcheck_in_process):
    port = refused_port
    code, line = await healthcheck_in_process(
        {"REGISTRY_PROXY_LISTEN": f"127.0.0.1:{port}", "REGISTRY_PROXY_PLAIN_HTTP": "1"}
    )
    assert code == 1
    assert (
        line
        == f"{PREFIX}unhealthy: nothing listens at 127.0.0.1:{port} (connection refused): is the proxy running there?"
    )


async def test_nothing_listening_is_said_before_a_missing_ca_is_blamed(tmp_path, refused_port, healthcheck_in_process):
    """A proxy that never started has made no CA either: what is wrong is that nothing listens (exit 1 still:
    Docker reserves 2)."""
    settings = {"REGISTRY_PROXY_DATA_DIR": str(tmp_path / "never-started")}
    code, line = await healthcheck_in_process(settings, "--listen", f"127.0.0.1:{refused_port}")
    assert (code, line) == (
        1,
        f"{PREFIX}unhealthy: nothing listens at 127.0.0.1:{refused_port} (connection refused): is the proxy running "
        "there?",
    )


async def test_not_ready_below_the_free_space_floor(make_local_settings, client_ssl, healthcheck_in_process):
    settings = make_local_settings(plain_http=True, tls_cert=None, tls_key=None, min_free_space=NEVER_ENOUGH)
    async with serve_proxy(settings, client_ssl) as proxy:
        port = proxy.url.rsplit(":", 1)[1]
        code, line = await healthcheck_in_process({"REGISTRY_PROXY_PLAIN_HTTP": "1"}, "--listen", f"127.0.0.1:{port}")
    assert code == 1
    assert line.startswith(f"{PREFIX}unhealthy: not ready: http://127.0.0.1:{port}/readyz answered 503"), line
    assert "disk_space" in line


@pytest.mark.process
async def test_a_bad_setting_exits_1_not_docker_reserved_2(tmp_path, healthcheck_in_process):
    code, line = await healthcheck({"REGISTRY_PROXY_LISTEN": "no-port-here"})
    assert code == 1
    assert "invalid --listen" in line
    with socket.socket() as listening:  # something listens there: the CA it would trust is what is missing
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        code, line = await healthcheck_in_process(
            {"REGISTRY_PROXY_DATA_DIR": str(tmp_path / "nothing")}, "--listen", address
        )
    assert code == 1
    assert "cannot read the generated CA" in line, line
