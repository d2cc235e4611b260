"""The OIDC key cache (`proxy.identity.oidc.IssuerKeys`) with a moved clock, the real upstream client and the real
metadata store: at most one fetch a minute for unknown kids, two processes sharing what one fetched, old keys
fetched again in the background.
"""

from __future__ import annotations

import pytest

from proxy.errors import OidcIssuerUnavailableError
from proxy.identity.issuers import parse_issuers
from proxy.identity.oidc import KEYS_MAX_AGE, IssuerKeys
from proxy.metadata_store.factory import open_metadata_store
from proxy.settings.config import Limits
from proxy.upstream.client import UpstreamClient, create_ssl_context
from proxy.upstream.netguard import AddressPolicy
from tests.integration.test_oidc import Clock, issuer, issuers_toml  # noqa: F401 - the fixture

FETCH = "/keys"


@pytest.fixture
async def parts(issuer, ca_file, make_local_settings):  # noqa: F811
    upstream = UpstreamClient.create(AddressPolicy(frozenset({issuer.allow})), Limits(), create_ssl_context(ca_file))
    store, _ = await open_metadata_store(make_local_settings())
    [config] = parse_issuers(issuers_toml(issuer)).issuers
    made: list[IssuerKeys] = []

    def keys(clock: Clock) -> IssuerKeys:
        made.append(IssuerKeys(upstream, store, clock=clock))
        return made[-1]

    yield config, keys
    for each in made:
        await each.close()
    await store.close()
    await upstream.close()


async def test_unknown_kids_make_at_most_one_fetch_a_minute(parts, issuer):  # noqa: F811
    config, make = parts
    clock = Clock()
    keys = make(clock)
    assert (await keys.keys_for(config, issuer.kid())).has(issuer.kid())
    for kid in ("made-up-1", "made-up-2", "made-up-3", None):
        assert not (await keys.keys_for(config, kid)).has(kid)
    assert issuer.count(FETCH) == 1
    clock.offset += 61
    await keys.keys_for(config, "made-up-4")
    await keys.keys_for(config, "made-up-5")
    assert issuer.count(FETCH) == 2


async def test_a_second_process_uses_the_keys_the_first_fetched(parts, issuer):  # noqa: F811
    config, make = parts
    clock = Clock()
    first, second = make(clock), make(clock)
    await first.keys_for(config, issuer.kid())
    assert (await second.keys_for(config, issuer.kid("ES256"))).has(issuer.kid("ES256"))  # from the store
    assert issuer.count(FETCH) == 1
    new = issuer.rotate()
    # within the minute of the fetch the first made, no process fetches for the new kid
    assert not (await second.keys_for(config, new)).has(new)
    assert issuer.count(FETCH) == 1
    clock.offset += 61
    assert (await second.keys_for(config, new)).has(new)
    assert (await first.keys_for(config, new)).has(new)  # what the second fetched, from the store
    assert issuer.count(FETCH) == 2


async def test_old_keys_are_fetched_again_in_the_background_and_a_withdrawn_key_goes(parts, issuer):  # noqa: F811
    config, make = parts
    clock = Clock()
    keys = make(clock)
    old = issuer.kid()
    await keys.keys_for(config, old)
    issuer.rotate()
    clock.offset += KEYS_MAX_AGE + 1
    assert (await keys.keys_for(config, old)).has(old)  # answered at once with the keys held
    await keys.settled()
    assert issuer.count(FETCH) == 2
    assert not (await keys.keys_for(config, old)).has(old)  # withdrawn by the issuer: gone


async def test_without_any_keys_an_unreachable_issuer_is_a_503_and_is_not_asked_again_within_the_minute(
    parts,
    issuer,  # noqa: F811
):
    config, make = parts
    clock = Clock()
    keys = make(clock)
    issuer.status = 500
    for _ in range(3):
        with pytest.raises(OidcIssuerUnavailableError, match="answered 500"):
            await keys.keys_for(config, issuer.kid())
    assert issuer.count("/.well-known/openid-configuration") == 2  # one fetch, retried once by the client
    issuer.status = None
    clock.offset += 61
    assert (await keys.keys_for(config, issuer.kid())).has(issuer.kid())
