"""The front door (`proxy.web.front_door`) against the real application: a warm `index.json` or `:version.json` it
answers is the answer the application gives the same request, byte for byte (status, every header but `Date`, body),
with the same access-log line and metrics; access control applies to it as to any request; and anything it must not
answer reaches the application.

"The application's answer" is taken with the front door handing every request on (its `answer` made to find none):
the same warm answer, through routing, the middlewares and `json_document`. The documents' clock is stopped while
the two are compared, so the `Cache-Control` max-age of both is counted from one instant.
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from dataclasses import dataclass

import pytest
from structlog.testing import capture_logs
from yarl import URL

from proxy.identity.tokens import hash_token
from proxy.settings.values import parse_networks
from proxy.web.aiohttp_internals import FRONT
from proxy.web.app_keys import MIRROR, WARM_ANSWERS
from tests.conftest import RunningProxy, serve_proxy
from tests.fakes.process import REGISTRY_HOST

pytestmark = pytest.mark.one_metadata_store

MIRROR_PATH = f"/mirror/v1/{REGISTRY_HOST}/acme/foo"
INDEX, VERSION_DOC = f"{MIRROR_PATH}/index.json", f"{MIRROR_PATH}/1.0.0.json"
READER, OUTSIDER = "rpt_front_reader_0001", "rpt_front_outsider_02"
TOKENS = (
    f'[tokens.reader]\nhash = "{hash_token(READER)}"\nhosts = ["{REGISTRY_HOST}"]\n'
    f'[tokens.outsider]\nhash = "{hash_token(OUTSIDER)}"\nhosts = ["elsewhere.example.test"]\n'
)
REQUEST_ID = "front-door-test-1"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Answer:
    """One answer as the client got it: status, raw headers in their order (`Date` aside), body; and the access-log
    line (its duration aside) and the changes of the metrics' counters the request made."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes
    log: dict
    metrics: set[str]


async def metric_lines(proxy: RunningProxy) -> dict[str, float]:
    """The request and cache counters of `/metrics` (this process's tallies folded first)."""
    status, _, text = await proxy.get("/metrics")
    assert status == 200
    found = re.findall(rb"^(registry_proxy_(?:requests|cache)_total\{[^}]*\}) (\S+)$", text, re.MULTILINE)
    return {name.decode(): float(value) for name, value in found}


async def ask(proxy: RunningProxy, method: str, path: str, headers: dict[str, str]) -> Answer:
    """`method path` with `headers` (and a fixed request id), with what it logged and counted."""
    before = await metric_lines(proxy)
    with capture_logs() as logs:
        async with proxy.session.request(
            method, proxy.url + path, headers={"X-Request-Id": REQUEST_ID, **headers}
        ) as response:
            body = await response.read()
            raw = [(name, value) for name, value in response.raw_headers if name.lower() != b"date"]
    after = await metric_lines(proxy)
    changed = {f"{name} +{after[name] - before.get(name, 0.0):g}" for name in after if after[name] != before.get(name)}
    lines = [entry for entry in logs if entry.get("path") == path]
    assert len(lines) == 1, logs
    line = {key: value for key, value in lines[0].items() if key != "duration_ms"}
    return Answer(response.status, raw, body, line, changed)


async def both_ways(
    proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch, method: str, path: str, headers: dict[str, str]
) -> tuple[Answer, Answer]:
    """The answer of the front door and the application's to the same warm request (the documents' clock stopped)."""
    front = proxy.app[FRONT]
    documents = proxy.app[MIRROR]._documents
    now = documents.clock()
    monkeypatch.setattr(documents, "clock", lambda: now)
    answered, reused = front.answered, proxy.app[WARM_ANSWERS].reused
    at_front = await ask(proxy, method, path, headers)
    assert front.answered == answered + 1, "the front door did not answer"
    with monkeypatch.context() as patch:
        patch.setattr(front, "answer", lambda request: None)
        by_application = await ask(proxy, method, path, headers)
    assert front.answered == answered + 1 and proxy.app[WARM_ANSWERS].reused == reused + 2  # both warm
    monkeypatch.undo()
    return at_front, by_application


async def exchange(proxy: RunningProxy, client_ssl: ssl.SSLContext, data: bytes) -> bytes:
    """The bytes the proxy answers `data` with on one connection (which the last request of `data` closes), its
    `Date` fields blanked."""
    host, port = proxy.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), ssl=client_ssl)
    try:
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return re.sub(rb"\r\nDate: [^\r]*\r\n", b"\r\nDate: -\r\n", answer)


async def warm(proxy: RunningProxy, path: str, headers: dict[str, str] | None = None) -> str:
    """Make `path`'s answer warm; its ETag."""
    for _ in range(2):
        status, got, body = await proxy.get(path, headers=headers or {})
        assert status == 200, body
    return got["ETag"]


@pytest.mark.parametrize("path", [INDEX, VERSION_DOC])
async def test_a_warm_document_is_answered_at_the_front_as_the_application_answers_it(
    make_settings, client_ssl, monkeypatch, path
):
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        etag = await warm(proxy, path)
        for method, headers, status in [
            ("GET", {}, 200),
            ("HEAD", {}, 200),
            ("GET", {"If-None-Match": etag}, 304),
            ("GET", {"If-None-Match": '"another"', "User-Agent": 'Terraform/1.9 "quoted"'}, 200),
        ]:
            at_front, by_application = await both_ways(proxy, monkeypatch, method, path, headers)
            assert at_front.status == status and at_front == by_application, (method, headers)
            assert at_front.log["cache"] == "hit" and at_front.log["status"] == status
            assert f'registry_proxy_requests_total{{route="mirror_json",status="{status}"}} +1' in at_front.metrics
            assert 'registry_proxy_cache_total{outcome="hit"} +1' in at_front.metrics
            names = [name.lower() for name, _ in at_front.headers]
            assert {b"etag", b"cache-control", b"vary", b"x-request-id", b"server"} <= set(names)
        assert (await proxy.get(path))[1]["Server"] == "registry-proxy"


async def test_the_front_doors_answers_are_the_applications_bytes_on_keep_alive_and_pipelined_connections(
    make_settings, client_ssl, monkeypatch
):
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        etag = await warm(proxy, INDEX)
        request = f"{{}} {INDEX} HTTP/1.{{}}\r\nHost: a\r\nX-Request-Id: {REQUEST_ID}\r\n{{}}\r\n"
        pipelined = "".join(
            request.format(method, minor, fields)
            for method, minor, fields in [
                ("GET", 1, ""),
                ("HEAD", 1, ""),
                ("GET", 1, f"If-None-Match: {etag}\r\n"),
                ("GET", 0, "Connection: keep-alive\r\n"),
                ("HEAD", 0, "Connection: keep-alive\r\n"),
                ("GET", 1, "Connection: close\r\n"),
            ]
        ).encode()
        closing = request.format("GET", 0, "").encode()  # HTTP/1.0 without keep-alive: closed after it
        front = proxy.app[FRONT]
        documents = proxy.app[MIRROR]._documents
        now = documents.clock()
        monkeypatch.setattr(documents, "clock", lambda: now)
        answered = front.answered
        at_front = [await exchange(proxy, client_ssl, data) for data in (pipelined, closing)]
        assert front.answered == answered + 7
        with monkeypatch.context() as patch:
            patch.setattr(front, "answer", lambda request: None)
            by_application = [await exchange(proxy, client_ssl, data) for data in (pipelined, closing)]
        assert front.answered == answered + 7
        assert at_front == by_application
        assert at_front[0].count(b"HTTP/1.") == 6 and at_front[0].count(b"\r\nConnection: keep-alive\r\n") == 2
        assert at_front[0].count(b"HTTP/1.1 304 Not Modified\r\n") == 1 and at_front[0].endswith(
            b"Connection: close\r\n\r\n" + (await proxy.get(INDEX))[2]
        )


@pytest.mark.parametrize("path", [INDEX, VERSION_DOC])
async def test_a_token_holder_gets_the_same_answer_at_the_front_and_refusals_come_from_the_application(
    make_settings, client_ssl, tmp_path, monkeypatch, path
):
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS)
    async with serve_proxy(make_settings(auth_tokens=tokens), client_ssl) as proxy:
        await warm(proxy, path, bearer(READER))
        at_front, by_application = await both_ways(proxy, monkeypatch, "GET", path, bearer(READER))
        assert at_front.status == 200 and at_front == by_application
        assert at_front.log["client"]["name"] == "reader"
        cache_control = dict(at_front.headers)[b"Cache-Control"]
        assert cache_control.startswith(b"private,")
        if path == VERSION_DOC:  # its URLs carry grants for the token
            assert "grant=" in json.loads(at_front.body)["archives"]["linux_amd64"]["url"]
        front = proxy.app[FRONT]
        answered = front.answered
        for headers, status, code in [
            ({}, 401, "token_required"),
            (bearer("rpt_nobody_000000000003"), 401, "token_invalid"),
            (bearer(OUTSIDER), 403, "token_scope"),
        ]:
            got, _, body = await proxy.get(path, headers=headers)
            assert (got, json.loads(body)["code"]) == (status, code)
        assert front.answered == answered


async def test_behind_a_trusted_proxy_the_front_door_logs_the_client_the_application_would(
    make_settings, client_ssl, monkeypatch
):
    settings = make_settings(trusted_proxies=parse_networks(["127.0.0.0/8"]))
    async with serve_proxy(settings, client_ssl) as proxy:
        await warm(proxy, VERSION_DOC)
        forwarded = {"X-Forwarded-For": "6.6.6.6, 203.0.113.9"}
        at_front, by_application = await both_ways(proxy, monkeypatch, "GET", VERSION_DOC, forwarded)
        assert at_front == by_application and at_front.log["remote"] == "203.0.113.9"


async def test_what_the_front_door_must_not_answer_reaches_the_application(make_settings, client_ssl):
    async with serve_proxy(make_settings(), client_ssl) as proxy:
        front = proxy.app[FRONT]
        expected = await proxy.get(INDEX)
        await warm(proxy, INDEX)
        answered = front.answered
        encoded = URL(proxy.url + INDEX.replace("/index.json", "/%69ndex.json"), encoded=True)
        for url, headers in [
            (proxy.url + INDEX + "?x=1", {}),  # a query
            (encoded, {}),  # percent-encoded
            (proxy.url + INDEX, {"Expect": "100-continue"}),  # routing's to answer
        ]:
            async with proxy.session.get(url, headers=headers) as response:
                assert (response.status, await response.read()) == (200, expected[2]), url
        status, _, body = await proxy.get(INDEX.replace("index.json", "index.txt"))
        assert status == 404 and json.loads(body)["code"] == "document_not_found"
        async with proxy.session.post(proxy.url + INDEX) as response:
            assert response.status == 405
        assert front.answered == answered
