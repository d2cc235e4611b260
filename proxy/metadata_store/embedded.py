"""The embedded metadata store: one SQLite file in the data directory.

Built on aiohttp-client-cache's SQLite key-value class (aiosqlite underneath), so it
survives restarts: after one warm `init`, the same `init` works with the upstream down
even after the proxy restarted. Entries do not expire here; the freshness policy decides
what is served, and stale entries are kept for stale-if-error.

The file is a cache, so a broken one is never an outage (the breaker of `proxy.metadata_store.breaker`): any
SQLite error makes a read a miss and a write skipped, logged once per state change, and for
`retry_interval` seconds the file is left alone. A file SQLite calls corrupt ("file is not
a database", "database disk image is malformed") is moved aside to
`metadata.sqlite.corrupt-<UTC time>` and a fresh one started; the first use (at start-up)
runs `PRAGMA quick_check` so damage found while stopped is handled before any request.
The database is ready for several processes (the workers of `serve --workers N`): WAL mode
(with `synchronous=NORMAL`: a commit is not fsynced, so a power cut may lose the last writes but never
damages the file; a lost record is a miss, refetched or re-adopted from the archive store),
a busy timeout, autocommit (no transaction spans two coroutines' statements), no statement left
open (it would pin a read snapshot), and a statement SQLite refuses at once as busy is tried
again for up to the busy timeout before the store counts as down.

Every statement's cursor is closed on the connection's own thread (aiosqlite's: `async with`, or `_rows`,
which reads it to the end and frees it there), never left to be freed on the event loop's: freeing a sqlite3
cursor resets its statement, which the connection's statement cache shares with the next cursor of the same
SQL, so one freed on the loop's thread reset the statement another task's write was running on aiosqlite's,
and SQLite refused that write (`InterfaceError: bad parameter or other API misuse`, issue 33: the store went
down under concurrent fills and its writes were skipped). For the same reason the key-value class's own
`write` and `delete`, which leave their cursors open, are not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import aiosqlite
import structlog

from proxy.metadata_store.breaker import Breaker
from proxy.metadata_store.keys import FLEET_SECRET


def _import_sqlite_cache() -> type:
    """aiohttp-client-cache's SQLite class, without the package's other backends: its `backends` package
    imports every backend whose library is installed (redis-py for its Redis backend, a tenth of a process
    start), and this store needs none of them. Each is marked missing while the package loads (the package
    then stands in a placeholder class), and unmarked at once, so the libraries themselves stay importable."""
    others = [f"aiohttp_client_cache.backends.{name}" for name in ("redis", "mongodb", "dynamodb", "filesystem")]
    marked = [name for name in others if name not in sys.modules]
    for name in marked:
        sys.modules[name] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        from aiohttp_client_cache.backends.sqlite import SQLiteCache
    finally:
        for name in marked:
            del sys.modules[name]
    return SQLiteCache


SQLiteCache = _import_sqlite_cache()

log = structlog.get_logger(__name__)
T = TypeVar("T")

DATABASE_FILE = "metadata.sqlite"  # in the data dir's metadata directory
TABLE = "metadata"
SERVED_TABLE = "served"  # archive SHA-256 -> when it was last served (epoch seconds)
_SERVED_SCHEMA = f"CREATE TABLE IF NOT EXISTS `{SERVED_TABLE}` (sha256 TEXT PRIMARY KEY, at REAL NOT NULL)"
BUSY_TIMEOUT = 5.0
MANY_AT_ONCE = 500  # keys per statement of get_many (SQLite allows 32766 parameters; old builds 999)
BUSY_PAUSE = 0.01  # first pause before trying a statement SQLite refused as busy again (doubling)
FAILURES = (sqlite3.Error, ValueError, OSError)  # ValueError: aiosqlite's "no active connection"
_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB")  # and their extended codes


def is_busy(exc: BaseException) -> bool:
    """Another process holds a lock SQLite did not (or could not) wait for."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(exc).lower()


def is_corruption(exc: BaseException) -> bool:
    """SQLite says the file itself is damaged (not busy, full, read-only or missing)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc).lower()
    return name.startswith(_CORRUPT) or "malformed" in text or "not a database" in text


class EmbeddedStore:
    """MetadataStore on a local SQLite file, with a breaker and self-repair for a damaged file."""

    def __init__(self, path: Path, *, retry_interval: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._breaker = Breaker(retry_interval, clock)
        self._cache: SQLiteCache | None = None
        self._checked = False
        self._opening = asyncio.Lock()
        self._generation = 0

    @property
    def problem(self) -> str | None:
        """Why the store is not usable right now (None while it works)."""
        return self._breaker.problem

    @property
    def available(self) -> bool:
        return self._breaker.available

    async def get(self, key: str) -> bytes | None:
        value = await self._call(lambda cache: _select_value(cache, key), None)
        return _as_bytes(value) if value is not None else None

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Several values, `MANY_AT_ONCE` keys per statement (one thread hop each, not one per key)."""
        found: dict[str, bytes] = {}
        for start in range(0, len(keys), MANY_AT_ONCE):
            chunk = keys[start : start + MANY_AT_ONCE]
            found.update(await self._call(lambda cache, chunk=chunk: _select_values(cache, chunk), {}))
        return [_as_bytes(found[key]) if key in found else None for key in keys]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        statement = f"INSERT OR REPLACE INTO `{TABLE}` (key, value) VALUES (?, ?)"
        await self._call(lambda cache: _changed(cache, statement, (key, value)), None, retry_fresh=True)

    async def delete(self, key: str) -> None:
        statement = f"DELETE FROM `{TABLE}` WHERE key = ?"
        await self._call(lambda cache: _changed(cache, statement, (key,)), None, retry_fresh=True)

    async def keys(self, prefix: str = "") -> AsyncIterator[str]:
        """Every key starting with `prefix` (for export and the page at /); raises if the file cannot be read:
        a partial export must not look whole."""
        cache = await self._open()
        if not prefix:
            async for key in cache.keys():
                if key != FLEET_SECRET:  # the secret's marker is not metadata
                    yield key
            return
        # A range of the key index: only keys of this kind are read (all of them first, see `_select_value`).
        after = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        async with cache.get_connection() as db:
            found = await _rows(
                db, f"SELECT key FROM `{TABLE}` WHERE key >= ? AND key < ? ORDER BY key", (prefix, after)
            )
        for (key,) in found:
            if key != FLEET_SECRET:
                yield key

    def sealed_keys(self) -> AsyncIterator[str]:
        """Every key whose value the seal wrote, the marker aside (for `rotate-secret`)."""
        return self.keys()

    async def get_kept(self, key: str) -> bytes | None:
        """The value under `key` (nothing expires here)."""
        return await self.get(key)

    async def add(self, key: str, value: bytes) -> bool | None:
        """Write `value` under `key` unless a value is there (one statement): whether it was written, None when
        the file could not be used."""
        statement = f"INSERT OR IGNORE INTO `{TABLE}` (key, value) VALUES (?, ?)"
        return await self._call(lambda cache: _changed(cache, statement, (key, value)), None, retry_fresh=True)

    async def swap(self, key: str, old: bytes, new: bytes) -> bool | None:
        """Replace `old` by `new` under `key` only if `old` is still there: whether it was replaced, None when the
        file could not be used."""
        statement = f"UPDATE `{TABLE}` SET value = ? WHERE key = ? AND value = ?"
        return await self._call(lambda cache: _changed(cache, statement, (new, key, old)), None)

    async def note_served(self, times: Mapping[str, float]) -> None:
        """Upsert into the `served` table, keeping the later time."""
        if times:
            rows = list(times.items())
            await self._call(
                lambda cache: _served_write(
                    cache,
                    f"INSERT INTO `{SERVED_TABLE}` (sha256, at) VALUES (?, ?) "
                    "ON CONFLICT(sha256) DO UPDATE SET at = max(at, excluded.at)",
                    rows,
                ),
                None,
                retry_fresh=True,
            )

    async def served_times(self) -> dict[str, float]:
        """The whole `served` table (a row whose time is not a number, written by anyone but the proxy, reads
        as never served); raises if the file cannot be read."""
        cache = await self._open()
        async with cache.get_connection() as db:
            await _rows(db, _SERVED_SCHEMA)
            query = f"SELECT sha256, at FROM `{SERVED_TABLE}` WHERE typeof(at) IN ('integer', 'real')"
            return {str(sha): float(at) for sha, at in await _rows(db, query)}

    async def forget_served(self, sha256s: Iterable[str]) -> None:
        rows = [(sha,) for sha in sha256s]
        if rows:
            await self._call(
                lambda cache: _served_write(cache, f"DELETE FROM `{SERVED_TABLE}` WHERE sha256 = ?", rows),
                None,
                retry_fresh=True,
            )

    async def ping(self) -> bool:
        """True when the file answers a query now; False while the breaker is open."""
        if not self.available:
            return False
        found = await self._call(lambda cache: _select_value(cache, "__ping__"), False)
        return found is not False and self._breaker.up

    async def close(self) -> None:
        await self._drop()

    async def _call(
        self, operation: Callable[[SQLiteCache], Awaitable[T]], default: T, *, retry_fresh: bool = False
    ) -> T:
        """`operation` on the database; any SQLite failure answers `default` (see module docstring)."""
        if not self.available:
            return default
        generation = self._generation
        try:
            try:
                result = await self._patiently(operation)
            except FAILURES as exc:
                if not is_corruption(exc):
                    raise
                if generation == self._generation:  # not replaced meanwhile by another call that saw it
                    await self._quarantine(exc)
                if not retry_fresh:
                    return default  # a fresh file has nothing to read
                result = await self._patiently(operation)
        except FAILURES as exc:  # also a file that could not be moved aside
            self._mark_down(exc)
            return default
        self._mark_up()
        return result

    async def _patiently(self, operation: Callable[[SQLiteCache], Awaitable[T]]) -> T:
        """`operation`, tried again while another process holds the lock SQLite would not wait for
        (it answers "database is locked" at once where waiting could deadlock), for up to BUSY_TIMEOUT."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + BUSY_TIMEOUT
        pause = BUSY_PAUSE
        while True:
            try:
                return await operation(await self._open())
            except sqlite3.OperationalError as exc:
                if not is_busy(exc) or loop.time() + pause > give_up:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.25)

    async def _open(self) -> SQLiteCache:
        """The open database; on first use, its integrity is checked and a damaged file replaced."""
        async with self._opening:
            if self._cache is None or not self._checked:
                try:
                    await self._check()
                except BaseException:
                    await self._drop()  # a connection that failed to open cannot be opened again
                    raise
                self._checked = True
            return self._cache

    async def _check(self) -> None:
        """Open with WAL mode and run `quick_check`; a damaged file is moved aside for a fresh one."""
        try:
            async with self._connect() as db:
                problems = await _quick_check(db)
            if problems:
                raise sqlite3.DatabaseError(f"database disk image is malformed: {'; '.join(problems[:3])}")
        except FAILURES as exc:
            if not is_corruption(exc):
                raise
            await self._move_aside(exc)
            async with self._connect():
                pass

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator:
        if self._cache is None:
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
            # autocommit: each statement its own transaction, so no coroutine's write waits inside (or holds
            # the lock across awaits for) a transaction that another coroutine on this connection opened
            connection = aiosqlite.connect(str(self.path), timeout=BUSY_TIMEOUT, isolation_level=None)
            self._cache = SQLiteCache(str(self.path), TABLE, connection=connection)
        # Its first use makes the table and leaves that cursor to the loop's thread: harmless, as nothing else runs on
        # this new connection yet (`_opening` is held).
        async with self._cache.get_connection() as db:
            await _rows(db, "PRAGMA journal_mode=WAL")
            await _rows(db, "PRAGMA synchronous=NORMAL")  # WAL: no fsync per commit, never corrupt (a cache)
            yield db

    async def _drop(self) -> None:
        if self._cache is not None:
            with contextlib.suppress(*FAILURES):
                await self._cache.close()
            self._cache = None

    async def _quarantine(self, exc: BaseException) -> None:
        """Replace a file found damaged while running (once, whoever sees the error first)."""
        async with self._opening:
            self._generation += 1
            self._checked = False  # the next use opens and checks a fresh file
            await self._move_aside(exc)

    async def _move_aside(self, exc: BaseException) -> None:
        await self._drop()
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        await asyncio.to_thread(_rename_database, self.path, target)
        log.error(
            "metadata_store.quarantined",
            path=str(self.path),
            moved_to=str(target),
            error=str(exc),
            effect="a fresh metadata file is used; metadata is fetched again, archives on disk are kept",
        )

    def _mark_down(self, exc: BaseException) -> None:
        if self._breaker.trip(f"{type(exc).__name__}: {exc}"):
            log.warning(
                "metadata_store.down",
                path=str(self.path),
                error=self._breaker.problem,
                effect="metadata is fetched upstream and not cached; archives on disk are served; "
                "retrying in the background",
            )

    def _mark_up(self) -> None:
        if self._breaker.reset():
            log.warning("metadata_store.up", path=str(self.path), effect="metadata is cached again")


async def integrity_problems(path: Path) -> list[str]:
    """What SQLite's `quick_check` finds wrong in the file at `path` (none: it is whole), opened read-only: nothing
    is moved aside or written (`doctor`). Raises sqlite3.Error when it cannot be read (`is_corruption`: a file
    that is no database)."""
    uri = f"{(await asyncio.to_thread(path.resolve)).as_uri()}?mode=ro"
    async with aiosqlite.connect(uri, uri=True, timeout=BUSY_TIMEOUT) as db:
        return await _quick_check(db)


async def _quick_check(db: aiosqlite.Connection) -> list[str]:
    async with db.execute("PRAGMA quick_check") as cursor:
        problems = [row[0] for row in await cursor.fetchall()]
    return [] if problems == ["ok"] else problems


def _as_bytes(value: object) -> bytes:
    """A stored value as bytes, whatever SQLite type it was written as (the proxy writes blobs; text or a
    number written by anyone else reads as bytes that no seal opens)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


async def _select_value(cache: SQLiteCache, key: str) -> bytes | None:
    """The value stored under `key`, its statement read to the end at once: a statement left open would hold a
    read snapshot, and a later write on this connection would fail (SQLITE_BUSY_SNAPSHOT) as soon
    as another process had written since."""
    async with cache.get_connection() as db:
        rows = await _rows(db, f"SELECT value FROM `{TABLE}` WHERE key=?", (key,))
    return rows[0][0] if rows else None


async def _select_values(cache: SQLiteCache, keys: list[str]) -> dict[str, bytes]:
    """The values stored under `keys` (those present), in one statement closed at once (see `_select_value`)."""
    if not keys:
        return {}
    marks = ", ".join("?" * len(keys))
    async with cache.get_connection() as db:
        return {
            key: value
            for key, value in await _rows(db, f"SELECT key, value FROM `{TABLE}` WHERE key IN ({marks})", keys)
        }


async def _changed(cache: SQLiteCache, statement: str, parameters: tuple) -> bool:
    """Whether `statement` changed a row (its cursor closed at once, see `_select_value`)."""
    async with cache.get_connection() as db, db.execute(statement, parameters) as cursor:
        return cursor.rowcount > 0


async def _served_write(cache: SQLiteCache, statement: str, rows: list[tuple]) -> None:
    """One statement over many rows of the `served` table, made first if this file lacks it."""
    async with cache.get_connection() as db:
        await _rows(db, _SERVED_SCHEMA)
        async with db.executemany(statement, rows):
            pass  # closed on the connection's thread (see the module docstring)


async def _rows(db: aiosqlite.Connection, statement: str, parameters: Iterable = ()) -> list:
    """Every row of `statement`, in one hop to the connection's thread: its cursor is made, read to the end and
    freed there (see the module docstring)."""
    return list(await db.execute_fetchall(statement, parameters))


def _rename_database(path: Path, target: Path) -> None:
    """Move the database and its WAL aside together (the shared-memory index is rebuilt by SQLite)."""
    for suffix in ("", "-wal", "-journal"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            source.rename(Path(f"{target}{suffix}"))
    Path(f"{path}-shm").unlink(missing_ok=True)
