"""deploy/systemd: the unit passes `systemd-analyze verify` and scores as well sandboxed by
`systemd-analyze security`; its hardening keys are checked by a parser too; and the proxy really runs
with W^X enforced (what MemoryDenyWriteExecute=yes imposes), fetching and verifying a provider."""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.process import REPO_ROOT, ProxyProcess

UNIT = REPO_ROOT / "deploy" / "systemd" / "registry-proxy.service"
ENV_FILE = REPO_ROOT / "deploy" / "systemd" / "registry-proxy.env"
INSTALLED = "/opt/registry-proxy/bin/registry-proxy"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1


def unit_entries(text: str) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values]}}: a unit file's keys (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None and re.fullmatch(r"[A-Za-z]+", key), f"not a unit line: {line!r}"
        current.setdefault(key, []).append(value)
    return sections


def test_the_unit_is_hardened():
    service = unit_entries(UNIT.read_text())["Service"]
    expected = {
        "DynamicUser": "yes",
        "StateDirectory": "registry-proxy",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "NoNewPrivileges": "yes",
        "CapabilityBoundingSet": "",
        "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter": "@system-service",
        "MemoryDenyWriteExecute": "yes",
        "EnvironmentFile": "/etc/registry-proxy/registry-proxy.env",
        "Environment": "REGISTRY_PROXY_DATA_DIR=%S/registry-proxy",
    }
    for key, value in expected.items():
        assert service.get(key) == [value], (key, service.get(key))
    assert service["ExecStart"] == [f"{INSTALLED} serve"]
    assert f"{INSTALLED} healthcheck" in service["ExecStartPost"][0]


def test_the_env_file_is_key_value_lines():
    for line in ENV_FILE.read_text().splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(r"[A-Z][A-Z0-9_]*=\S*", line), line
        assert "REGISTRY_PROXY_DATA_DIR=" not in line, "the unit sets the data dir (its StateDirectory)"


def runnable_unit(tmp_path: Path, text: str) -> Path:
    """The unit with its ExecStart pointing at this checkout's registry-proxy (verify wants a real binary)."""
    path = tmp_path / "registry-proxy.service"
    path.write_text(text.replace(INSTALLED, str(Path(sys.executable).parent / "registry-proxy")))
    return path


def analyze(*args: str) -> subprocess.CompletedProcess:
    if SYSTEMD_ANALYZE is None:
        pytest.skip("systemd-analyze is missing (Debian package systemd); the parser check above still runs")
    return subprocess.run([SYSTEMD_ANALYZE, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_systemd_analyze_verify_accepts_the_unit_and_rejects_a_typo(tmp_path):
    result = analyze("verify", str(runnable_unit(tmp_path, UNIT.read_text())))
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    broken = analyze("verify", str(runnable_unit(tmp_path, UNIT.read_text().replace("ProtectHome=", "ProtectHom="))))
    assert "Unknown key 'ProtectHom'" in broken.stderr  # exit code 0: only stderr tells


@pytest.mark.process
def test_systemd_analyze_security_rates_the_sandbox_ok(tmp_path):
    result = analyze("security", "--offline=yes", "--no-pager", str(runnable_unit(tmp_path, UNIT.read_text())))
    match = re.search(r"Overall exposure level for registry-proxy.service: (\d+\.\d+) (\w+)", result.stdout)
    assert match, result.stdout[-500:] + result.stderr
    assert float(match.group(1)) <= 2.0, match.group(0)  # 1.5 at the time of writing; 10 is an open service


MDWE_WRAPPER = """
import ctypes, mmap, os, sys
if ctypes.CDLL(None, use_errno=True).prctl(65, 1, 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_MDWE) failed")
try:
    mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    sys.exit("W^X is not enforced")
except PermissionError:
    pass
os.execv(sys.argv[1], sys.argv[1:])
"""


def mdwe_supported() -> bool:
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import ctypes,sys; sys.exit(ctypes.CDLL(None).prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0))",
        ]
    )
    return probe.returncode == 0


@pytest.mark.process
async def test_the_proxy_serves_and_verifies_with_write_xor_execute_enforced(tmp_path, registry, ca_file):
    """MemoryDenyWriteExecute=yes breaks Pythons that need writable+executable memory; this build does not."""
    if not hasattr(ctypes.CDLL(None), "prctl") or not mdwe_supported():
        pytest.skip("the kernel has no PR_SET_MDWE (Linux 6.3+)")
    proxy = ProxyProcess(tmp_path / "data", registry.url, ca_file, "--workers", "2")
    proxy.args = [sys.executable, "-c", MDWE_WRAPPER, *proxy.args]  # inherited by the workers, gpg and git
    await proxy.start()
    try:
        context = ssl.create_default_context(cafile=str(proxy.ca_file))
        release = registry.releases[("acme", "foo")]["1.0.0"]
        name = release.filename("linux_amd64")
        url = f"{proxy.url}/mirror/v1/registry.example.test/acme/foo/1.0.0/linux_amd64/{name}"
        async with aiohttp.ClientSession() as session, session.get(url, ssl=context) as response:
            body = await response.read()
            assert response.status == 200, body[:300]
        assert hashlib.sha256(body).hexdigest() == release.sha256("linux_amd64")
    finally:
        await proxy.stop()
