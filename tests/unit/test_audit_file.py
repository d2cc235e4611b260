"""The audit log's file: whole lines or nothing, drops counted once per episode, `--audit-required`, reopen.

The full disk itself is reproduced against real processes on a tmpfs (tests/faults/test_audit_trail.py); here a
short `write` is made by a stand-in for `os.write`, so the taking back of a torn line is checked exactly.
"""

from __future__ import annotations

import errno
import json
import os

import pytest
from structlog.testing import capture_logs

from proxy.errors import AuditUnavailableError
from proxy.governance import audit as audit_module
from proxy.governance.audit import AuditLog, ClientIdentity

ARTIFACT = {"kind": "provider", "address": "registry.example.test/acme/foo", "version": "1.0.0"}
CLIENT = ClientIdentity("ci", "10.0.0.1")


class FailingWrites:
    """`os.write` for the audit file: `short` writes put half the line and report it, `full` ones raise ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mode = "ok"
        real = os.write

        def write(descriptor: int, data: bytes) -> int:
            if self.mode == "short":
                return real(descriptor, data[: len(data) // 2])
            if self.mode == "full":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(descriptor, data)

        monkeypatch.setattr(audit_module.os, "write", write)


@pytest.fixture
def writes(monkeypatch) -> FailingWrites:
    return FailingWrites(monkeypatch)


def events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line whole


def test_a_short_write_is_taken_back_and_later_lines_stay_whole(tmp_path, writes):
    path = tmp_path / "audit.log"
    dropped = []
    log = AuditLog.open(str(path), on_dropped=lambda: dropped.append(1))
    log.fetched({"n": 1})
    writes.mode = "short"
    assert log.write("fetched", artifact={"n": 2}) is False
    writes.mode = "ok"
    log.fetched({"n": 3})
    log.close()
    assert [e["artifact"]["n"] for e in events(path)] == [1, 3]
    assert dropped == [1]


def test_drops_are_logged_once_per_episode_with_their_count(tmp_path, writes):
    log = AuditLog.open(str(tmp_path / "audit.log"))
    with capture_logs() as logs:
        writes.mode = "full"
        for _ in range(5):
            log.fetched(ARTIFACT)
        writes.mode = "ok"
        log.fetched(ARTIFACT)
        log.fetched(ARTIFACT)
    log.close()
    names = [(entry["event"], entry["log_level"]) for entry in logs]
    assert names == [("audit.dropping", "warning"), ("audit.resumed", "warning")]
    assert "No space left" in logs[0]["reason"] and logs[1]["dropped"] == 5


def test_audit_required_refuses_and_a_served_event_is_tried_again(tmp_path, writes):
    path = tmp_path / "audit.log"
    log = AuditLog.open(str(path), required=True)
    writes.mode = "full"
    with pytest.raises(AuditUnavailableError) as refused:
        log.served(ARTIFACT, CLIENT)
    assert refused.value.status == 503 and refused.value.code == "audit_unavailable"
    writes.mode = "ok"
    log.served(ARTIFACT, CLIENT)  # not remembered as written: written now
    log.served(ARTIFACT, CLIENT)  # once per client, artifact and hour
    log.close()
    assert [e["event"] for e in events(path)] == ["served"]


def test_reopen_follows_a_rotation(tmp_path):
    path = tmp_path / "audit.log"
    log = AuditLog.open(str(path))
    log.fetched({"n": 1})
    path.rename(tmp_path / "audit.log.1")
    log.reopen()
    log.fetched({"n": 2})
    log.close()
    assert [e["artifact"]["n"] for e in events(tmp_path / "audit.log.1")] == [1]
    assert [e["artifact"]["n"] for e in events(path)] == [2]


def test_a_failed_reopen_keeps_writing_the_old_file(tmp_path):
    directory = tmp_path / "logs"
    directory.mkdir()
    log = AuditLog.open(str(directory / "audit.log"))
    directory.rename(tmp_path / "gone")
    with capture_logs() as logs:
        log.reopen()
    log.fetched({"n": 1})
    log.close()
    assert [entry["event"] for entry in logs] == ["audit.reopen_failed"]
    assert [e["artifact"]["n"] for e in events(tmp_path / "gone" / "audit.log")] == [1]


def test_audit_required_needs_an_audit_log():
    from proxy.settings.config import ConfigError, PolicySettings

    with pytest.raises(ConfigError, match="--audit-required needs --audit-log"):
        PolicySettings(audit_required=True)
