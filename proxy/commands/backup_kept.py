"""The records Redis keeps that no upstream gives back, in a backup (`proxy.commands.backup`): `keys.KEPT`, the
cooldown's first-seen times and baselines and the providers' signing keys, written without a TTL.

`read_kept` takes every key of those kinds through the store's own API (SCAN by kind, as `policy baseline` lists
addresses), each value as Redis holds it: sealed with the metadata secret, copied sealed (the backup holds nothing
Redis did not), with the fleet's marker, so that a restore can tell before it writes anything whether the secret
in force opens them. They go into the backup as `metadata/kept.jsonl`, one JSON object a line (`key`, and
`sealed`: the stored bytes in base64), listed in the manifest like every file. `write_kept` puts them back
without a TTL (as their writers do) and only where Redis has none (SET NX: a record a replica wrote since is
newer and kept), or over it with `force`; never the marker (the store's own is checked, or written anew with the
secret in force, by `require_fleet`). Either opens the store as `serve` does and checks the fleet's marker first.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.commands import CommandError
from proxy.commands.backup_files import SealCount, count_records
from proxy.metadata_store.keys import FLEET_SECRET, KEPT, kept
from proxy.metadata_store.sealed import Seal
from proxy.settings.config import Settings
from proxy.settings.values import shown_redis_url

if TYPE_CHECKING:
    from proxy.metadata_store.redis import RedisStore


@dataclass(frozen=True)
class KeptRecords:
    """The fleet's marker as stored (None: there was none) and every kept record, key to its sealed value."""

    marker: bytes | None
    records: dict[str, bytes]

    def dump(self) -> bytes:
        lines = [(FLEET_SECRET, self.marker)] if self.marker is not None else []
        lines += sorted(self.records.items())
        return b"".join(
            json.dumps({"key": key, "sealed": base64.b64encode(value).decode("ascii")}).encode() + b"\n"
            for key, value in lines
        )

    @classmethod
    def parse(cls, data: bytes, where: str) -> KeptRecords:
        """The records of a `kept.jsonl` (CommandError for a line that is not one, or a key of no kept kind:
        a restore writes no other key into Redis)."""
        marker, records = None, {}
        for number, line in enumerate(data.splitlines(), 1):
            try:
                entry = json.loads(line)
                key, value = str(entry["key"]), base64.b64decode(entry["sealed"], validate=True)
            except (ValueError, KeyError, TypeError, binascii.Error) as exc:
                raise CommandError(f"{where}, line {number}: not a kept record ({exc!r})") from None
            if key == FLEET_SECRET:
                marker = value
            elif kept(key):
                records[key] = value
            else:
                raise CommandError(f"{where}, line {number}: {key!r} is no record Redis keeps: nothing restored")
        return cls(marker, records)

    def count(self, seal: Seal) -> SealCount:
        marker = [(FLEET_SECRET, self.marker)] if self.marker is not None else []
        return count_records([*marker, *self.records.items()], seal)

    def kinds(self) -> str:
        """How many of each kind, e.g. `2 first-seen, 1 baseline, 1 signing-keys`."""
        counts = Counter(key.partition(":")[0] for key in self.records)
        return ", ".join(f"{counts[kind.kind]} {kind.kind}" for kind in KEPT if counts[kind.kind]) or "none yet"


@dataclass(frozen=True)
class KeptRestore:
    """What a restore did in Redis: records written, records Redis held already (kept), and the records of the
    backup's keys as Redis holds them now, opened with the secret in force."""

    written: int
    present: int
    records: SealCount


def where(settings: Settings) -> str:
    """The fleet's Redis as it may be shown: its URL without a password, and the prefix."""
    metadata = settings.metadata
    return f"{shown_redis_url(metadata.redis_url or '')} (prefix {metadata.redis_prefix})"


async def read_kept(settings: Settings) -> tuple[KeptRecords, SealCount]:
    """Every kept record of the fleet's Redis as stored, and how many open with the metadata secret."""
    from proxy.metadata_store.redis import FAILURES

    async with _fleet_store(settings) as (redis, seal):
        try:
            names = [key for kind in KEPT async for key in redis.keys(kind.prefix) if kept(key)]
        except FAILURES as exc:
            raise CommandError(f"Redis at {where(settings)} could not be read ({exc}): nothing backed up") from None
        values = await redis.read_many(names, lambda pipeline, name: pipeline.get(name))
        marker = await redis.get_kept(FLEET_SECRET)
        _answered(redis, settings, "nothing backed up")
    found = KeptRecords(marker, {key: value for key, value in zip(names, values, strict=True) if value is not None})
    return found, found.count(seal)


async def write_kept(settings: Settings, found: KeptRecords, *, force: bool) -> KeptRestore:
    """Write `found`'s records into the fleet's Redis, never to expire: only where it holds none, or (`force`)
    over what it holds; then open what it holds under those keys with the secret in force."""
    async with _fleet_store(settings) as (redis, seal):
        written = 0
        for key, value in found.records.items():
            if force:
                await redis.set(key, value)  # a kept key: no TTL, whatever is asked
                written += 1
            else:
                written += bool(await redis.add(key, value))
        _answered(redis, settings, f"{written} records were written before it failed: run the restore again")
        names = list(found.records)
        values = await redis.read_many(names, lambda pipeline, name: pipeline.get(name))
        marker = await redis.get_kept(FLEET_SECRET)
        _answered(redis, settings, "the records were written")
    now = KeptRecords(marker, {key: value for key, value in zip(names, values, strict=True) if value is not None})
    return KeptRestore(written, len(found.records) - written, now.count(seal))


@asynccontextmanager
async def _fleet_store(settings: Settings) -> AsyncIterator[tuple[RedisStore, Seal]]:
    """The fleet's Redis as `serve` opens it, answering, its marker opening with the metadata secret (ConfigError,
    exit 2, when it does not: nothing read or written); and the seal of that secret."""
    from proxy.metadata_store.factory import open_metadata  # (not for an embedded store's backup)

    store, _, redis = await open_metadata(settings)
    try:
        if not await store.ping():
            raise CommandError(f"Redis at {where(settings)} does not answer ({store.problem}): nothing done")
        await store.require_fleet()
        yield redis, store.seal  # (with --redis-url, the store under the seal is Redis)
    finally:
        await store.close()


def _answered(redis: RedisStore, settings: Settings, effect: str) -> None:
    """CommandError when a command failed meanwhile (the store answers a failure like a miss)."""
    if redis.problem is not None:
        raise CommandError(f"Redis at {where(settings)} failed ({redis.problem}): {effect}")
