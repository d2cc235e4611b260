"""Whoever can write to the fleet's Redis cannot make a real `terraform init` install other bytes.

The proxy (`serve`, in the test's process: these restart it many times, and what they check is the
store, not the process) on a real redis-server, the real `terraform` binary, and an attacker that is a
plain Redis client. It writes what a faulty or hostile neighbour of the fleet could: a value under
a key of another namespace (the remembered 404s), values without the seal, values sealed under
other keys, and garbage. The proxy must ignore every one of them (logging
`security.metadata_poisoned`), fetch again what it needs, and serve only the signed bytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import ssl
from pathlib import Path

import aiohttp
import pytest
import redis

from proxy.domain.hashes import Hash, h1_of_zip
from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import unseal
from tests.conftest import PROVIDER
from tests.e2e.test_network_mirror_e2e import locked_hashes, mirror_config, provider_tf
from tests.e2e.test_registry_e2e import MAIN_TF as REGISTRY_TF
from tests.e2e.test_registry_e2e import host_config
from tests.fakes.packages import MODULE_FILES
from tests.fakes.redis_server import METADATA_SECRET

pytestmark = pytest.mark.e2e

SECRET = METADATA_SECRET.encode()


@pytest.fixture
def prefix(tmp_path) -> str:
    return f"trust-{tmp_path.name[-12:]}"


def redis_args(redis_server, prefix: str) -> tuple[str, ...]:
    return ("--redis-url", redis_server.url, "--redis-prefix", prefix, "--metadata-secret", METADATA_SECRET)


def h1_dir(data: bytes) -> str:
    return str(h1_of_zip(io.BytesIO(data))[1])


def installed_files(workdir, version: str) -> list[str]:
    """The files terraform unpacked for the provider `version` (linux_amd64)."""
    folder = workdir / ".terraform" / "providers" / PROVIDER / version / "linux_amd64"
    return sorted(path.name for path in folder.iterdir())


async def test_a_download_answer_planted_among_the_remembered_404s_cannot_downgrade_a_provider(
    in_process_proxy, registry, redis_server, attacker, prefix, terraform
):
    """Issue 18, item 1: 1.0.0's download answer, unsealed, under `negative:download:…/1.1.0/…`."""
    new = registry.releases[("acme", "foo")]["1.1.0"]
    proxy = await in_process_proxy(*redis_args(redis_server, prefix))
    first = terraform.workdir("first", provider_tf("1.0.0"))
    code, output = await terraform.init(first, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output

    source = f"download:{PROVIDER}/1.0.0/linux_amd64"
    sealed = attacker.get(f"{prefix}:{source}")
    assert sealed is not None, f"{source} is not in Redis"
    plain, why = unseal(SECRET, source, sealed)
    assert why == "" and b'"status": 200' in plain
    attacker.set(f"{prefix}:negative:download:{PROVIDER}/1.1.0/linux_amd64", plain)

    second = terraform.workdir("second", provider_tf("1.1.0"))
    code, output = await terraform.init(second, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert installed_files(second, "1.1.0") == ["terraform-provider-foo_v1.1.0"], "1.0.0 installed as 1.1.0"
    assert locked_hashes(second) == [h1_dir(new.zips["linux_amd64"])]
    assert await lock_hashes(proxy, "1.1.0") == {
        "h1": h1_dir(new.zips["linux_amd64"]),
        "zh": str(Hash.zh(new.sha256("linux_amd64"))),
    }
    poisoned = {event["key"] for event in proxy.events("security.metadata_poisoned")}
    assert f"negative:download:{PROVIDER}/1.1.0/linux_amd64" in poisoned


async def get(proxy, path: str) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    async with aiohttp.ClientSession() as session, session.get(proxy.url + path, ssl=context) as response:
        return response.status, await response.read()


async def lock_hashes(proxy, version: str, platform: str = "linux_amd64") -> dict[str, str]:
    """The `h1:` and `zh:` the proxy's lock endpoint gives for one platform of a version."""
    status, body = await get(proxy, f"/lock/v1/{PROVIDER}/{version}?platform={platform}")
    assert status == 200, body
    return json.loads(body)["platforms"][platform]


# ---- the matrix: every namespace the proxy writes, every kind of forgery ---------------------------------

# Namespaces whose content is not a value read as a fact about an artifact: they order or bound other keys.
# They cannot be sealed member by member (sorted sets, hashes, counters that Redis updates in place); what
# they may not do is take the store down or change a byte served. A namespace of another Redis type that is
# not listed here fails the test: seal it, or list it with the reason it needs no seal.
BOOKKEEPING = {
    "negatives": "write order, sizes and total bytes of the remembered 404s: they bound how many are kept",
    "served": "when each archive was last served: the order of eviction, never which bytes are served",
}
# Keys whose forgery is not a miss but a refusal to start (their own tests say so); the rounds leave them be.
FAIL_CLOSED = {
    FLEET_SECRET: "the fleet's secret marker: forged, every replica exits 2 (tests/faults/test_fleet_secret.py)",
}
ROUNDS = {
    "garbage": "random bytes under every key",
    "wrong_type": "every key holds another Redis type",
    "unsealed": "every value without its seal (well-formed: the proxy's own JSON); bookkeeping forged",
    "moved": "every value sealed, but under another key (or another namespace)",
}
UNKNOWN = f"/mirror/v1/{PROVIDER}".replace("/foo", "/nope") + "/index.json"
ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"


def namespace_of(name: str) -> str:
    """The namespace of a key (without the prefix): its kind, up to the first colon."""
    return name.split(":", 1)[0]


class RedisAttacker:
    """Every key of the fleet's prefix, as a Redis client without the secret (but with copies of what it
    finds) sees it: snapshots, restores and forgeries."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    def names(self) -> dict[str, str]:
        """Every key of the prefix (without it) and its Redis type."""
        found = {}
        for raw in self.client.scan_iter(match=f"{self.prefix}:*"):
            found[raw.decode().removeprefix(f"{self.prefix}:")] = self.client.type(raw).decode()
        return found

    def snapshot(self) -> dict[str, tuple[bytes, int]]:
        return {name: (self.client.dump(self._full(name)), self.client.pttl(self._full(name))) for name in self.names()}

    def restore(self, snapshot: dict[str, tuple[bytes, int]]) -> None:
        for name in self.names():
            self.client.delete(self._full(name))
        for name, (dumped, ttl) in snapshot.items():
            self.client.restore(self._full(name), max(ttl, 0), dumped, replace=True)

    def forge(self, attack: str) -> tuple[set[str], set[str]]:
        """Tamper with every key as `attack` says; returns (the names tampered with, the namespaces whose
        tampering the proxy must report as it reads them)."""
        names = self.names()
        values = {n: t for n, t in names.items() if namespace_of(n) not in BOOKKEEPING and n not in FAIL_CLOSED}
        unclassified = {namespace_of(n) for n, t in values.items() if t != "string"}
        assert not unclassified, f"namespaces that are neither sealed values nor bookkeeping: {unclassified}"
        sealed = {name: self.client.get(self._full(name)) for name in values}
        twins = {f"negative:{name}": name for name in values if namespace_of(name) != "negative"}
        ordered = sorted(values)
        for index, name in enumerate(ordered):
            donor = next(other for other in ordered[index + 1 :] + ordered[:index] if other != name)
            self._value(name, attack, plain=_plain(name, sealed[name]), moved=sealed[donor])
        for twin, source in twins.items():
            self._value(twin, attack, plain=_plain(source, sealed[source]), moved=sealed[source])
        for name, kind in names.items():
            if namespace_of(name) in BOOKKEEPING:
                self._bookkeeping(name, kind, attack, moved=sealed[ordered[0]])
        must = {namespace_of(name) for name in values} | {"negative"}
        if attack != "unsealed":  # forged but well-formed bookkeeping cannot be told from the real thing
            must |= {namespace_of(name) for name in names} & set(BOOKKEEPING)
        return set(values) | set(twins) | {n for n in names if namespace_of(n) in BOOKKEEPING}, must

    def _value(self, name: str, attack: str, *, plain: bytes, moved: bytes) -> None:
        full = self._full(name)
        self.client.delete(full)
        if attack == "wrong_type":
            self.client.rpush(full, b"planted")
        else:
            self.client.set(full, {"garbage": b"\x00\xffgarbage\x7f", "unsealed": plain, "moved": moved}[attack])

    def _bookkeeping(self, name: str, kind: str, attack: str, *, moved: bytes) -> None:
        full = self._full(name)
        if attack == "unsealed":  # well-formed lies: never served, forgotten, evicted or counted right
            if kind == "zset":
                members = {member: 0 for member in self.client.zrange(full, 0, -1)}
                self.client.zadd(full, {**members, b"versions:registry.example.test/acme/forged": 0})
            elif kind == "hash":
                self.client.hset(full, mapping={field: 10**9 for field in self.client.hkeys(full)})
            else:
                self.client.set(full, 10**12)
            return
        self.client.delete(full)
        if attack == "wrong_type":
            self.client.rpush(full, b"planted")
        else:
            self.client.set(full, b"\x00\xffgarbage\x7f" if attack == "garbage" else moved)

    def _full(self, name: str) -> str:
        return f"{self.prefix}:{name}"


def _plain(name: str, sealed: bytes) -> bytes:
    """The value the proxy sealed under `name`, without its seal: well-formed, but forgeable by anyone."""
    value, why = unseal(SECRET, name, sealed)
    assert why == "", f"{name}: {why}"
    return value


class EmbeddedAttacker:
    """Every row of the embedded SQLite file (the proxy stopped), as someone who can write the file but does
    not hold the secret (given with --metadata-secret, not kept in the data dir) sees it."""

    rounds = {
        "garbage": "random bytes, text or a number in every row",
        "unsealed": "every value without its seal (well-formed: the proxy's own JSON); served times forged",
        "moved": "every value sealed, but under another key",
    }

    def __init__(self, database: Path) -> None:
        self.database = database

    def snapshot(self) -> dict[str, list[tuple]]:
        with contextlib.closing(sqlite3.connect(self.database)) as db:
            return {table: db.execute(f"SELECT * FROM {table}").fetchall() for table in ("metadata", "served")}

    def restore(self, snapshot: dict[str, list[tuple]]) -> None:
        with contextlib.closing(sqlite3.connect(self.database)) as db, db:
            for table, rows in snapshot.items():
                db.execute(f"DELETE FROM {table}")
                db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)

    def names(self) -> set[str]:
        return {str(key) for key, _ in self.snapshot()["metadata"]} | {"served"}

    def forge(self, attack: str) -> tuple[set[str], set[str]]:
        rows = {key: value for key, value in self.snapshot()["metadata"] if key not in FAIL_CLOSED}
        ordered = sorted(rows)
        garbage = (b"\x00\xffgarbage\x7f", "garbage text", 42)
        with contextlib.closing(sqlite3.connect(self.database)) as db, db:
            for index, key in enumerate(ordered):
                donor = ordered[(index + 1) % len(ordered)]
                value = {
                    "garbage": garbage[index % len(garbage)],
                    "unsealed": _plain(key, bytes(rows[key])),
                    "moved": rows[donor],
                }[attack]
                db.execute("UPDATE metadata SET value = ? WHERE key = ?", (value, key))
            db.execute(
                "UPDATE served SET at = ?",
                ({"garbage": "garbage", "unsealed": 0.0, "moved": rows[ordered[0]]}[attack],),
            )
        return set(rows) | {"served"}, {namespace_of(key) for key in rows}


async def test_no_forged_value_in_any_redis_namespace_changes_a_byte_terraform_gets(
    in_process_proxy, registry, git_modules, redis_server, attacker, prefix, terraform
):
    """Issue 18's matrix on Redis: every namespace found there (so a new one is covered by itself),
    every key forged in four ways in turn (`ROUNDS`)."""

    async def start(data_dir: Path):
        return await in_process_proxy(*redis_args(redis_server, prefix), data_dir=data_dir)

    found = await forged_in_every_round(RedisAttacker(attacker, prefix), ROUNDS, start, registry, terraform)
    assert {"discovery", "versions", "download", "sums", "archive", "module", "negative", "served"} <= found


async def test_no_forged_row_of_the_embedded_store_changes_a_byte_terraform_gets(
    in_process_proxy, registry, git_modules, terraform
):
    """The same matrix on the embedded SQLite file (its remembered 404s live in process memory)."""
    data_dir = terraform.root.parent / "replica"

    async def start(folder: Path):
        return await in_process_proxy("--metadata-secret", METADATA_SECRET, data_dir=folder)

    embedded = EmbeddedAttacker(data_dir / "metadata" / "metadata.sqlite")
    found = await forged_in_every_round(embedded, embedded.rounds, start, registry, terraform)
    assert {"discovery", "versions", "download", "sums", "archive", "module", "served"} <= found


async def forged_in_every_round(attacker, rounds: dict[str, str], start, registry, terraform) -> set[str]:
    """A real init through a proxy started by `start(data_dir)`; then, per round, the store as it was after
    it, forged by `attacker`, and the same init (with its lock file) through a restarted proxy, which must
    refuse every forged value it reads (and only those), fetch again what it needs, and serve the same
    bytes and hashes, without ever counting the store as down. Returns the namespaces found."""
    release = registry.releases[("acme", "foo")]["1.0.0"]
    data_dir = terraform.root.parent / "replica"
    proxy = await start(data_dir)
    first = terraform.workdir("first", REGISTRY_TF)
    code, output = await terraform.init(first, host_config(proxy), proxy.ca_file)
    assert code == 0, output
    assert (await get(proxy, UNKNOWN))[0] == 404  # a remembered 404 too
    expected = {"lock file": locked_hashes(first), "lock endpoint": await lock_hashes(proxy, "1.0.0")}
    await proxy.stop()
    pristine = attacker.snapshot()
    found = {namespace_of(name) for name in attacker.names()}

    versions_path = "/v1/providers/acme/foo/versions"
    for attack, how in rounds.items():
        attacker.restore(pristine)
        tampered, must_refuse = attacker.forge(attack)
        fetched = registry.count(versions_path)
        proxy = await start(data_dir)
        workdir = terraform.workdir(attack, REGISTRY_TF)
        (workdir / ".terraform.lock.hcl").write_bytes((first / ".terraform.lock.hcl").read_bytes())
        code, output = await terraform.init(workdir, host_config(proxy), proxy.ca_file)
        assert code == 0, f"{attack} ({how}): {output}"
        assert locked_hashes(workdir) == expected["lock file"], attack
        assert installed_files(workdir, "1.0.0") == ["terraform-provider-foo_v1.0.0"], attack
        assert (workdir / ".terraform/modules/net/main.tf").read_text() == MODULE_FILES["main.tf"], attack
        assert await get(proxy, ARCHIVE) == (200, release.zips["linux_amd64"]), attack
        assert await lock_hashes(proxy, "1.0.0") == expected["lock endpoint"], attack
        assert (await get(proxy, UNKNOWN))[0] == 404, attack
        assert (await get(proxy, "/"))[0] == 200, attack  # the page reads the served times back
        assert proxy.events("inventory.unavailable") == [], f"{attack}: the page could not list the store"
        assert registry.count(versions_path) > fetched, f"{attack}: the refused version list was not fetched again"
        refused = {event["key"] for event in proxy.events("security.metadata_poisoned")}
        assert refused <= tampered, f"{attack}: refused values nobody tampered with: {refused - tampered}"
        missed = must_refuse - {namespace_of(name) for name in refused}
        assert not missed, f"{attack} ({how}): nothing refused in the namespaces {missed}"
        down = proxy.events("redis.down") + proxy.events("metadata_store.down")
        assert down == [], f"{attack}: a forged value took the store down: {down}"
        await proxy.stop()
    return found
