"""An error raised inside the Redis client library counts as Redis failing; one of the proxy's own does not."""

from __future__ import annotations

import os

import pytest

import proxy.metadata_store.redis as redis_module
from proxy.metadata_store.redis import RedisStore

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(redis_module.__file__)))


def coroutine_from(filename: str):
    """A coroutine function whose code claims to live in `filename` and that hits a closed TLS transport."""
    namespace: dict = {}
    source = "async def write():\n    transport = None\n    transport._write_appdata(b'')\n"
    exec(compile(source, filename, "exec"), namespace)
    return namespace["write"]


@pytest.fixture
async def store():
    store = RedisStore("redis://127.0.0.1:9", prefix="unit")  # never connected: the command is a stand-in
    yield store
    await store.close()


async def test_an_attribute_error_inside_the_client_library_is_redis_failing(store):
    write = coroutine_from("/usr/lib/python3.11/asyncio/sslproto.py")
    assert await store._call(write(), "fallback") == "fallback"
    assert not store.available


async def test_an_attribute_error_in_the_proxys_own_code_is_a_bug_and_raised(store):
    write = coroutine_from(os.path.join(PACKAGE_DIR, "cache", "redis.py"))
    with pytest.raises(AttributeError):
        await store._call(write(), "fallback")
