"""The metadata key scheme: one typed pattern per kind of key, which both builds and parses keys.

A stored key is `KIND:PART/PART/...` (e.g. `archive:HOST/NAMESPACE/TYPE/VERSION/PLATFORM`).
The kind ends at the first colon, so a part may hold one (a host with a port), never a slash.
Keys that only name a flight, a fleet lock or a remembered 404 wrap another key
(`doc:KEY`, `lock:KEY`, `negative:KEY`). The strings are the ones every store already holds,
so changing them would orphan existing data. `RedisNames` names them in Redis (with the hash tag
a Redis Cluster needs). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Protocol

from proxy.domain.addresses import Hostname, ModuleAddr, Platform, ProviderAddr, Version

SEPARATOR = "/"


class KeyPattern:
    """Keys of one kind: `KIND:` followed by its named parts joined by slashes."""

    def __init__(self, kind: str, *fields: str) -> None:
        self.kind = kind
        self.fields = fields
        self.prefix = f"{kind}:"

    def key(self, **parts: object) -> str:
        """The key of these parts (each given by name, as `str()` of it); ValueError for a part that
        is empty or holds a slash, so no key can be mistaken for another."""
        if len(parts) != len(self.fields) or not all(name in parts for name in self.fields):
            raise ValueError(f"a {self.kind} key has the parts {', '.join(self.fields)}, not {', '.join(parts)}")
        texts = [str(parts[name]) for name in self.fields]
        for name, text in zip(self.fields, texts, strict=True):
            if not text or SEPARATOR in text:
                raise ValueError(f"{name} {text!r} cannot be part of a {self.kind} key")
        return self.prefix + SEPARATOR.join(texts)

    def key_for(self, parts: Mapping[str, str]) -> str:
        """The key of this kind for the parts it needs out of a wider set (e.g. another key's parse)."""
        return self.key(**{name: parts[name] for name in self.fields})

    def parse(self, key: str) -> dict[str, str] | None:
        """The named parts of a key of this kind, or None for any other key."""
        if not key.startswith(self.prefix):
            return None
        texts = key[len(self.prefix) :].split(SEPARATOR)
        if len(texts) != len(self.fields) or not all(texts):
            return None
        return dict(zip(self.fields, texts, strict=True))

    def subject(self, key: str) -> str:
        """What the key names, without its kind (`HOST/NAMESPACE/TYPE/...`)."""
        return key.removeprefix(self.prefix)


class WrappedKey:
    """Keys that name something about another key: `KIND:KEY`."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.prefix = f"{kind}:"

    def key(self, inner: str) -> str:
        return self.prefix + inner

    def parse(self, key: str) -> str | None:
        """The wrapped key, or None for a key of another kind."""
        return key[len(self.prefix) :] if key.startswith(self.prefix) and len(key) > len(self.prefix) else None


# ---- stored metadata ---------------------------------------------------------------------------

DISCOVERY = KeyPattern("discovery", "host")
VERSIONS = KeyPattern("versions", "host", "namespace", "type")
DOWNLOAD = KeyPattern("download", "host", "namespace", "type", "version", "platform")
ARCHIVE = KeyPattern("archive", "host", "namespace", "type", "version", "platform")
SUMS = KeyPattern("sums", "digest")
MODULE_VERSIONS = KeyPattern("module-versions", "host", "namespace", "name", "system")
MODULE_DOWNLOAD = KeyPattern("module-download", "host", "namespace", "name", "system", "version")
MODULE = KeyPattern("module", "host", "namespace", "name", "system", "version")

# When each version was first seen by any replica (the policy's min-age), per provider or module.
FIRST_SEEN = KeyPattern("first-seen", "host", "namespace", "type")
MODULE_FIRST_SEEN = KeyPattern("module-first-seen", "host", "namespace", "name", "system")
# the versions an operator recorded as old on purpose (`registry-proxy policy baseline`)
BASELINE = KeyPattern("baseline", "host", "namespace", "type")
MODULE_BASELINE = KeyPattern("module-baseline", "host", "namespace", "name", "system")
# An OIDC issuer's signing keys (its JWKS), shared by the workers and replicas; not metadata of a registry, so
# not among STORED_KINDS (bundles carry none). `issuer`: the SHA-256 of the issuer's URL and JWKS URL.
OIDC_KEYS = KeyPattern("oidc-keys", "issuer")
# The fingerprints of the keys that signed a provider's releases (`proxy.governance.key_trust`): a record the
# signing-key checks depend on, so never expired (`kept`), never purged, not among STORED_KINDS.
SIGNING_KEYS = KeyPattern("signing-keys", "host", "namespace", "type")
# records a security decision depends on (the policy's ages, a provider's signing keys): never written with a
# TTL, so no store expires them (nor does Redis's volatile-* eviction)
KEPT = (FIRST_SEEN, MODULE_FIRST_SEEN, BASELINE, MODULE_BASELINE, SIGNING_KEYS)
_KEPT_PREFIXES = tuple(kind.prefix for kind in KEPT)


STORED_KINDS = (DISCOVERY, VERSIONS, DOWNLOAD, SUMS, ARCHIVE, MODULE_VERSIONS, MODULE_DOWNLOAD, MODULE)

# ---- keys that are not metadata ----------------------------------------------------------------

DOCUMENT_FLIGHT = WrappedKey("doc")  # the in-process single flight of a document's refresh
FLEET_LOCK = WrappedKey("lock")  # a Redis fleet lock
NEGATIVE = WrappedKey("negative")  # a remembered 404 in Redis
NEGATIVE_BOOKKEEPING = ("negatives", "negatives:sizes", "negatives:bytes")  # Redis: write order, sizes, total
SERVED = "served"  # Redis: sorted set of archive SHA-256s by the time they were last served
FLEET_SECRET = "fleet-secret"  # the fleet's secret marker, never expiring (proxy.metadata_store.fleet_secret)
PURGES = "purges"  # the last purge's mark: every process drops its in-memory copies when it changes


class RedisNames:
    """The names of the proxy's keys in Redis: `PREFIX:KEY`.

    In a Redis Cluster, keys used together by one command, script or transaction must live in one hash
    slot. Of the proxy's, only the remembered 404s (`negative:KEY`) and their bookkeeping (`negatives`,
    `negatives:sizes`, `negatives:bytes`) are: one script evicts, counts and writes them together. There
    they are named `{PREFIX}:KEY`: the hash tag `{PREFIX}` puts them all in one slot (the other keys are
    spread over the cluster, one slot each). One server and Sentinel keep the names every existing
    deployment holds. A value is sealed under its key (`negative:KEY`), never under its Redis name, so
    the names are Redis's business only.
    """

    def __init__(self, prefix: str, *, cluster: bool = False) -> None:
        if cluster and prefix.startswith("}"):
            raise ValueError(f"a Redis prefix starting with '}}' ({prefix!r}) would empty the hash tag {{PREFIX}}")
        self.prefix = prefix
        self.cluster = cluster
        self._slotted = f"{{{prefix}}}" if cluster else prefix

    def name(self, key: str) -> str:
        """The Redis name of `key`."""
        return f"{self._slotted if slotted(key) else self.prefix}:{key}"

    def key(self, name: str) -> str:
        """The key a Redis name stands for (the name itself if it is not one of this prefix's)."""
        for base in (self.prefix, self._slotted):
            if name.startswith(f"{base}:") and self.name(name[len(base) + 1 :]) == name:
                return name[len(base) + 1 :]
        return name


def slotted(key: str) -> bool:
    """Whether `key` is one of those a Redis Cluster must keep in one slot (see `RedisNames`)."""
    return key in NEGATIVE_BOOKKEEPING or key.startswith(NEGATIVE.prefix)


def kind_of(key: str) -> KeyPattern | None:
    """The stored kind a key claims by its prefix (None: not a kind of metadata this proxy writes)."""
    return next((pattern for pattern in STORED_KINDS if key.startswith(pattern.prefix)), None)


# ---- typed builders ----------------------------------------------------------------------------


def discovery(hostname: Hostname | str) -> str:
    return DISCOVERY.key(host=hostname)


def versions(addr: ProviderAddr) -> str:
    return VERSIONS.key(host=addr.hostname, namespace=addr.namespace, type=addr.type)


def download(addr: ProviderAddr, version: Version, platform: Platform) -> str:
    return DOWNLOAD.key(
        host=addr.hostname, namespace=addr.namespace, type=addr.type, version=version, platform=platform
    )


def archive(addr: ProviderAddr, version: Version, platform: Platform) -> str:
    return ARCHIVE.key(host=addr.hostname, namespace=addr.namespace, type=addr.type, version=version, platform=platform)


def module_versions(addr: ModuleAddr) -> str:
    return MODULE_VERSIONS.key(host=addr.hostname, namespace=addr.namespace, name=addr.name, system=addr.system)


def first_seen(addr: ProviderAddr | ModuleAddr) -> str:
    if isinstance(addr, ModuleAddr):
        return MODULE_FIRST_SEEN.key(host=addr.hostname, namespace=addr.namespace, name=addr.name, system=addr.system)
    return FIRST_SEEN.key(host=addr.hostname, namespace=addr.namespace, type=addr.type)


def baseline(addr: ProviderAddr | ModuleAddr) -> str:
    if isinstance(addr, ModuleAddr):
        return MODULE_BASELINE.key(host=addr.hostname, namespace=addr.namespace, name=addr.name, system=addr.system)
    return BASELINE.key(host=addr.hostname, namespace=addr.namespace, type=addr.type)


def kept(key: str) -> bool:
    """Whether `key` holds a record a security decision depends on (`KEPT`): stored without a TTL."""
    return key.startswith(_KEPT_PREFIXES)


def signing_keys(addr: ProviderAddr) -> str:
    return SIGNING_KEYS.key(host=addr.hostname, namespace=addr.namespace, type=addr.type)


def module_download(addr: ModuleAddr, version: Version) -> str:
    return MODULE_DOWNLOAD.key(
        host=addr.hostname, namespace=addr.namespace, name=addr.name, system=addr.system, version=version
    )


def module(addr: ModuleAddr, version: Version) -> str:
    return MODULE.key(host=addr.hostname, namespace=addr.namespace, name=addr.name, system=addr.system, version=version)


class SignedSumsSource(Protocol):
    """What identifies a release's signed SHA256SUMS: its URLs and the keys that may sign it."""

    @property
    def shasums_url(self) -> object: ...

    @property
    def shasums_signature_url(self) -> object: ...

    @property
    def signing_keys(self) -> Iterable[str]: ...


def sums_source(download: SignedSumsSource) -> tuple[str, ...]:
    """The SHA256SUMS URL, its signature's URL and the signing keys: downloads sharing it share one file."""
    return (str(download.shasums_url), str(download.shasums_signature_url), *sorted(download.signing_keys))


def sums(download: SignedSumsSource, scope: str = "") -> str:
    """The key of the verified SHA256SUMS record of a download. A private registry host's records are
    scoped by its `scope` (the host), so a public document naming the same URLs never finds them."""
    source = sums_source(download) if not scope else (f"private:{scope}", *sums_source(download))
    return SUMS.key(digest=hashlib.sha256("\n".join(source).encode()).hexdigest())
