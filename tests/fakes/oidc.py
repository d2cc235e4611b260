"""A fake OIDC issuer over HTTPS (the test CA): discovery document and key set (JWKS), and real tokens.

Like the issuers of GitHub Actions, GitLab and Kubernetes it publishes its keys at the `jwks_uri` its
`/.well-known/openid-configuration` names, and signs tokens (RS256, ES256 and EdDSA here, with real keys,
through joserfc) whose claims look like GitHub Actions' ones. It records every request, can be stopped
(down: its port held bound but not listening, so connections are refused and no other test's server can take
it meanwhile) and started again on the same port, can rotate a key (the new key published, the old one withdrawn),
and makes the tokens an attacker would try: `alg: none`, HS256 keyed with the public key, a tampered payload.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import ssl
import time
import warnings
from collections.abc import Callable
from typing import Any

from aiohttp import web
from joserfc import jwt
from joserfc.errors import SecurityWarning
from joserfc.jwk import ECKey, KeySet, OKPKey, RSAKey

AUDIENCE = "https://registry-proxy.test"
SUBJECT = "repo:acme/infra:ref:refs/heads/main"
KEY_TYPES = {"RS256": ("RSA", 2048), "ES256": ("EC", "P-256"), "EdDSA": ("OKP", "Ed25519")}


def _new_key(alg: str, kid: str) -> Any:
    kind, size = KEY_TYPES[alg]
    factory = {"RSA": RSAKey, "EC": ECKey, "OKP": OKPKey}[kind]
    return factory.generate_key(size, parameters={"kid": kid, "alg": alg, "use": "sig"})


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def segment(value: dict) -> str:
    return b64(json.dumps(value, separators=(",", ":")).encode())


class FakeIssuer:
    """An OIDC issuer on 127.0.0.1; `url` is its issuer URL (`iss`), e.g. `https://127.0.0.1:PORT`."""

    def __init__(self, ssl_context: ssl.SSLContext, host: str = "127.0.0.1") -> None:
        self._ssl = ssl_context
        self.host = host
        self.port = 0
        self.requests: list[str] = []
        self.generation = {alg: 1 for alg in KEY_TYPES}
        self.keys = {alg: _new_key(alg, self._kid(alg)) for alg in KEY_TYPES}
        self.discovery_overrides: dict[str, Any] = {}
        self.status: int | None = None  # every answer this status, when set
        self.clock: Callable[[], float] = time.time  # the time its tokens are minted at
        self._runner: web.AppRunner | None = None
        self._held_port: socket.socket | None = None  # while down

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    @property
    def allow(self) -> str:
        """What `--allow-private-host` must name for the proxy to reach it."""
        return f"{self.host}:{self.port}"

    def _kid(self, alg: str) -> str:
        return f"{alg.lower()}-{self.generation[alg]}"

    def kid(self, alg: str = "RS256") -> str:
        return self.keys[alg].kid

    def jwks(self) -> dict:
        return KeySet(list(self.keys.values())).as_dict(private=False)

    def rotate(self, alg: str = "RS256") -> str:
        """A new key for `alg`, published instead of the old one (which is withdrawn); its kid."""
        self.generation[alg] += 1
        self.keys[alg] = _new_key(alg, self._kid(alg))
        return self.keys[alg].kid

    def count(self, path: str) -> int:
        return self.requests.count(path)

    def claims(self, **overrides: Any) -> dict:
        """GitHub Actions-like claims for this issuer and the proxy's audience, valid for five minutes."""
        now = int(self.clock())
        claims = {
            "iss": self.url,
            "aud": AUDIENCE,
            "sub": SUBJECT,
            "iat": now,
            "nbf": now,
            "exp": now + 300,
            "repository": "acme/infra",
            "repository_owner": "acme",
            "ref": "refs/heads/main",
            "workflow": "deploy",
        }
        claims.update(overrides)
        return {name: value for name, value in claims.items() if value is not None}

    def mint(self, alg: str = "RS256", *, key: Any = None, kid: str | None = None, **claims: Any) -> str:
        """A token signed by the issuer's current `alg` key (or `key`), naming `kid` (default: the key's)."""
        signer = key if key is not None else self.keys[alg]
        header = {"alg": alg, "kid": kid if kid is not None else signer.kid, "typ": "JWT"}
        with warnings.catch_warnings():  # RFC 9864 renamed EdDSA; the issuers still sign with that name
            warnings.simplefilter("ignore", SecurityWarning)
            return jwt.encode(header, self.claims(**claims), signer, algorithms=[alg])

    def unsigned(self, **claims: Any) -> str:
        """`alg: none`: no signature at all."""
        return f"{segment({'alg': 'none', 'typ': 'JWT'})}.{segment(self.claims(**claims))}."

    def hmac_with_public_key(self, **claims: Any) -> str:
        """HS256 keyed with the issuer's published RSA key (the algorithm-confusion attack)."""
        signing_input = f"{segment({'alg': 'HS256', 'kid': self.kid(), 'typ': 'JWT'})}.{segment(self.claims(**claims))}"
        secret = self.keys["RS256"].as_pem(private=False)
        return f"{signing_input}.{b64(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"

    def tampered(self, **changes: Any) -> str:
        """A real token whose payload was changed afterwards (its signature kept)."""
        header, _, signature = self.mint().split(".")
        return f"{header}.{segment(self.claims(**changes))}.{signature}"

    async def start(self) -> None:
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/.well-known/openid-configuration", self._discovery)
        app.router.add_get("/keys", self._jwks)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        if self._held_port is not None:
            self._held_port.close()
            self._held_port = None
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self._ssl, reuse_address=True)
        await site.start()
        if not self.port:
            self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Down: nothing listens on its port any more (`start` brings it back on the same port)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._held_port = socket.socket()
            self._held_port.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._held_port.bind((self.host, self.port))  # refused, and not free for another server

    async def close(self) -> None:
        """Stopped for good: its port released."""
        await self.stop()
        if self._held_port is not None:
            self._held_port.close()
            self._held_port = None

    @web.middleware
    async def _record(self, request: web.Request, handler):
        self.requests.append(request.path)
        if self.status is not None:
            return web.json_response({"error": "fault"}, status=self.status)
        return await handler(request)

    async def _discovery(self, request: web.Request) -> web.Response:
        document = {
            "issuer": self.url,
            "jwks_uri": f"{self.url}/keys",
            "subject_types_supported": ["public"],
            "response_types_supported": ["id_token"],
            "id_token_signing_alg_values_supported": list(KEY_TYPES),
            "claims_supported": ["sub", "aud", "exp", "iat", "iss", "repository_owner"],
            **self.discovery_overrides,
        }
        return web.json_response(document)

    async def _jwks(self, request: web.Request) -> web.Response:
        return web.json_response(self.jwks())
