"""The one error model: neutral errors of pure modules (`addrs`) become 400 only in the web layer.

(Module archive failures as verification failures: tests/integration/test_http_registry.py; that the
pure parsers never import proxy.errors is an import contract in setup.cfg.)"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from proxy.domain.addresses import AddressError, Hostname, ModuleAddr, Version
from proxy.errors import ProxyError
from proxy.web.middlewares import INVALID_REQUEST_ERRORS

# The metadata store does not matter to what these tests check (the contract suites, the warm-path,
# freshness and failure tests run over both): the embedded store only.
pytestmark = pytest.mark.one_metadata_store


def address_error(parse, *args) -> str:
    with pytest.raises(AddressError) as info:
        parse(*args)
    return str(info.value)


def test_address_errors_are_neutral_and_mapped_by_the_web_layer() -> None:
    assert not issubclass(AddressError, ProxyError)
    assert AddressError in INVALID_REQUEST_ERRORS


@pytest.mark.parametrize(
    "path, message",
    [
        ("/mirror/v1/bad..host/acme/foo/index.json", lambda: address_error(Hostname.parse, "bad..host")),
        ("/mirror/v1/registry.example.test/acme/foo/v1.x.json", lambda: address_error(Version.parse, "v1.x")),
        (
            "/registry/registry.example.test/modules/v1/acme/net/AWS/versions",
            lambda: address_error(ModuleAddr.parse, "registry.example.test", "acme", "net", "AWS"),
        ),
    ],
)
async def test_a_malformed_address_answers_400_with_its_message(proxy, path, message) -> None:
    with capture_logs() as logs:
        status, body = await proxy.json(path)
    assert (status, body) == (400, {"errors": [message()], "code": "invalid_address"})
    assert not [e for e in logs if e["event"] in ("request.failed", "request.crashed")]  # expected, as before
