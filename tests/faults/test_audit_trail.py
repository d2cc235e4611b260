"""The audit trail survives rotation and a full disk.

- SIGHUP reopens `--audit-log` in every worker: after `mv audit.log audit.log.1; kill -HUP MASTER` the events go
  to a new `audit.log` (before, every worker kept writing to the renamed file).
- The shipped `deploy/logrotate/registry-proxy`, run by the real `logrotate` against a running proxy, loses no
  event across three rotations (only its paths and its signal command are rewritten for the test).
- On a full disk (a 1 MiB tmpfs) each event is written whole or not at all, in order; the events that could not
  be written are dropped and counted (a metric, one log line when dropping starts and one when it ends), never
  written later (before, a half line with the next glued on, and the dropped events appended out of order once
  space came back).
- `--audit-required`: while an event cannot be written, a request that would produce one is refused with
  `503 audit_unavailable` (nothing is served unaudited); without it, serving goes on.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE, STDOUT

import pytest

from tests.fakes.process import REGISTRY_HOST, wait_for
from tests.faults.test_disk_full import NOT_ROOT, fill

REPO_ROOT = Path(__file__).parents[2]
SHIPPED_LOGROTATE = REPO_ROOT / "deploy" / "logrotate" / "registry-proxy"
SHIPPED_AUDIT_LOG = "/var/lib/registry-proxy/audit.log"
DENIED = f"/mirror/v1/{REGISTRY_HOST}/evilcorp/tool/index.json"
ARCHIVE = f"/mirror/v1/{REGISTRY_HOST}/acme/foo/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
POLICY = """
[[rule]]
name = "unvetted"
providers = ["*/evilcorp/*"]
action = "deny"
reason = "namespace not approved"
"""
WAIT = 30.0  # seconds: only a hang takes this long


@pytest.fixture
def policy_file(tmp_path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return path


@pytest.fixture
def tiny_disk(tmp_path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the audit log (request it before the proxy, so it unmounts last)."""
    if os.geteuid() != 0:
        pytest.skip(NOT_ROOT)
    path = tmp_path / "audit-disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"{NOT_ROOT} (mount failed: {mounted.stderr.decode().strip()})")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def lines_of(*paths: Path) -> list[str]:
    """The lines of the audit files (gzipped ones unpacked), oldest file first."""
    found: list[str] = []
    for path in paths:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        found += data.decode().splitlines()
    return found


def request_ids(lines: list[str]) -> list[str]:
    """The request ids of the `denied` events among `lines` (each must be a whole JSON line)."""
    events = [json.loads(line) for line in lines]
    return [e["request_id"] for e in events if e["event"] == "denied"]


async def deny(client, request_id: str) -> int:
    """A denied request on a connection of its own (so that the workers take turns, as the kernel hands them out)."""
    status, _, _ = await client.get(DENIED, headers={"X-Request-Id": request_id, "Connection": "close"})
    return status


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    assert match is not None, f"{name} missing from /metrics"
    return float(match.group(1))


async def test_sighup_reopens_the_audit_log_in_every_worker(proxy_process, connect, policy_file, tmp_path):
    audit = tmp_path / "audit.log"
    proxy = await proxy_process("--policy", str(policy_file), "--audit-log", str(audit), "--workers", "2")
    client = await connect(proxy)
    assert await deny(client, "before") == 403
    await wait_for(lambda: audit.exists() and "before" in audit.read_text(), WAIT, "the first denial in the audit log")
    workers = await both_workers(proxy)
    rotated = audit.with_name("audit.log.1")
    audit.rename(rotated)
    os.kill(proxy.process.pid, signal.SIGHUP)
    await reloaded(proxy, workers, 1)
    for n in range(4):
        assert await deny(client, f"after-{n}") == 403
    assert audit.exists(), "the audit log was not re-created"
    assert request_ids(lines_of(rotated)) == ["before"]
    assert request_ids(lines_of(audit)) == [f"after-{n}" for n in range(4)]
    assert {r["pid"] for r in proxy.events("audit.reopened")} == workers


async def both_workers(proxy) -> set[int]:
    """The pids of the proxy's two workers, once both serve (a SIGHUP before that would miss one)."""
    await wait_for(lambda: len(proxy.events("worker.started")) == 2, WAIT, "both workers to start")
    return {r["pid"] for r in proxy.events("worker.started")}


async def reloaded(proxy, workers: set[int], times: int) -> None:
    """Until every worker has handled `times` SIGHUPs (the audit log is reopened before the policy is read again)."""

    def done() -> bool:
        pids = [r["pid"] for r in proxy.events("policy.reloaded")]
        return all(pids.count(pid) >= times for pid in workers)

    await wait_for(done, WAIT, f"every worker to handle SIGHUP {times} time(s)")


def rotation_config(tmp_path: Path, audit: Path, pid: int) -> Path:
    """The shipped logrotate file with the audit log's path and the signal command rewritten for this test."""
    text = SHIPPED_LOGROTATE.read_text()
    assert SHIPPED_AUDIT_LOG in text
    command = re.search(r"^\s*(systemctl kill .*registry-proxy\.service.*)$", text, re.MULTILINE)
    assert command is not None, "the shipped postrotate signals the service"
    text = text.replace(SHIPPED_AUDIT_LOG, str(audit)).replace(command.group(1), f"kill -HUP {pid}")
    config = tmp_path / "logrotate.conf"
    config.write_text(text)
    return config


@pytest.mark.process
async def test_the_shipped_logrotate_config_loses_no_event_across_three_rotations(
    proxy_process, connect, policy_file, tmp_path
):
    logrotate = shutil.which("logrotate", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    assert logrotate, "logrotate (Debian package) is missing: make system-deps installs it"
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o750)
    audit = logs / "audit.log"
    proxy = await proxy_process("--policy", str(policy_file), "--audit-log", str(audit), "--workers", "2")
    client = await connect(proxy)
    workers = await both_workers(proxy)
    config = rotation_config(tmp_path, audit, proxy.process.pid)
    state = tmp_path / "logrotate.state"
    sent: list[str] = []

    async def denials(prefix: str, count: int) -> None:
        for n in range(count):
            sent.append(f"{prefix}-{n}")
            assert await deny(client, sent[-1]) == 403

    async def rotate(rotation: int) -> None:
        rotating = await asyncio.create_subprocess_exec(
            logrotate, "-f", "-s", str(state), str(config), stdout=PIPE, stderr=STDOUT
        )
        await denials(f"during-{rotation}", 5)  # while logrotate renames, signals and compresses
        output, _ = await rotating.communicate()
        assert rotating.returncode == 0, output.decode()
        await reloaded(proxy, workers, rotation)

    for rotation in (1, 2, 3):
        await denials(f"before-{rotation}", 5)
        await rotate(rotation)
    await denials("after", 5)
    files = [logs / "audit.log.3.gz", logs / "audit.log.2.gz", logs / "audit.log.1", audit]
    assert sorted(p.name for p in logs.iterdir()) == sorted(p.name for p in files)
    written = request_ids(lines_of(*files))
    assert sorted(written) == sorted(sent), "every event exactly once across the rotated files"


async def test_a_full_disk_drops_whole_events_in_order_and_counts_them(proxy_process, connect, policy_file, tiny_disk):
    audit = tiny_disk / "audit.log"
    proxy = await proxy_process("--policy", str(policy_file), "--audit-log", str(audit), "--workers", "2")
    client = await connect(proxy)
    sent = ["first"]
    assert await deny(client, "first") == 403
    filler = fill(tiny_disk, 0)
    for n in range(40):
        sent.append(f"full-{n}")
        assert await deny(client, sent[-1]) == 403  # without --audit-required, serving goes on
    while_full = audit.read_bytes()
    filler.unlink()
    # Three at least, and until every worker that dropped has written again (the kernel may hand one worker all
    # three connections: the other's episode then has not ended yet).
    freed: list[str] = []
    deadline = time.monotonic() + 30

    def workers(event: str) -> set[int]:
        return {record["pid"] for record in proxy.events(event)}

    while len(freed) < 3 or workers("audit.resumed") != workers("audit.dropping"):
        assert time.monotonic() < deadline, "a worker that dropped events never wrote one again"
        freed.append(f"freed-{len(freed)}")
        sent.append(freed[-1])
        assert await deny(client, sent[-1]) == 403
    after = audit.read_bytes()
    assert after.startswith(while_full), "what was dropped is never written later"
    assert request_ids(after[len(while_full) :].decode().splitlines()) == freed
    written = request_ids(lines_of(audit))  # each line a whole JSON event (else json.loads raises)
    assert written == [r for r in sent if r in written], "events in the order they happened"
    assert written[0] == "first" and written[-len(freed) :] == freed
    dropped = len(sent) - len(written)
    assert dropped >= 24  # the file's last page (4 KiB) may have had room for a few
    text = (await client.get("/metrics"))[2].decode()
    assert metric(text, "registry_proxy_audit_events_dropped_total") == dropped
    started, resumed = proxy.events("audit.dropping"), proxy.events("audit.resumed")
    assert 1 <= len(started) <= 2 and all(r["level"] == "warning" and "No space" in r["reason"] for r in started)
    assert len(resumed) == len(started) and sum(r["dropped"] for r in resumed) == dropped


@pytest.mark.one_metadata_store
async def test_audit_required_refuses_what_it_cannot_record(in_process_proxy, connect, policy_file, tiny_disk):
    audit = tiny_disk / "audit.log"
    proxy = await in_process_proxy("--policy", str(policy_file), "--audit-log", str(audit), "--audit-required")
    client = await connect(proxy)
    filler = fill(tiny_disk, 0)  # the audit log is still empty: not even a page of it to write into
    for path in (DENIED, ARCHIVE):  # a denial, and an archive fetched and served unaudited
        status, _, body = await client.get(path)
        assert status == 503, body
        assert json.loads(body)["code"] == "audit_unavailable"
    filler.unlink()
    assert await deny(client, "freed") == 403
    status, _, _ = await client.get(ARCHIVE)
    assert status == 200
    events = [json.loads(line) for line in lines_of(audit)]
    assert [e["event"] for e in events] == ["denied", "fetched", "served"]
    assert len(proxy.events("audit.dropping")) == 1 and proxy.events("audit.resumed")[0]["dropped"] == 2
