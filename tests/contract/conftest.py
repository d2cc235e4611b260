"""The contract suites run over every Redis setup users run: one server, Sentinel and Cluster."""

from __future__ import annotations

import pytest

from proxy.metadata_store.redis import RedisStore
from tests.fakes.redis_server import REDIS_SETUPS


@pytest.fixture
def redis_setup(request):
    """`redis_setup(name)` → the session's setup of that name (one of REDIS_SETUPS), started if need be."""
    return lambda name: request.getfixturevalue(REDIS_SETUPS[name])


@pytest.fixture
def open_redis(redis_setup):
    """`open_redis(name, prefix=..., **options)` → a RedisStore on the session's setup of that name."""

    def open_(name: str, **options) -> RedisStore:
        return redis_setup(name).open_store(**options)

    return open_
