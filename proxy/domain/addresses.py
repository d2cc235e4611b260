"""Value types for registry hostnames, provider addresses, versions and platforms.

Every string that arrives from a client or an upstream is parsed here once, into a
normalised value, before anything else sees it. The rules follow the clients
(svchost `ForComparison`, terraform-registry-address `ParseProviderPart`;
docs/protocol.md#host-names-and-addresses). Pure code: a bad value raises `AddressError`,
which the web layer answers with 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache, total_ordering

import idna

MAX_HOSTNAME_LENGTH = 253
MAX_PART_LENGTH = 64
MAX_VERSION_LENGTH = 128

_PORT_RE = re.compile(r"^[0-9]{1,5}\Z")
_ASCII_PART_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\Z")
_SEMVER_RE = re.compile(
    r"^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?\Z"
)
_PLATFORM_PART_RE = re.compile(r"^[a-z0-9]{1,32}\Z")


class AddressError(ValueError):
    """A hostname, provider or module address, version or platform is malformed."""


@dataclass(frozen=True, slots=True)
class Hostname:
    """A registry hostname in the clients' comparison form: IDNA ASCII, lower case, port kept unless 443."""

    ascii: str
    port: int | None = None

    @classmethod
    def parse(cls, given: str) -> Hostname:
        """Normalise a hostname (Unicode or punycode, optional `:port`) or raise AddressError."""
        return _parse_hostname(given)

    @classmethod
    def _parse(cls, given: str) -> Hostname:
        if not given or len(given) > MAX_HOSTNAME_LENGTH + 6:
            raise AddressError(f"invalid hostname {given[:80]!r}: empty or too long")
        name, port = given, None
        if ":" in given:
            name, _, port_text = given.rpartition(":")
            if not _PORT_RE.match(port_text) or not 0 < int(port_text) < 65536:
                raise AddressError(f"invalid hostname {given!r}: bad port")
            port = int(port_text)
            if port == 443:
                port = None
        if name.endswith("."):
            raise AddressError(f"invalid hostname {given!r}: trailing dot")
        try:
            # Decode punycode labels first so that `xn--` and Unicode spellings normalise alike.
            unicode_name = idna.decode(name, uts46=True) if "xn--" in name.lower() else name
            ascii_name = idna.encode(unicode_name, uts46=True, transitional=False).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError) as exc:
            raise AddressError(f"invalid hostname {given!r}: {exc}") from None
        ascii_name = ascii_name.lower()
        if len(ascii_name) > MAX_HOSTNAME_LENGTH or not ascii_name:
            raise AddressError(f"invalid hostname {given!r}: too long")
        return cls(ascii_name, port)

    def __str__(self) -> str:
        return self.ascii if self.port is None else f"{self.ascii}:{self.port}"

    @property
    def display(self) -> str:
        """The Unicode form the clients use in lock files."""
        name = idna.decode(self.ascii)
        return name if self.port is None else f"{name}:{self.port}"


def parse_provider_part(given: str, what: str) -> str:
    """Validate a namespace or type: letters, digits and dashes, no leading/trailing dash."""
    if not given:
        raise AddressError(f"invalid provider {what}: empty")
    if len(given) > MAX_PART_LENGTH:
        raise AddressError(f"invalid provider {what} {given[:40]!r}...: longer than {MAX_PART_LENGTH}")
    part = given.lower()
    if part.isascii():
        if not _ASCII_PART_RE.match(part) or "--" in part:
            raise AddressError(
                f"invalid provider {what} {given!r}: only letters, digits and single dashes are allowed,"
                " and it may not start or end with a dash"
            )
        return part
    if not all(ch.isalnum() or ch == "-" for ch in part) or part[0] == "-" or part[-1] == "-" or "--" in part:
        raise AddressError(f"invalid provider {what} {given!r}: only letters, digits and dashes are allowed")
    return part


@lru_cache(maxsize=4096)
def _parse_hostname(given: str) -> Hostname:
    # IDNA processing costs tens of microseconds; hot paths parse the same few hosts.
    return Hostname._parse(given)


@dataclass(frozen=True, slots=True)
class ProviderAddr:
    """`hostname/namespace/type`, normalised."""

    hostname: Hostname
    namespace: str
    type: str

    @classmethod
    def parse(cls, hostname: str, namespace: str, type_: str) -> ProviderAddr:
        return cls(
            Hostname.parse(hostname), parse_provider_part(namespace, "namespace"), parse_provider_part(type_, "type")
        )

    def __str__(self) -> str:
        return f"{self.hostname}/{self.namespace}/{self.type}"


@total_ordering
@dataclass(frozen=True, slots=True)
class Version:
    """A semantic version as the registries list them; `str()` is the canonical form."""

    major: int
    minor: int
    patch: int
    prerelease: str = ""
    build: str = ""

    @classmethod
    def parse(cls, given: str) -> Version:
        if len(given) > MAX_VERSION_LENGTH:
            raise AddressError(f"invalid version {given[:40]!r}...: too long")
        match = _SEMVER_RE.match(given)
        if not match:
            raise AddressError(f"invalid version {given!r}: not a semantic version")
        major, minor, patch, pre, build = match.groups()
        return cls(int(major), int(minor), int(patch), pre or "", build or "")

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += f"-{self.prerelease}"
        if self.build:
            text += f"+{self.build}"
        return text

    def precedence(self) -> tuple:
        """A sort key in semver precedence: a release sorts after its pre-releases; numeric identifiers
        numerically (`sorted(versions, key=Version.precedence)` is much faster than comparing pairs)."""
        pre: tuple = ()
        if self.prerelease:
            pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.prerelease.split("."))
        return (self.major, self.minor, self.patch, not self.prerelease, pre)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        return self.precedence() < other.precedence()


@dataclass(frozen=True, slots=True)
class Platform:
    """A target platform `os_arch`, e.g. `linux_amd64`."""

    os: str
    arch: str

    @classmethod
    def parse(cls, given: str) -> Platform:
        os_, sep, arch = given.partition("_")
        if not sep or not _PLATFORM_PART_RE.match(os_) or not _PLATFORM_PART_RE.match(arch):
            raise AddressError(f"invalid platform {given[:40]!r}: expected OS_ARCH, e.g. linux_amd64")
        return cls(os_, arch)

    @classmethod
    def of(cls, os_: str, arch: str) -> Platform:
        return cls.parse(f"{os_}_{arch}")

    def __str__(self) -> str:
        return f"{self.os}_{self.arch}"


_MODULE_PART_RE = re.compile(r"^[0-9A-Za-z](?:[0-9A-Za-z_-]{0,62}[0-9A-Za-z])?\Z")
_MODULE_SYSTEM_RE = re.compile(r"^[0-9a-z]{1,64}\Z")


@dataclass(frozen=True, slots=True)
class ModuleAddr:
    """`hostname/namespace/name/system` of a registry module."""

    hostname: Hostname
    namespace: str
    name: str
    system: str

    @classmethod
    def parse(cls, hostname: str, namespace: str, name: str, system: str) -> ModuleAddr:
        for what, value, pattern in (
            ("namespace", namespace, _MODULE_PART_RE),
            ("name", name, _MODULE_PART_RE),
            ("target system", system, _MODULE_SYSTEM_RE),
        ):
            if not pattern.match(value):
                raise AddressError(f"invalid module {what} {value[:70]!r}")
        return cls(Hostname.parse(hostname), namespace, name, system)

    def __str__(self) -> str:
        return f"{self.hostname}/{self.namespace}/{self.name}/{self.system}"
