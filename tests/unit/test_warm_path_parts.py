"""Parts of the warm path: the event loop choice, rendered answers, the JSON access-log writer, the flags."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from proxy.cli import build_parser, settings_from_args
from proxy.runtime import log
from proxy.settings.config import ConfigError
from proxy.web.eventloop import loop_name, new_event_loop
from proxy.web.renderings import Renderings, strong_etag


def test_asyncio_loop_on_request():
    loop = new_event_loop("asyncio")
    try:
        assert loop_name(loop) == "asyncio"
    finally:
        loop.close()


def test_uvloop_when_installed():
    pytest.importorskip("uvloop")
    for choice in ("auto", "uvloop"):
        loop = new_event_loop(choice)
        try:
            assert loop_name(loop) == "uvloop"
        finally:
            loop.close()


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails
    loop = new_event_loop("auto")
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop) and loop_name(loop) == "asyncio"
    finally:
        loop.close()
    with pytest.raises(ConfigError, match="not installed"):
        new_event_loop("uvloop")


def test_rendered_once_per_source_object():
    rendered = Renderings()
    source = {"b": 1}
    first = rendered.json("k", source, lambda s: {"versions": s})
    assert first.body == b'{"versions":{"b":1}}'
    assert first.etag == f'"{hashlib.sha256(first.body).hexdigest()[:32]}"' == strong_etag(first.body)
    assert rendered.json("k", source, lambda s: pytest.fail("rendered again")) is first
    again = rendered.json("k", {"b": 1}, lambda s: {"versions": s})  # an equal but new source: rendered
    assert again == first and rendered.renders == 2
    body = b'{"x": 1}'
    assert rendered.body("raw", body).etag == strong_etag(body)
    assert rendered.body("raw", body) is rendered.body("raw", body) and rendered.renders == 3


def test_json_access_lines_have_the_structlog_fields():
    stream = io.StringIO()
    write = log._json_lines(stream)
    write("request", {"status": 200, "path": "/x", "request_id": "abc"})
    line = json.loads(stream.getvalue())
    assert line["event"] == "request" and line["level"] == "info" and line["timestamp"].endswith("Z")
    assert (line["status"], line["path"], line["request_id"]) == (200, "/x", "abc")
    assert stream.getvalue().endswith("\n") and stream.getvalue().count("\n") == 1


def test_access_line_timestamps_are_structlogs_iso_utc_form_formatted_once_a_second():
    now = [datetime(2026, 11, 25, 9, 43, 36, 123456, tzinfo=UTC).timestamp()]
    stamps = log._Timestamps(lambda: now[0])
    assert stamps.now() == "2026-11-25T09:43:36.123456Z"
    now[0] += 0.5
    assert stamps.now() == "2026-11-25T09:43:36.623456Z"
    now[0] += 0.5  # the next second
    assert stamps.now() == "2026-11-25T09:43:37.123456Z"
    assert datetime.fromisoformat(stamps.now()) == datetime.fromtimestamp(now[0], UTC)


def test_request_ids_are_the_clients_when_sane_else_16_fresh_hex_digits():
    assert log.new_request_id("abc-123") == "abc-123"
    fresh = {log.new_request_id(given) for given in (None, "", "two words", "x" * 129, "bell\a")}
    assert len(fresh) == 5 and all(len(i) == 16 and int(i, 16) >= 0 for i in fresh)


@pytest.mark.parametrize(
    "flag, value",
    [("--access-log", "errors"), ("--access-log", "off"), ("--event-loop", "asyncio"), ("--event-loop", "uvloop")],
)
def test_flags(monkeypatch, tmp_path: Path, flag, value):
    for name in ("ACCESS_LOG", "EVENT_LOOP"):
        monkeypatch.delenv("REGISTRY_PROXY_" + name, raising=False)
    default = settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)]))
    assert (default.logging.access_log, default.server.event_loop) == ("all", "auto")
    given = settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path), flag, value]))
    assert (given.logging.access_log if flag == "--access-log" else given.server.event_loop) == value


def test_access_log_from_the_environment(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("REGISTRY_PROXY_ACCESS_LOG", "off")
    assert (
        settings_from_args(build_parser().parse_args(["serve", "--data-dir", str(tmp_path)])).logging.access_log
        == "off"
    )


@pytest.mark.parametrize("flag, value", [("--access-log", "some"), ("--event-loop", "trio")])
def test_invalid_choices(tmp_path: Path, flag, value):
    with pytest.raises(ConfigError, match=flag):
        build_parser().parse_args(["serve", "--data-dir", str(tmp_path), flag, value])
