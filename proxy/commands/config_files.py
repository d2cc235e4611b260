"""The files `serve`'s options name, read as `serve` reads them before it starts: the upstream credentials
(`--upstream-credentials` and TF_TOKEN_* variables), the client tokens (`--auth-tokens`), the OIDC issuers
(`--oidc-issuers`) and the policy (`--policy`). Each reader raises ConfigError with one line naming the option,
the file and what in it is wrong; `serve` stops on the first (`check_*`), `doctor` reports each (`read_*`).

The parsers are imported when a file is read: a start without these files does not pay for them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.domain.credentials import CredentialsError, UpstreamCredentials, from_environment, merged, parse_cli_config
from proxy.settings.config import ConfigError, Settings, build

if TYPE_CHECKING:
    from proxy.governance.policy import Policy
    from proxy.identity.issuers import IssuerBook
    from proxy.identity.tokens import TokenBook


def settings_of(args: argparse.Namespace) -> Settings:
    """The Settings of parsed `serve` options and the credentials (ConfigError), the other files unread."""
    return build(Settings, vars(args), upstream_credentials=upstream_credentials(args))


def upstream_credentials(args: argparse.Namespace) -> UpstreamCredentials:
    """The tokens of the `--upstream-credentials` file's blocks and of TF_TOKEN_* variables."""
    try:
        file_tokens = {}
        if args.upstream_credentials:
            file_tokens = parse_cli_config(
                args.upstream_credentials.read_text(encoding="utf-8"),
                f"--upstream-credentials {args.upstream_credentials}",
            )
        upstream = merged(file_tokens, from_environment(os.environ))
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"--upstream-credentials {args.upstream_credentials}: {exc.strerror or exc}") from None
    return UpstreamCredentials(upstream, args.upstream_map)


def read_policy(path: Path) -> Policy:
    """The `--policy` file, parsed; ConfigError naming the file, the rule and the key."""
    from proxy.governance.gatekeeper import load_policy
    from proxy.governance.policy import PolicyError

    try:
        return load_policy(path)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--policy {path}: {getattr(exc, 'strerror', None) or exc}") from None


def read_tokens(path: Path) -> TokenBook:
    """The `--auth-tokens` file, parsed; ConfigError naming the file and what in it is wrong, also when it holds
    no tokens (every client would get 401)."""
    from proxy.identity.tokens import parse_tokens

    book = _parsed("--auth-tokens", path, parse_tokens)
    if not book.tokens:
        raise ConfigError(
            f"--auth-tokens {path}: no tokens in it, so every client would be refused (401); add one "
            "(`registry-proxy token new NAME` prints its entry), or leave --auth-tokens unset"
        )
    return book


def read_issuers(path: Path) -> IssuerBook:
    """The `--oidc-issuers` file, parsed; ConfigError naming the file, the issuer and the key."""
    from proxy.identity.issuers import parse_issuers

    return _parsed("--oidc-issuers", path, parse_issuers)


def _parsed(flag: str, path: Path, parse):
    from proxy.identity.tokens import AuthConfigError

    try:
        return parse(path.read_text(encoding="utf-8"))
    except AuthConfigError as exc:
        raise ConfigError(f"{flag} {path}: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def check_policy_file(path: Path | None) -> None:
    """A broken `--policy` file stops start-up with one line naming the file, the rule and the key."""
    if path is not None:
        read_policy(path)


def check_tokens_file(settings: Settings) -> None:
    """A broken `--auth-tokens` or `--oidc-issuers` file stops start-up, in one line naming the file and what
    in it is wrong; so does a tokens file without tokens (every client would get 401)."""
    if settings.access.auth_tokens is not None:
        read_tokens(settings.access.auth_tokens)
    if settings.access.oidc_issuers is not None:
        read_issuers(settings.access.oidc_issuers)
