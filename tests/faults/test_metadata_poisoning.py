"""A writer to the shared Redis store must not be able to downgrade a provider or swap its hashes.

Real proxy processes on a real redis-server; the attacker is a plain redis client that copies
valid records under other keys (1.0.0's under 1.1.0, one platform's under another) and forges
a record from scratch. The proxy restarts between, so no in-process copy hides the problem.
"""

from __future__ import annotations

import io
import json
import sqlite3
import uuid

import pytest

from proxy.domain.hashes import Hash, h1_of_zip
from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import seal, unseal
from proxy.settings.config import ConfigError

PROVIDER = "registry.example.test/acme/foo"
ARCHIVE = "/mirror/v1/" + PROVIDER + "/{v}/{p}/terraform-provider-foo_{v}_{p}.zip"
SECRET = "test-metadata-secret-0123456789abcdef"


def h1_dir(data: bytes) -> str:
    return str(h1_of_zip(io.BytesIO(data))[1])


@pytest.fixture
def prefix() -> str:
    return f"poison-{uuid.uuid4().hex[:10]}"


def redis_args(redis_server, prefix: str, secret: str = SECRET) -> tuple[str, ...]:
    return ("--redis-url", redis_server.url, "--redis-prefix", prefix, "--metadata-secret", secret)


async def test_copied_and_forged_redis_records_never_downgrade_a_provider(
    in_process_proxy, connect, registry, redis_server, attacker, prefix, tmp_path
):
    releases = registry.releases[("acme", "foo")]
    old, new = releases["1.0.0"], releases["1.1.0"]
    data_dir = tmp_path / "replica"
    proc = await in_process_proxy(*redis_args(redis_server, prefix), data_dir=data_dir)
    client = await connect(proc)
    for version, platform in [
        ("1.0.0", "linux_amd64"),
        ("1.1.0", "linux_amd64"),
        ("1.0.0", "windows_amd64"),
        ("1.1.0", "darwin_arm64"),
    ]:
        status, _, body = await client.get(ARCHIVE.format(v=version, p=platform))
        assert status == 200
        assert body == releases[version].zips[platform]
    status, _, _ = await client.get(f"/lock/v1/{PROVIDER}/1.1.0?platform=linux_amd64")
    assert status == 200
    await proc.stop()

    # The attacker: valid records copied under other keys, and a record made up from scratch.
    def key(name: str) -> str:
        return f"{prefix}:{name}"

    def copy(source: str, target: str) -> None:
        value = attacker.get(key(source))
        assert value is not None, f"{source} is not in Redis"
        attacker.set(key(target), value)

    sums_keys = {}
    for raw_key in attacker.scan_iter(match=key("sums:*")):
        name = raw_key.decode().removeprefix(f"{prefix}:")
        value = attacker.get(raw_key)
        sums_keys["1.1.0" if b"_1.1.0_" in bytes.fromhex(_payload_field(value, "sums")) else "1.0.0"] = name
    assert set(sums_keys) == {"1.0.0", "1.1.0"}
    for kind in ("download", "archive"):
        copy(f"{kind}:{PROVIDER}/1.0.0/linux_amd64", f"{kind}:{PROVIDER}/1.1.0/linux_amd64")
    copy(sums_keys["1.0.0"], sums_keys["1.1.0"])
    copy(f"archive:{PROVIDER}/1.1.0/linux_amd64", f"archive:{PROVIDER}/1.1.0/darwin_arm64")
    forged = {
        "sha256": old.sha256("windows_amd64"),
        "size": len(old.zips["windows_amd64"]),
        "filename": new.filename("windows_amd64"),
        "h1_zip": "h1:forged",
        "h1_dir": h1_dir(old.zips["windows_amd64"]),
    }
    attacker.set(
        key(f"archive:{PROVIDER}/1.1.0/windows_amd64"),
        json.dumps({"v": 1, "kind": "record", "data": forged}, sort_keys=True).encode(),
    )
    downloads_before = registry.count(registry.archive_path(new, "linux_amd64"))

    proc = await in_process_proxy(*redis_args(redis_server, prefix), data_dir=data_dir)
    client = await connect(proc)
    for platform in ("linux_amd64", "darwin_arm64", "windows_amd64"):
        status, _, body = await client.get(ARCHIVE.format(v="1.1.0", p=platform))
        assert status == 200
        assert body == new.zips[platform], f"1.1.0 {platform} served other bytes (the 1.0.0 zip?)"
    status, _, body = await client.get(
        f"/lock/v1/{PROVIDER}/1.1.0?platform=linux_amd64&platform=darwin_arm64&platform=windows_amd64"
    )
    assert status == 200
    platforms = json.loads(body)["platforms"]
    for platform in ("linux_amd64", "darwin_arm64", "windows_amd64"):
        assert platforms[platform] == {"h1": h1_dir(new.zips[platform]), "zh": str(Hash.zh(new.sha256(platform)))}

    poisoned = {record["key"] for record in proc.events("security.metadata_poisoned")}
    assert {
        f"archive:{PROVIDER}/1.1.0/linux_amd64",
        f"archive:{PROVIDER}/1.1.0/darwin_arm64",
        f"archive:{PROVIDER}/1.1.0/windows_amd64",
    } <= poisoned
    assert all(record.get("store") == "redis" for record in proc.events("security.metadata_poisoned"))
    _, _, metrics = await client.get("/metrics")
    refused = {
        line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.decode().splitlines()
        if line.startswith("registry_proxy_metadata_rejected_total{")
    }
    assert refused['reason="bad_seal",store="redis"'] >= 3 and refused['reason="no_seal",store="redis"'] >= 1
    assert not any(SECRET in json.dumps(record, default=str) for record in proc.events())
    # The archive on disk was reused (its bytes are the signed ones): nothing downloaded again.
    assert registry.count(registry.archive_path(new, "linux_amd64")) == downloads_before

    # Recovered: the records were rewritten, so another replica serves 1.1.0 from them, with no new event.
    await proc.stop()
    proc = await in_process_proxy(*redis_args(redis_server, prefix), data_dir=data_dir)
    client = await connect(proc)
    status, _, body = await client.get(ARCHIVE.format(v="1.1.0", p="linux_amd64"))
    assert (status, body) == (200, new.zips["linux_amd64"])
    assert proc.events("security.metadata_poisoned") == []


def _payload_field(value: bytes, name: str) -> str:
    """A field of a record as the attacker reads it (whatever envelope the proxy puts around the JSON)."""
    start = value.index(b"{")
    return json.loads(value[start:])["data"][name]


async def test_a_replica_with_another_secret_does_not_start(in_process_proxy, connect, redis_server, prefix, tmp_path):
    """It would read every record as forged: the fleet's marker stops it first (tests/faults/test_fleet_secret.py)."""
    first = await in_process_proxy(*redis_args(redis_server, prefix), data_dir=tmp_path / "a")
    status, _, _ = await (await connect(first)).get(ARCHIVE.format(v="1.0.0", p="linux_amd64"))
    assert status == 200
    with pytest.raises(ConfigError, match="--metadata-secret differs from the fleet's"):
        await in_process_proxy(
            *redis_args(redis_server, prefix, secret="another-secret-of-a-forgotten-replica"), data_dir=tmp_path / "b"
        )
    assert first.events("security.metadata_poisoned") == []


async def test_redis_without_a_secret_refuses_to_start(proxy_process, redis_server, prefix):
    with pytest.raises(RuntimeError, match="metadata-secret"):
        await proxy_process("--redis-url", redis_server.url, "--redis-prefix", prefix)


async def test_a_resealed_archive_record_must_still_match_the_signed_sums(
    in_process_proxy, connect, registry, redis_server, attacker, prefix, tmp_path
):
    """Defence in depth: even with the secret, an archive record alone cannot point 1.1.0 at 1.0.0's zip."""
    releases = registry.releases[("acme", "foo")]
    data_dir = tmp_path / "replica"
    proc = await in_process_proxy(*redis_args(redis_server, prefix), data_dir=data_dir)
    client = await connect(proc)
    for version in ("1.0.0", "1.1.0"):
        assert (await client.get(ARCHIVE.format(v=version, p="linux_amd64")))[0] == 200
    await proc.stop()
    source, target = (f"archive:{PROVIDER}/{v}/linux_amd64" for v in ("1.0.0", "1.1.0"))
    value, why = unseal(SECRET.encode(), source, attacker.get(f"{prefix}:{source}"))
    assert why == ""
    attacker.set(f"{prefix}:{target}", seal(SECRET.encode(), target, value))

    proc = await in_process_proxy(*redis_args(redis_server, prefix), data_dir=data_dir)
    status, _, body = await (await connect(proc)).get(ARCHIVE.format(v="1.1.0", p="linux_amd64"))
    assert (status, body) == (200, releases["1.1.0"].zips["linux_amd64"])
    assert {(r["key"], r["store"]) for r in proc.events("security.metadata_poisoned")} == {(target, "consistency")}


async def test_upgrading_an_embedded_data_dir_seals_its_records_and_keeps_serving_offline(
    in_process_proxy, connect, registry, tmp_path
):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    data_dir = tmp_path / "data"
    proc = await in_process_proxy(data_dir=data_dir)
    client = await connect(proc)
    assert (await client.get(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
    assert (await client.get(ARCHIVE.format(v="1.0.0", p="linux_amd64")))[0] == 200
    await proc.stop()
    # As a version before seals left it: the same records, unsealed, and no secret file (nor its marker).
    secret_file = data_dir / "metadata" / "metadata.secret"
    secret = secret_file.read_bytes().strip()
    with sqlite3.connect(data_dir / "metadata" / "metadata.sqlite") as db:
        assert db.execute("DELETE FROM metadata WHERE key = ?", (FLEET_SECRET,)).rowcount == 1
        for key, value in db.execute("SELECT key, value FROM metadata").fetchall():
            plain, why = unseal(secret, key, bytes(value))
            assert why == ""
            db.execute("UPDATE metadata SET value = ? WHERE key = ?", (plain, key))
    secret_file.unlink()

    requests = len(registry.requests)
    proc = await in_process_proxy("--offline", data_dir=data_dir)
    client = await connect(proc)
    status, _, body = await client.get(ARCHIVE.format(v="1.0.0", p="linux_amd64"))
    assert (status, body) == (200, release.zips["linux_amd64"])
    assert (await client.get(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
    assert registry.requests[requests:] == []
    assert proc.events("security.metadata_poisoned") == []
    assert proc.events("metadata.records_sealed")[0]["records"] >= 4
