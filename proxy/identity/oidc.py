"""OIDC workload tokens: the issuers' signing keys, and signing a client in with a token.

`IssuerKeys` fetches an issuer's discovery document (`/.well-known/openid-configuration`) and key set (JWKS)
through the SSRF-guarded upstream client, lazily (the first token of an issuer), and keeps them in memory
and in the shared metadata store (sealed), so every worker and replica uses the keys one of them fetched:

- a token naming a key (`kid`) not held makes the keys be fetched again, at most once per
  `--oidc-keys-refresh` (`REFRESH_INTERVAL`, a minute) per issuer in a process, and not at all while the
  keys in the store were fetched within it (by any process): a stream of made-up kids costs the issuer nothing;
- keys older than `KEYS_MAX_AGE` are fetched again in the background while they go on serving, so a key
  the issuer withdrew stops being accepted; a rotated key is picked up at its first token;
- an issuer that cannot be reached leaves the keys held working; a token naming a key not held while it is
  down is refused at once with a 503 (`OidcIssuerUnavailableError`), never waits on it again within the
  interval;
- one fetch, its discovery document and its key set together, ends within `fetch_deadline` (`FETCH_DEADLINE`,
  8 s, at most `--request-deadline`), and a request waits for it no longer than its own budget
  (`proxy.runtime.deadline`): a hanging issuer gets the token its 503 before Terraform gives up (10 s).

The discovery document must name the issuer itself, and its `jwks_uri` must be https on the issuer's host
(another host only when the issuers file names it as `jwks_url`). A private or loopback issuer is fetched
only when the operator allows its host with `--allow-private-host`, like any upstream.

`OidcAuthenticator` routes a token to its issuer by its stated `iss`, refuses what fails before any key is
looked up (algorithm, audience, expiry as stated), then verifies it (`proxy.identity.jose`) and judges its claims by
the issuer's rules (`proxy.identity.issuers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog
from yarl import URL

from proxy.domain.lru import Lru
from proxy.errors import OidcIssuerUnavailableError, UpstreamError
from proxy.identity.issuers import Issuer, IssuerBook
from proxy.identity.jose import JwtError, SigningKeys, check_claims, peek
from proxy.identity.tokens import OidcClient
from proxy.metadata_store import MetadataStore
from proxy.metadata_store.keys import OIDC_KEYS
from proxy.runtime import deadline
from proxy.runtime.background import BackgroundTasks
from proxy.runtime.metrics import Metrics
from proxy.upstream.client import UpstreamClient

log = structlog.get_logger("proxy.identity.oidc")

REFRESH_INTERVAL = 60.0  # seconds: at most one fetch of an issuer's keys per this long, per process
KEYS_MAX_AGE = 15 * 60.0  # seconds: older keys are fetched again (in the background) when used
STORE_CHECK_INTERVAL = 1.0  # seconds: how often a process looks in the store for keys another one fetched
FETCH_DEADLINE = 8.0  # seconds: a fetch's discovery document and key set together (Terraform waits 10 s at most)
MAX_DOCUMENT_BYTES = 1 << 20  # a discovery document or JWKS larger than this is refused
REMEMBER_FOR = 60.0  # seconds: a token that signed a client in is not checked again for this long
REMEMBERED_TOKENS = 4096  # tokens remembered at most (the least recently used go first)
RECORD_VERSION = 1


class TokenRefusedError(Exception):
    """An OIDC token refused (401): `issuer` is the issuer's name ("-": none matched), `reason` a short name."""

    def __init__(self, issuer: str, error: JwtError) -> None:
        super().__init__(error.message)
        self.issuer = issuer
        self.reason = error.reason
        self.message = error.message
        self.subject = error.subject


@dataclass(frozen=True)
class HeldKeys:
    """An issuer's keys as fetched: by whichever process, when, and from where."""

    keys: SigningKeys
    fetched_at: float
    jwks_url: str


class IssuerKeys:
    """The signing keys of the configured issuers: in memory, in the shared store, fetched when needed."""

    def __init__(
        self,
        upstream: UpstreamClient,
        store: MetadataStore | None,
        metrics: Metrics | None = None,
        *,
        clock: Callable[[], float] = time.time,
        refresh_interval: float = REFRESH_INTERVAL,
        max_age: float = KEYS_MAX_AGE,
        fetch_deadline: float = FETCH_DEADLINE,
    ) -> None:
        self._upstream = upstream
        self._store = store
        self._metrics = metrics
        self.clock = clock  # injectable: the tests move it past the refresh interval
        self._interval = refresh_interval
        self._max_age = max_age
        self._fetch_deadline = fetch_deadline
        self._held: dict[str, HeldKeys] = {}
        self._tried: dict[str, float] = {}  # when this process last fetched (or tried to)
        self._failed: dict[str, str] = {}  # why the last fetch failed, while it did
        self._looked: dict[str, float] = {}  # when this process last looked in the store
        self._fetches: dict[str, asyncio.Task[HeldKeys]] = {}
        self._background = BackgroundTasks("oidc.refresh_failed")

    async def keys_for(self, issuer: Issuer, key_id: str | None) -> SigningKeys:
        """Keys to verify a token of `issuer` naming `key_id` with: those held if they have it, else those fetched
        now if allowed (which may still lack it: the token is then refused for its unknown key). Raises
        OidcIssuerUnavailableError when the key is not held and the issuer's keys cannot be had now."""
        name = _record_key(issuer)
        now = self.clock()
        held = self._held.get(name)
        if held is None or not held.keys.has(key_id):
            held = await self._look_in_store(name, issuer, held, now)
        if held is not None and held.keys.has(key_id):
            if now - held.fetched_at >= self._max_age and self._may_fetch(name, held, now):
                self._refresh_in_background(issuer)
            return held.keys
        if self._may_fetch(name, held, now):
            try:
                async with asyncio.timeout(deadline.remaining()):  # the request's budget (None: no bound)
                    return (await self._fetch(issuer)).keys
            except _FetchFailedError as exc:
                raise _unavailable(issuer, key_id, exc.message, self._interval) from None
            except TimeoutError:  # the fetch goes on, bounded by its own deadline
                why = deadline.timed_out(f"the keys of issuer {issuer.name}").message
                raise _unavailable(issuer, key_id, why, self._interval) from None
        if held is None or name in self._failed:
            why = self._failed.get(name, "no keys fetched yet")
            raise _unavailable(
                issuer, key_id, f"{why}; the keys are fetched again {self._next_try(name, now)}", self._interval
            )
        return held.keys

    def held(self, issuer: Issuer) -> SigningKeys | None:
        """The keys of `issuer` this process holds now."""
        held = self._held.get(_record_key(issuer))
        return held.keys if held is not None else None

    async def settled(self) -> None:
        """Wait for the fetches under way (a background refresh, say) to end."""
        await asyncio.gather(*self._fetches.values(), *self._background, return_exceptions=True)

    async def close(self) -> None:
        """Cancel the fetches under way and wait for them."""
        tasks = [*self._fetches.values(), *self._background]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _may_fetch(self, name: str, held: HeldKeys | None, now: float) -> bool:
        """Not within the interval of this process's last attempt, nor of the fetch of the keys held (by any
        process: a replica that fetched them a moment ago answered the same question)."""
        tried = self._tried.get(name)
        if tried is not None and 0 <= now - tried < self._interval:
            return False
        return held is None or not 0 <= now - held.fetched_at < self._interval

    def _next_try(self, name: str, now: float) -> str:
        tried = self._tried.get(name)
        return "now" if tried is None else f"in {max(0.0, tried + self._interval - now):.0f}s at the earliest"

    async def _look_in_store(self, name: str, issuer: Issuer, held: HeldKeys | None, now: float) -> HeldKeys | None:
        """Keys another process fetched later than those held (looked for at most once per STORE_CHECK_INTERVAL
        once some are held)."""
        if self._store is None:
            return held
        looked = self._looked.get(name)
        if held is not None and looked is not None and 0 <= now - looked < STORE_CHECK_INTERVAL:
            return held
        self._looked[name] = now
        shared = _decode(await self._store.get(name), issuer)
        if shared is not None and (held is None or shared.fetched_at > held.fetched_at):
            self._held[name] = shared
            self._failed.pop(name, None)
            log.info("oidc.keys_shared", issuer=issuer.name, key_ids=sorted(shared.keys.key_ids), pid=os.getpid())
            return shared
        return held

    def _refresh_in_background(self, issuer: Issuer) -> None:
        async def refresh() -> None:
            with contextlib.suppress(_FetchFailedError):  # logged by the fetch; the keys held stay
                await self._fetch(issuer)

        self._background.start(refresh())

    async def _fetch(self, issuer: Issuer) -> HeldKeys:
        """One fetch per issuer at a time in this process, detached from the request that asked (shielded)."""
        name = _record_key(issuer)
        task = self._fetches.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._download(name, issuer))
            self._fetches[name] = task
            task.add_done_callback(lambda done: self._fetch_ended(name, done))
        return await asyncio.shield(task)

    def _fetch_ended(self, name: str, task: asyncio.Task[HeldKeys]) -> None:
        """Forget the fetch; its failure is retrieved here too (logged by it), for when no request waits any more."""
        self._fetches.pop(name, None)
        if not task.cancelled():
            task.exception()

    async def _download(self, name: str, issuer: Issuer) -> HeldKeys:
        self._tried[name] = self.clock()
        jwks_url = issuer.jwks_url
        try:
            try:
                async with asyncio.timeout(self._fetch_deadline):  # one deadline for both documents
                    if jwks_url is None:
                        jwks_url = await self._discover(issuer)
                    keys = SigningKeys.from_jwks(await self._get(issuer, jwks_url, "JWKS"))
            except TimeoutError:
                raise _FetchFailedError(
                    f"issuer {issuer.name} did not answer within {self._fetch_deadline:g}s (its discovery document "
                    "and key set together)"
                ) from None
        except _FetchFailedError as exc:
            self._failed[name] = exc.message
            self._count(issuer, "failed")
            log.warning(
                "oidc.keys_fetch_failed",
                issuer=issuer.name,
                error=exc.message,
                effect="the keys held (if any) stay in use; tokens naming other keys are refused (503)",
            )
            raise
        except JwtError as exc:
            self._failed[name] = exc.message
            self._count(issuer, "failed")
            log.warning("oidc.keys_fetch_failed", issuer=issuer.name, url=jwks_url, error=exc.message)
            raise _FetchFailedError(exc.message) from None
        held = HeldKeys(keys, self.clock(), jwks_url)
        self._held[name] = held
        self._failed.pop(name, None)
        self._count(issuer, "ok")
        log.info("oidc.keys_fetched", issuer=issuer.name, url=jwks_url, key_ids=sorted(keys.key_ids), pid=os.getpid())
        if self._store is not None:
            await self._store.set(name, _encode(held, issuer))
        return held

    async def _discover(self, issuer: Issuer) -> str:
        """The issuer's `jwks_uri`, from its discovery document, checked."""
        try:
            document = json.loads(await self._get(issuer, issuer.discovery_url, "discovery document"))
        except ValueError:
            raise _FetchFailedError(f"the discovery document of {issuer.url} is not JSON") from None
        if not isinstance(document, dict) or document.get("issuer") != issuer.url:
            named = document.get("issuer") if isinstance(document, dict) else None
            raise _FetchFailedError(
                f"the discovery document at {issuer.discovery_url} names the issuer {str(named)[:200]!r}, "
                f"not {issuer.url}"
            )
        jwks_uri = document.get("jwks_uri")
        if not isinstance(jwks_uri, str) or urlsplit(jwks_uri).scheme != "https":
            raise _FetchFailedError(f"the discovery document of {issuer.url} has no https `jwks_uri`")
        if _origin(jwks_uri) != _origin(issuer.url):
            raise _FetchFailedError(
                f"the discovery document of {issuer.url} puts its keys on another host ({jwks_uri[:200]}); "
                "name that URL as `jwks_url` in the issuers file to trust it"
            )
        return jwks_uri

    async def _get(self, issuer: Issuer, url: str, what: str) -> bytes:
        try:
            response = await self._upstream.get(URL(url, encoded=False), max_bytes=MAX_DOCUMENT_BYTES)
        except UpstreamError as exc:
            raise _FetchFailedError(f"fetching the {what} of issuer {issuer.name} failed: {exc.message}") from None
        if response.status != 200:
            raise _FetchFailedError(f"the {what} of issuer {issuer.name} ({url}) answered {response.status}")
        return response.body

    def _count(self, issuer: Issuer, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.oidc_key_fetches.labels(issuer.name, outcome).inc()


class _FetchFailedError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _unavailable(issuer: Issuer, key_id: str | None, why: str, retry_after: float) -> OidcIssuerUnavailableError:
    key = f"key {key_id[:100]!r}" if key_id else "keys"
    log.warning("oidc.keys_unavailable", issuer=issuer.name, key_id=key_id, error=why)
    return OidcIssuerUnavailableError(
        f"cannot check this token now: the signing {key} of issuer {issuer.name} are not held and could not be "
        f"fetched ({why}); retry later",
        headers={"Retry-After": str(max(1, round(retry_after)))},
    )


def _origin(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return (parts.hostname or "").lower(), parts.port or 443


def _record_key(issuer: Issuer) -> str:
    """The store key of an issuer's keys: its URL and where its keys come from (a new `jwks_url` starts afresh)."""
    source = f"{issuer.url}\n{issuer.jwks_url or ''}"
    return OIDC_KEYS.key(issuer=hashlib.sha256(source.encode()).hexdigest()[:32])


def _encode(held: HeldKeys, issuer: Issuer) -> bytes:
    record = {
        "v": RECORD_VERSION,
        "issuer": issuer.url,
        "jwks_url": held.jwks_url,
        "fetched_at": held.fetched_at,
        "jwks": held.keys.document,
    }
    return json.dumps(record, sort_keys=True).encode()


def _decode(raw: bytes | None, issuer: Issuer) -> HeldKeys | None:
    """Keys stored by a process (sealed, so written by one of the fleet), for this issuer; None otherwise."""
    if raw is None:
        return None
    try:
        record = json.loads(raw)
        if record.get("v") != RECORD_VERSION or record.get("issuer") != issuer.url:
            return None
        keys = SigningKeys.from_jwks(json.dumps(record["jwks"]).encode())
        return HeldKeys(keys, float(record["fetched_at"]), str(record["jwks_url"]))
    except (ValueError, TypeError, KeyError, AttributeError, JwtError):
        return None


@dataclass(frozen=True)
class _SignedIn:
    """A token that signed a client in: the client, until when it is remembered, and what judged it."""

    client: OidcClient
    until: float
    book: IssuerBook
    issuer: Issuer
    keys: SigningKeys


class OidcAuthenticator:
    """Signs a client in with an OIDC token of one of the configured issuers.

    A client sends its token with every metadata request; checking one costs about 0.4 ms (parsing, claims,
    signature: bench/oidc_signin.py), so a token that signed a client in is remembered (by its SHA-256) for
    `REMEMBER_FOR` at most, never past its `exp` and its issuer's leeway, and only while the issuers in
    force and the issuer's keys held are those that judged it (a reload, or keys fetched again, check it
    afresh). Refused tokens are not remembered."""

    def __init__(self, keys: IssuerKeys, metrics: Metrics | None = None) -> None:
        self.keys = keys  # and its clock, which tells the tokens' times too
        self._metrics = metrics
        self._signed_in: Lru[bytes, _SignedIn] = Lru(REMEMBERED_TOKENS)  # a use: a sign-in (not a refusal)

    async def authenticate(self, token: str, book: IssuerBook) -> OidcClient:
        """The client `token` signs in (its claims judged by its issuer's rules in `book`). Raises
        TokenRefusedError (401: why, for the log and the client) or OidcIssuerUnavailableError (503)."""
        digest = hashlib.sha256(token.encode()).digest()
        remembered = self._signed_in.get(digest)
        if remembered is not None:
            if (
                remembered.book is book
                and self.keys.clock() < remembered.until
                and self.keys.held(remembered.issuer) is remembered.keys
            ):
                self._signed_in.touch(digest)
                self._count_accepted(remembered.client)
                return remembered.client
            self._signed_in.pop(digest)
        signed_in = await self._check(token, book)
        self._count_accepted(signed_in.client)
        self._signed_in.put(digest, signed_in)
        return signed_in.client

    async def _check(self, token: str, book: IssuerBook) -> _SignedIn:
        try:
            stated = peek(token)
        except JwtError as exc:
            raise self._refused("-", exc) from None
        issuer = book.by_url(stated.issuer) if stated.issuer is not None else None
        if issuer is None:
            shown = "no issuer (`iss`)" if stated.issuer is None else f"the issuer {stated.issuer[:200]!r}"
            raise self._refused(
                "-", JwtError("unknown_issuer", f"the token names {shown}, which this proxy does not trust")
            )
        now = self.keys.clock()
        rules = {"issuer": issuer.url, "audiences": issuer.audiences, "leeway": issuer.leeway}
        try:
            if stated.algorithm not in issuer.algorithms:  # before any key is looked up (`none`, HS256, ...)
                raise JwtError(
                    "algorithm_refused",
                    f"the token is signed with {stated.algorithm or 'no algorithm'!r}; issuer {issuer.name}'s tokens "
                    f"are accepted with {', '.join(issuer.algorithms)} only",
                )
            check_claims(stated.claims, now=now, **rules)  # as stated: refused anyway, so no key is fetched for it
            keys = await self.keys.keys_for(issuer, stated.key_id)
            claims = keys.verify(token, algorithms=issuer.algorithms, now=now, **rules)
        except JwtError as exc:
            raise self._refused(issuer.name, exc) from None
        except OidcIssuerUnavailableError:
            self._count(issuer.name, "issuer_unavailable")
            raise
        client = issuer.client(claims["sub"], claims, int(claims["exp"]))
        until = min(claims["exp"] + issuer.leeway, now + REMEMBER_FOR)
        return _SignedIn(client, until, book, issuer, keys)

    def _count_accepted(self, client: OidcClient) -> None:
        issuer = client.identity.issuer or "-"
        self._count(issuer, "accepted" if client.scopes else "no_rule")
        if self._metrics is not None:
            for rule in client.identity.rules:
                self._metrics.oidc_rules.labels(issuer, rule).inc()

    def _refused(self, issuer: str, error: JwtError) -> TokenRefusedError:
        self._count(issuer, error.reason)
        return TokenRefusedError(issuer, error)

    def _count(self, issuer: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.oidc_tokens.labels(issuer, outcome).inc()
