"""What signing a client in with an OIDC token costs a request, next to a static token, in one run.

Every request carrying a token is authenticated (the clients send the token with every metadata request);
a static token costs a SHA-256 and constant-time comparisons, an OIDC token its parsing, the claim checks,
a signature verification (joserfc over `cryptography`) and the rules, the first time it is shown; after
that the proxy remembers it for a minute (`proxy.identity.oidc.OidcAuthenticator`). This times both, with the keys
held (a key fetch happens at most once a minute per issuer), against the fake issuer over HTTPS:

```
.venv/bin/python bench/oidc_signin.py [--rounds 2000] [--tokens 20]
```

It prints microseconds per sign-in for a static token (among `--tokens` static tokens) and for RS256, ES256
and EdDSA tokens (first shown: every round a new token; remembered: the same token again), and the ratio
to the static one.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import tempfile
import time
from pathlib import Path

import trustme

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: tests.fakes

from proxy.identity.issuers import parse_issuers  # noqa: E402
from proxy.identity.oidc import IssuerKeys, OidcAuthenticator  # noqa: E402
from proxy.identity.tokens import hash_token, parse_tokens  # noqa: E402
from proxy.settings.config import Limits  # noqa: E402
from proxy.upstream.client import UpstreamClient, create_ssl_context  # noqa: E402
from proxy.upstream.netguard import AddressPolicy  # noqa: E402
from tests.fakes.oidc import FakeIssuer  # noqa: E402
from tests.integration.test_oidc import issuers_toml  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=20)
    args = parser.parse_args()

    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    issuer = FakeIssuer(server)
    await issuer.start()
    ca_file = Path(tempfile.mkdtemp()) / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = UpstreamClient.create(AddressPolicy(frozenset({issuer.allow})), Limits(), create_ssl_context(ca_file))
    book = parse_issuers(issuers_toml(issuer))
    authenticator = OidcAuthenticator(IssuerKeys(upstream, None))  # the keys are fetched at the first token
    statics = [f"rpt_static_{n:04d}" for n in range(args.tokens)]
    tokens = parse_tokens(
        "".join(f'[tokens.t{n}]\nhash = "{hash_token(t)}"\nhosts = ["*"]\n' for n, t in enumerate(statics))
    )

    async def static() -> None:
        assert tokens.authenticate(statics[-1]) is not None

    results = {"static": await timed(static, args.rounds)}
    for alg in ("RS256", "ES256", "EdDSA"):
        fresh = iter([issuer.mint(alg, jti=str(n)) for n in range(args.rounds + 50)])

        async def first(fresh=fresh) -> None:
            assert (await authenticator.authenticate(next(fresh), book)).scopes

        token = issuer.mint(alg)

        async def again(token: str = token) -> None:
            assert (await authenticator.authenticate(token, book)).scopes

        results[f"{alg} first shown"] = await timed(first, args.rounds)
        results[f"{alg} remembered"] = await timed(again, args.rounds)
    await upstream.close()
    await issuer.close()
    base = results["static"]
    for name, seconds in results.items():
        print(f"{name:18} {seconds * 1e6:8.1f} µs per sign-in  ({seconds / base:5.1f} times a static token's)")


async def timed(call, rounds: int) -> float:
    for _ in range(50):
        await call()
    started = time.perf_counter()
    for _ in range(rounds):
        await call()
    return (time.perf_counter() - started) / rounds


if __name__ == "__main__":
    asyncio.run(main())
