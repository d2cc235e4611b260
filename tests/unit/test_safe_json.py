"""`proxy.protocol.safe_json`: the same documents as `json.loads`, nesting bounded, big documents parsed in steps."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.protocol import safe_json
from proxy.protocol.safe_json import MAX_DEPTH, JSONDocumentError

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
documents = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5), max_leaves=40
)
STEPPED = "[" + "[]," * MAX_DEPTH + "{}]"  # more brackets than MAX_DEPTH: parsed in steps


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


@given(documents, st.sampled_from([None, 0, 2]), st.booleans())
def test_any_document_reads_as_json_loads_reads_it(document, indent, stepped):
    text = json.dumps({"padding": json.loads(STEPPED), "value": document} if stepped else document, indent=indent)
    assert safe_json.loads(text) == json.loads(text)
    assert safe_json.loads(text.encode("utf-16")) == json.loads(text.encode("utf-16"))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "[1,]",
        '{"a":1,}',
        '{"a" 1}',
        "[1 2]",
        "{1: 2}",
        "[1] x",
        STEPPED + " x",
        STEPPED[:-1],
        STEPPED.replace("{}", '{"a":}'),
        STEPPED.replace("{}", '{"\\x": 1}'),
        STEPPED.replace("{}", "{,}"),
        "\ufeff{}",
    ],
)
def test_what_json_loads_refuses_is_refused(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(JSONDocumentError, match="is not valid JSON"):
        safe_json.loads(text)


def test_bytes_that_are_no_text_are_refused():
    with pytest.raises(JSONDocumentError, match="is not valid JSON"):
        safe_json.loads(b'{"a": "\xff"}')


@pytest.mark.parametrize("prefix", ["", '{"versions": [{"x": ', '[1, {"a": [0, '])
def test_nesting_is_bounded_at_every_level(prefix):
    """MAX_DEPTH levels in all are read; one more is refused, however the levels are split between the
    outer levels (walked in steps) and the inner ones (decoded whole)."""
    outer = prefix.count("[") + prefix.count("{")
    closing = "".join("]" if c == "[" else "}" for c in reversed([c for c in prefix if c in "[{"]))
    fits = prefix + nested(MAX_DEPTH - outer) + closing
    assert safe_json.loads(fits) == json.loads(fits)
    too_deep = prefix + nested(MAX_DEPTH - outer + 1) + closing
    with pytest.raises(JSONDocumentError, match=f"nested deeper than {MAX_DEPTH} levels"):
        safe_json.loads(too_deep)


def test_a_nesting_bomb_is_refused_without_recursion_error():
    for bomb in (b"[" * 200_000, b'{"a":' * 200_000, b"[" + b"[]," * 100 + b"[" * 200_000):
        with pytest.raises(JSONDocumentError):
            safe_json.loads(bomb)


def test_brackets_in_strings_do_not_count_as_nesting():
    text = json.dumps({"versions": [{"note": "[" * 500}] * 3, "more": ["{" * 100]})
    assert safe_json.loads(text) == json.loads(text)


def test_a_version_list_of_registry_shape_reads_the_same():
    platforms = [
        {"os": o, "arch": a, "filename": f"p_{o}_{a}.zip"} for o in ("linux", "darwin") for a in ("amd64", "arm64")
    ]
    versions = [{"version": f"5.{i}.0", "protocols": ["5.0"], "platforms": platforms} for i in range(400)]
    text = json.dumps({"versions": versions, "warnings": None}, indent=1)
    assert text.count("{") > MAX_DEPTH
    assert safe_json.loads(text.encode()) == json.loads(text)


BOMB = b"[" * 200_000


def test_every_parser_of_outside_json_refuses_a_bomb_with_its_own_error():
    """Upstream answers (discovery, versions, download documents, module answers) and what the commands
    read from a proxy: each names the problem; none raises RecursionError."""
    from yarl import URL

    from proxy.commands.healthcheck import verdict
    from proxy.commands.proxy_api import _request_error
    from proxy.domain.addresses import ModuleAddr, Platform, ProviderAddr, Version
    from proxy.errors import UpstreamError
    from proxy.protocol import discovery, module_registry, provider_registry

    provider = ProviderAddr.parse("registry.example.test", "acme", "foo")
    module = ModuleAddr.parse("registry.example.test", "acme", "net", "aws")
    version, platform, url = Version.parse("1.0.0"), Platform.parse("linux_amd64"), URL("https://r.test/x")
    for parse in (
        lambda: provider_registry.parse_versions(BOMB, provider),
        lambda: provider_registry.parse_download(BOMB, url, provider, version, platform),
        lambda: module_registry.parse_versions(BOMB, module),
        lambda: module_registry.parse_download(200, None, BOMB, module),
        lambda: discovery.parse_discovery(BOMB, "application/json", provider.hostname),
    ):
        with pytest.raises(UpstreamError, match=f"nested deeper than {MAX_DEPTH} levels"):
            parse()
    assert (
        module_registry.parse_download(200, "https://r.test/m.tgz", BOMB, module) == "https://r.test/m.tgz"
    )  # the header
    assert verdict("https://proxy.test/readyz", 200, BOMB) == (
        False,
        "unhealthy: https://proxy.test/readyz answered 200 without a readiness document",
    )
    assert _request_error(502, BOMB).message == "HTTP 502"
