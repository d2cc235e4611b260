"""`--unsigned-providers`: which registries may hand out providers without signing keys.

OpenTofu's rule (internal/getproviders/package_authentication.go, `shouldEnforceGPGValidation`):
a registry that returns at least one signing key must always have a valid signature; a registry
that returns none is exempt only when it is the default registry, `registry.opentofu.org`
(unless `OPENTOFU_ENFORCE_GPG_VALIDATION=true`). The proxy mirrors it: `opentofu-default` (the
default) exempts that host alone, `allow-hosts=H,…` exactly the hosts named, `refuse` none. An
exempt archive is still checked against the release's SHA256SUMS (fetched over verified TLS) and
the registry's `shasum`. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.domain.addresses import AddressError, Hostname

OPENTOFU_DEFAULT_REGISTRY = "registry.opentofu.org"
_ALLOW_HOSTS = "allow-hosts="


class UnsignedPolicyError(ValueError):
    """An `--unsigned-providers` value that does not parse."""


@dataclass(frozen=True)
class UnsignedPolicy:
    """The registry hosts whose providers may come without signing keys (none: `refuse`)."""

    hosts: frozenset[str] = frozenset({OPENTOFU_DEFAULT_REGISTRY})
    mode: str = "opentofu-default"

    def allows(self, hostname: Hostname | str) -> bool:
        """Whether a provider of `hostname` whose registry lists no signing keys may be stored and served."""
        return str(hostname) in self.hosts

    def __str__(self) -> str:
        if self.mode == "allow-hosts":
            return _ALLOW_HOSTS + ",".join(sorted(self.hosts))
        return self.mode


def parse_unsigned_policy(text: str) -> UnsignedPolicy:
    """`refuse`, `opentofu-default` or `allow-hosts=H1,H2` (hostnames as the clients normalise them)."""
    value = str(text).strip()
    if value == "refuse":
        return UnsignedPolicy(frozenset(), "refuse")
    if value == "opentofu-default":
        return UnsignedPolicy()
    if value.startswith(_ALLOW_HOSTS):
        names = [name.strip() for name in value[len(_ALLOW_HOSTS) :].split(",") if name.strip()]
        if not names:
            raise UnsignedPolicyError("allow-hosts= needs at least one host")
        try:
            hosts = frozenset(str(Hostname.parse(name)) for name in names)
        except AddressError as exc:
            raise UnsignedPolicyError(str(exc)) from None
        return UnsignedPolicy(hosts, "allow-hosts")
    raise UnsignedPolicyError("use refuse, opentofu-default or allow-hosts=HOST,…")
