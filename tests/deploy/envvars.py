"""The REGISTRY_PROXY_* variables the CLI reads, for checking that deployment files name only real ones."""

from __future__ import annotations

import argparse

from proxy.cli import build_parser
from proxy.config import env_name

# Variables of flags that other branches add (named in the manifests ahead of their merge). Remove an entry
# once its flag is in the CLI: from then on the drift check covers it like any other.
PENDING = {}


def cli_env_vars() -> set[str]:
    """Every REGISTRY_PROXY_* variable some subcommand reads (its help shows `[env: NAME]`)."""
    names: set[str] = set()
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                for option in sub._actions:
                    for flag in option.option_strings:
                        if flag.startswith("--") and f"[env: {env_name(flag)}" in (option.help or ""):
                            names.add(env_name(flag))
    return names


def unknown(names: set[str]) -> set[str]:
    """The REGISTRY_PROXY_* names among `names` that neither the CLI nor a pending branch defines."""
    known = cli_env_vars() | set(PENDING)
    return {name for name in names if name.startswith("REGISTRY_PROXY_") and name not in known}
