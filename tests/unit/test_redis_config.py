"""`--redis-url` as operators write it (one server, Sentinel, Cluster) and the Redis names of the proxy's keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.metadata_store.keys import NEGATIVE, NEGATIVE_BOOKKEEPING, SERVED, RedisNames
from proxy.settings.config import ConfigError, RedisTarget, Settings, parse_redis_target

SECRET = "0123456789abcdef0123"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://10.0.0.5:6379/2", RedisTarget("server", "", tls=False)),
        ("rediss://:pw@redis.internal/0", RedisTarget("server", "", tls=True)),
        ("unix:///run/redis.sock", RedisTarget("server", "")),
        (
            "redis+sentinel://s1:26380,s2,[fd00::3]:5000/registry",
            RedisTarget("sentinel", "", (("s1", 26380), ("s2", 26379), ("fd00::3", 5000)), "registry"),
        ),
        (
            "rediss+sentinel://app:p%40ss@s1/my%20master/3",
            RedisTarget("sentinel", "", (("s1", 26379),), "my master", 3, True, "app", "p@ss"),
        ),
        (
            "redis+cluster://:secret@n1:7000,n2:7001",
            RedisTarget("cluster", "", (("n1", 7000), ("n2", 7001)), password="secret"),
        ),
        ("rediss+cluster://n1/0", RedisTarget("cluster", "", (("n1", 6379),), tls=True)),
    ],
)
def test_redis_urls_of_each_setup(url: str, expected: RedisTarget) -> None:
    target = parse_redis_target(url)
    assert target == RedisTarget(**{**expected.__dict__, "url": url})
    assert target.cluster is (expected.kind == "cluster")


def test_a_password_in_the_url_is_never_shown() -> None:
    target = parse_redis_target("redis+cluster://:hunter2@n1:7000")
    assert "hunter2" not in repr(target)
    settings = Settings(data_dir=Path("d"), metadata_secret=SECRET, redis_url="redis://n1", redis_password="hunter2")
    assert "hunter2" not in repr(settings)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://redis:6379", "use redis://, rediss://, unix://, redis+sentinel://"),
        ("redis+sentinel://s1:26379", "name the master"),
        ("redis+sentinel://s1/registry/0/extra", "name the master"),
        ("redis+sentinel://s1/registry/zero", "'zero' is not a database number"),
        ("redis+cluster://n1:7000/1", "a Redis Cluster has one database, 0"),
        ("redis+cluster://n1:seven", "'n1:seven' is not HOST:PORT"),
        ("redis+cluster://n1:70000", "'n1:70000': no such port"),
        ("redis+cluster://n1,,n2", "'' is not HOST:PORT"),
        ("redis+cluster://[fd00::1:7000", "'[fd00::1:7000' is not HOST:PORT"),
        ("redis+sentinel://s1/registry?db=2", "takes no query or fragment"),
    ],
)
def test_wrong_redis_urls_are_refused_with_the_reason(url: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(reason)):
        parse_redis_target(url)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"redis_url": "redis://r/0", "redis_sentinel_password": "pw"}, "--redis-sentinel-password is for"),
        ({"redis_sentinel_password": "pw"}, "--redis-sentinel-password is for"),
        (
            {"redis_url": "redis+sentinel://s/m", "redis_ca_file": Path("ca.pem")},
            "--redis-ca-file is for Redis over TLS",
        ),
        ({"redis_url": "redis+cluster://n", "redis_prefix": "}fleet"}, "--redis-prefix must not start with '}'"),
    ],
)
def test_redis_settings_that_do_not_fit_together_are_refused(tmp_path: Path, settings: dict, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        Settings(data_dir=tmp_path, metadata_secret=SECRET, **settings)


def test_redis_settings_of_each_setup_are_accepted(tmp_path: Path) -> None:
    sentinel = Settings(
        data_dir=tmp_path,
        metadata_secret=SECRET,
        redis_url="rediss+sentinel://s1,s2/registry",
        redis_sentinel_password="pw",
        redis_ca_file=Path("ca.pem"),
    )
    assert sentinel.metadata.redis_sentinel_password == "pw"
    cluster = Settings(data_dir=tmp_path, metadata_secret=SECRET, redis_url="redis+cluster://n1", redis_prefix="{a}")
    assert cluster.metadata.redis_prefix == "{a}"


def test_plain_redis_keeps_the_names_every_deployment_holds() -> None:
    names = RedisNames("registry-proxy")
    assert [names.name(key) for key in ("versions:h/n/t", NEGATIVE.key("versions:h/n/t"), *NEGATIVE_BOOKKEEPING)] == [
        "registry-proxy:versions:h/n/t",
        "registry-proxy:negative:versions:h/n/t",
        "registry-proxy:negatives",
        "registry-proxy:negatives:sizes",
        "registry-proxy:negatives:bytes",
    ]


def slot_tag(name: str) -> str:
    """What Redis Cluster hashes of a key name: its hash tag (the first non-empty `{...}`), else the whole name."""
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    return name[start + 1 : end] if start >= 0 and end > start + 1 else name


@pytest.mark.parametrize("prefix", ["registry-proxy", "fleet{a", "{already-tagged}"])
def test_on_a_cluster_the_keys_used_together_share_one_slot_and_the_others_spread(prefix: str) -> None:
    names = RedisNames(prefix, cluster=True)
    together = [names.name(NEGATIVE.key(f"versions:h/n/t{n}")) for n in range(5)]
    together += [names.name(key) for key in NEGATIVE_BOOKKEEPING]
    assert len({slot_tag(name) for name in together}) == 1
    apart = [names.name(f"versions:h/n/t{n}") for n in range(5)] + [names.name(SERVED)]
    if "{" not in prefix:
        assert len({slot_tag(name) for name in apart}) == len(apart)
    for name in together + apart:
        assert names.name(names.key(name)) == name  # and back (how the bookkeeping's poisoned names are reported)


def test_a_cluster_prefix_that_would_cut_the_tag_short_is_refused() -> None:
    with pytest.raises(ValueError, match="would empty the hash tag"):
        RedisNames("}fleet", cluster=True)
    assert RedisNames("}fleet").name("negatives") == "}fleet:negatives"
