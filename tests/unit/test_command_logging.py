"""A command besides `serve` logs at info on stderr (`proxy.runtime.log.command_logging`): an unconfigured structlog
printed every debug line (`import` showed `[debug] gpg.verified` for each archive)."""

from __future__ import annotations

import pytest
import structlog

from proxy.runtime.log import command_logging


@pytest.fixture
def unconfigured_structlog():
    """structlog as a fresh process has it; this process's set-up, if any, back afterwards."""
    configured, saved = structlog.is_configured(), structlog.get_config()
    structlog.reset_defaults()
    yield
    if configured:
        structlog.configure(**saved)


def test_a_command_logs_info_on_stderr_no_debug_and_leaves_logging_as_it_was(
    unconfigured_structlog, capsys: pytest.CaptureFixture[str]
) -> None:
    log = structlog.get_logger("proxy.commands.test")
    with command_logging():
        log.debug("gpg.verified", key="ABCD")
        log.info("catalog.purged", target="registry.example/acme/foo")
    out, err = capsys.readouterr()
    assert "gpg.verified" not in out + err
    assert "catalog.purged" in err and "catalog.purged" not in out
    assert not structlog.is_configured()  # a test running commands in its process gets its defaults back
