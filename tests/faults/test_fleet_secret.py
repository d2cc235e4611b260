"""Replicas that do not share the fleet's --metadata-secret are stopped at start, and the secret can be rotated.

Every record in the store is sealed with the metadata secret: a replica given another one reads each record as
forged (`security.metadata_poisoned`) and fetches everything again. The fleet's marker in the store
(`proxy.metadata_store.fleet_secret`) makes such a replica exit 2 with one line instead, and the rotation
(`--metadata-secret-accepted`, then `registry-proxy rotate-secret`) changes the secret with no replica refusing
what another wrote. Real proxy processes where exit codes and replicas are the point, on the session's
redis-server (a prefix of the test's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid

import pytest

from proxy.metadata_store.keys import FLEET_SECRET
from proxy.settings.config import ConfigError
from tests.fakes.packages import Release
from tests.fakes.process import ProxyProcess, child_environment, registry_proxy_in_process

PROVIDER = "registry.example.test/acme/foo"
ARCHIVE = "/mirror/v1/" + PROVIDER + "/{v}/linux_amd64/terraform-provider-foo_{v}_linux_amd64.zip"
UNKNOWN = "/mirror/v1/registry.example.test/acme/nope/index.json"
OLD = "old-fleet-secret-0123456789abcdef"
NEW = "new-fleet-secret-fedcba9876543210"


@pytest.fixture
def prefix() -> str:
    return f"fleet-secret-{uuid.uuid4().hex[:10]}"


def store_args(redis_server, prefix: str, secret: str, *accepted: str) -> tuple[str, ...]:
    extra = [arg for secret in accepted for arg in ("--metadata-secret-accepted", secret)]
    return ("--redis-url", redis_server.url, "--redis-prefix", prefix, "--metadata-secret", secret, *extra)


async def serve_until_exit(process: ProxyProcess, timeout: float = 60) -> tuple[int, str]:
    """Run the `serve` command `process` would run, to its exit: its exit code and its stderr."""
    process.data_dir.mkdir(parents=True, exist_ok=True)
    child = await asyncio.create_subprocess_exec(
        *process.args,
        cwd=process.source,
        env=child_environment(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, stderr = await asyncio.wait_for(child.communicate(), timeout)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    return child.returncode, stderr.decode()


@pytest.mark.process
async def test_a_replica_with_another_secret_exits_2_while_the_fleet_serves_on(
    proxy_process, connect, registry, redis_server, ca_file, prefix, tmp_path
):
    release = registry.releases[("acme", "foo")]["1.0.0"]
    first = await proxy_process(*store_args(redis_server, prefix, OLD), data_dir=tmp_path / "a")
    client = await connect(first)
    assert (await client.get(ARCHIVE.format(v="1.0.0")))[0] == 200

    other = ProxyProcess(tmp_path / "b", registry.url, ca_file, *store_args(redis_server, prefix, NEW))
    code, stderr = await serve_until_exit(other)

    assert (code, stderr.splitlines()) == (
        2,
        [f"registry-proxy: error: --metadata-secret differs from the fleet's in {redis_server.url}"],
    )
    status, _, body = await client.get(ARCHIVE.format(v="1.0.0"))
    assert (status, body) == (200, release.zips["linux_amd64"])
    assert (await client.get("/readyz"))[0] == 200
    assert first.events("security.metadata_poisoned") == []


async def test_a_lost_marker_is_made_again_and_a_replica_it_no_longer_opens_for_turns_unready(
    in_process_proxy, connect, registry, redis_server, attacker, prefix, tmp_path
):
    first = await in_process_proxy(*store_args(redis_server, prefix, OLD), data_dir=tmp_path / "a")
    client = await connect(first)
    assert (await client.get("/readyz"))[0] == 200
    marker = f"{prefix}:{FLEET_SECRET}"
    assert attacker.exists(marker) and attacker.ttl(marker) == -1  # never expires: kept whatever the retention

    attacker.delete(marker)  # FLUSHDB, an eviction or a restart without persistence
    other = await in_process_proxy(*store_args(redis_server, prefix, NEW), data_dir=tmp_path / "b")
    other_client = await connect(other)
    assert (await other_client.get("/readyz"))[0] == 200  # the marker made again, with its secret
    assert (await other_client.get(ARCHIVE.format(v="1.1.0")))[0] == 200  # records sealed with its secret
    assert (await other_client.get(UNKNOWN))[0] == 404  # and a remembered 404

    status, _, body = await client.get("/readyz")
    assert status == 503
    assert b"--metadata-secret differs from the fleet's" in body
    assert [r["event"] for r in first.events("metadata.secret_mismatch")] == ["metadata.secret_mismatch"]
    assert (await client.get(UNKNOWN))[0] == 404
    status, _, body = await client.get(ARCHIVE.format(v="1.1.0"))  # served, without reading the store
    assert (status, body) == (200, registry.releases[("acme", "foo")]["1.1.0"].zips["linux_amd64"])
    assert first.events("security.metadata_poisoned") == []


async def test_a_forged_marker_is_a_mismatch_not_a_new_fleet(
    in_process_proxy, redis_server, attacker, prefix, tmp_path
):
    attacker.set(f"{prefix}:{FLEET_SECRET}", b"rps1." + b"0" * 64 + b".made-up")
    with pytest.raises(ConfigError, match="--metadata-secret differs from the fleet's in redis://"):
        await in_process_proxy(*store_args(redis_server, prefix, OLD), data_dir=tmp_path / "a")


async def test_an_embedded_data_dir_sealed_with_another_secret_refuses_to_start_until_rotated(
    in_process_proxy, connect, registry, tmp_path
):
    data_dir = tmp_path / "data"
    first = await in_process_proxy(data_dir=data_dir)  # the data dir's own secret, made on first start
    assert (await (await connect(first)).get(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
    assert (await (await connect(first)).get(ARCHIVE.format(v="1.0.0")))[0] == 200
    await first.stop()
    own = (data_dir / "metadata" / "metadata.secret").read_text().strip()

    database = data_dir / "metadata" / "metadata.sqlite"

    def rows() -> dict[str, bytes]:
        with contextlib.closing(sqlite3.connect(database)) as db:
            return {key: bytes(value) for key, value in db.execute("SELECT key, value FROM metadata")}

    before = rows()
    assert FLEET_SECRET in before
    with pytest.raises(ConfigError) as refused:
        await in_process_proxy("--metadata-secret", NEW, data_dir=data_dir)
    assert str(refused.value) == f"--metadata-secret differs from the one that sealed {database}"
    assert rows() == before  # nothing written with the other secret

    # the rotation, as on Redis: the data dir's secret accepted for reading, the store sealed again, then dropped
    requests = len(registry.requests)
    accepting = ("--metadata-secret", NEW, "--metadata-secret-accepted", own)
    again = await in_process_proxy(*accepting, data_dir=data_dir)
    assert (await (await connect(again)).get(ARCHIVE.format(v="1.0.0")))[0] == 200
    code, output = await registry_proxy_in_process("rotate-secret", "--data-dir", str(data_dir), *accepting)
    assert code == 0 and "marker sealed with the new secret" in output, output
    await again.stop()
    rotated = await in_process_proxy("--metadata-secret", NEW, data_dir=data_dir)
    assert (await (await connect(rotated)).get(ARCHIVE.format(v="1.0.0")))[0] == 200
    assert (await (await connect(rotated)).get(f"/mirror/v1/{PROVIDER}/1.0.0.json"))[0] == 200
    assert registry.requests[requests:] == []
    assert again.events("security.metadata_poisoned") == rotated.events("security.metadata_poisoned") == []


async def test_rotating_the_secret_through_a_rolling_restart_refuses_nothing(
    in_process_proxy, connect, registry, signing_key, redis_server, prefix, tmp_path
):
    """The procedure of docs/operations.md, on two replicas (in this process: what is checked is what each reads of
    the store, not its process) restarted one at a time: after each restart the
    restarted replica writes a new version's records, and then each replica reads every version's records
    written so far, under whichever secret, from the store (the restarted one has nothing in memory) without
    asking the upstream again and without refusing one."""
    added = [f"1.{minor}.0" for minor in range(2, 8)]  # one per restart
    for version in added:
        registry.add(Release("acme", "foo", version, signing_key, platforms=("linux_amd64",)))
    versions = iter(["1.0.0", *added])
    served: list[str] = []
    shared = tmp_path / "shared-data"  # one archive store, as a fleet has
    running = {name: await in_process_proxy(*store_args(redis_server, prefix, OLD), data_dir=shared) for name in "ab"}

    async def write_then_read_all(writer: str) -> None:
        version, client = next(versions), await connect(running[writer])
        assert (await client.get(f"/mirror/v1/{PROVIDER}/{version}.json"))[0] == 200
        assert (await client.get(ARCHIVE.format(v=version)))[0] == 200
        served.append(version)
        requests = len(registry.requests)
        for proxy in running.values():
            client = await connect(proxy)
            for version in served:
                assert (await client.get(f"/mirror/v1/{PROVIDER}/{version}.json"))[0] == 200
                assert (await client.get(ARCHIVE.format(v=version)))[0] == 200
        assert registry.requests[requests:] == []

    async def roll(*args: str) -> None:
        for name in running:
            await running[name].stop()
            running[name] = await in_process_proxy(*args, data_dir=shared)
            await write_then_read_all(name)

    await write_then_read_all("a")
    await roll(*store_args(redis_server, prefix, OLD, NEW))  # 1. the new secret accepted everywhere
    await roll(*store_args(redis_server, prefix, NEW, OLD))  # 2. written with the new one, the old accepted
    code, output = await registry_proxy_in_process("rotate-secret", *store_args(redis_server, prefix, NEW, OLD))
    assert code == 0, output
    assert "marker sealed with the new secret" in output
    await roll(*store_args(redis_server, prefix, NEW))  # 3. the old secret dropped

    for proxy in running.values():
        assert proxy.events("security.metadata_poisoned") == []
        assert proxy.events("metadata.secret_mismatch") == []


async def test_rotate_secret_without_the_fleets_secret_changes_nothing(
    redis_server, attacker, prefix, in_process_proxy, tmp_path
):
    await in_process_proxy(*store_args(redis_server, prefix, OLD), data_dir=tmp_path / "a")
    marker = attacker.get(f"{prefix}:{FLEET_SECRET}")
    code, output = await registry_proxy_in_process("rotate-secret", *store_args(redis_server, prefix, NEW))
    assert (code, output.strip().splitlines()[-1]) == (
        2,
        f"registry-proxy: error: --metadata-secret differs from the fleet's in {redis_server.url}",
    )
    assert attacker.get(f"{prefix}:{FLEET_SECRET}") == marker


@pytest.mark.parametrize(
    "command", [("policy", "baseline", PROVIDER), ("trust", "list", PROVIDER), ("trust", "accept", PROVIDER, "0" * 40)]
)
async def test_a_store_command_with_another_secret_exits_2_and_writes_nothing(
    redis_server, attacker, prefix, in_process_proxy, tmp_path, command
):
    """`policy baseline` and `trust` check the marker as `serve` does: with another fleet's secret their writes
    would be skipped unseen, and `baseline` would say it recorded what it did not."""
    await in_process_proxy(*store_args(redis_server, prefix, OLD), data_dir=tmp_path / "a")
    before = sorted(attacker.keys(f"{prefix}:*"))
    code, output = await registry_proxy_in_process(*command, *store_args(redis_server, prefix, NEW))
    assert (code, output.strip().splitlines()[-1]) == (
        2,
        f"registry-proxy: error: --metadata-secret differs from the fleet's in {redis_server.url}",
    )
    assert sorted(attacker.keys(f"{prefix}:*")) == before
