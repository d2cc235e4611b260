"""The REGISTRY_PROXY_* variables the CLI reads, for checking that deployment files name only real ones."""

from __future__ import annotations

from proxy.settings.command_line import environment_variables

# Variables of flags that other branches add (named in the manifests ahead of their merge). Remove an entry
# once its flag is in the CLI: from then on the drift check covers it like any other.
PENDING = {}


def cli_env_vars() -> set[str]:
    """Every REGISTRY_PROXY_* variable some subcommand reads."""
    return set(environment_variables())


def unknown(names: set[str]) -> set[str]:
    """The REGISTRY_PROXY_* names among `names` that neither the CLI nor a pending branch defines."""
    known = cli_env_vars() | set(PENDING)
    return {name for name in names if name.startswith("REGISTRY_PROXY_") and name not in known}
