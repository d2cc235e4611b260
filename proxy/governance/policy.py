"""The policy: which providers, modules, versions and platforms may enter. Pure: parse and decide, no I/O.

The policy file (`--policy`, TOML) holds ordered rules, the first that matches decides, then a default:

    mode = "enforce"            # or "warn": decide and record, deny nothing

    [[rule]]
    name = "aws-known-bad"
    providers = ["registry.terraform.io/hashicorp/aws"]   # HOST/NAMESPACE/TYPE globs
    modules = ["*/acme/*/*"]                              # HOST/NAMESPACE/NAME/SYSTEM globs
    versions = "= 5.31.0"       # Terraform version-constraint syntax: the rule is about these versions only
    clients = ["ci-*"]          # token names (globs; "anonymous": no token): the rule is about these only
    scopes = ["registry.terraform.io/acme*"]   # or clients whose scope (HOST/NAMESPACE) matches a glob
    action = "deny"             # or "allow"
    reason = "breaks IAM policies"

    [[rule]]
    name = "cooldown"
    providers = ["*/*/*"]
    min-age = "72h"             # versions younger than this are held back (with the time they are not)
    unknown-age = "hold"        # or "allow": a version whose age the proxy cannot establish (default: hold)

    [[rule]]
    name = "platforms"
    providers = ["*/*/*"]
    platforms = ["linux_amd64", "darwin_arm64"]   # archives of other platforms are refused

    [default]
    action = "allow"

A rule with `min-age` or `platforms` is a condition: it matches (and denies) only what fails it, and
anything else goes on to the next rule; a rule without them matches whatever its selectors
(`providers`/`modules`, `versions`, `clients`, `scopes`) select, with its `action`. So an `allow` rule
above the cooldown exempts what it selects from it. A client's scope is written `HOST/NAMESPACE` per host
glob and namespace glob of its token entry (or of the OIDC rules its claims matched), `HOST/*` when it
names no namespaces; `scopes` globs match those texts. A version constraint selects pre-releases by order
too (`< 2.0.0` selects `2.0.0-beta1`), unlike the clients' rule for picking a version.
Errors name the file, the rule and the key, on one line (`PolicyError`).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from proxy.domain import constraints
from proxy.domain.addresses import Version
from proxy.governance.globs import NAME, address_globs, compile_globs, one_line
from proxy.governance.key_trust import DEFAULT_TRUST, KEYS, KeyTrust, KeyTrustError, parse_key_trust
from proxy.settings.values import ConfigError, format_duration, parse_duration

MODES = ("enforce", "warn")
ACTIONS = ("allow", "deny")
ANONYMOUS = "anonymous"  # the client name of a request without a token, for `clients` globs
PROVIDER = "provider"
MODULE = "module"
_ALIASES = {
    "min_age": "min-age",
    "unknown_age": "unknown-age",
    "provider": "providers",
    "module": "modules",
    "version": "versions",
}
_RULE_KEYS = frozenset(
    {
        "name",
        "providers",
        "modules",
        "versions",
        "clients",
        "scopes",
        "action",
        "reason",
        "min-age",
        "unknown-age",
        "platforms",
    }
)
UNKNOWN_AGE = ("hold", "allow")  # what a min-age rule does with a version whose age is unknown
_PLATFORM = re.compile(r"^[a-z0-9]+_[a-z0-9]+\Z")
DEFAULT_RULE = "default"
FIRST_LISTING = 0.0  # the first-seen time of a version recorded as old on purpose (a baseline): long ago
FIRST_SEEN = "the time the proxy first saw it"
NEVER = float("inf")  # no lower bound on an unknown age: nothing says how long the version has been listed
UNKNOWN = "its age is unknown (no first-seen record, no publish time)"
Scopes = tuple[str, ...]  # a client's scope texts, `HOST/NAMESPACE` (`proxy.identity.tokens.Scope.texts`)


class PolicyError(ValueError):
    """The policy file is malformed: one line naming the file, the rule and the key."""


@dataclass(frozen=True, slots=True)
class Subject:
    """What is asked for: a provider (`HOST/NAMESPACE/TYPE`) or module (`HOST/NAMESPACE/NAME/SYSTEM`), and
    when known its version and platform."""

    kind: str
    address: str
    version: Version | None = None
    platform: str | None = None

    def __str__(self) -> str:
        text = self.address + (f" {self.version}" if self.version is not None else "")
        return text + (f" {self.platform}" if self.platform else "")


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome for one subject: `allowed` is what the policy says; `denied` whether it is refused (in
    warn mode nothing is). `until`: when a held-back version becomes available (epoch seconds)."""

    allowed: bool
    rule: str
    reason: str
    enforced: bool = True
    until: float | None = None

    @property
    def denied(self) -> bool:
        return not self.allowed and self.enforced

    @property
    def outcome(self) -> str:
        """`allow`, `deny`, or `would-deny` (warn mode): the audit trail's and the metrics' label."""
        if self.allowed:
            return "allow"
        return "deny" if self.enforced else "would-deny"


@dataclass(frozen=True, slots=True)
class ReleaseTime:
    """What a version's age is counted from: when any replica first saw it and the upstream's publish time when
    it gives one, with its source.

    The later of the two counts: min-age holds back what is new, and an upstream can make a version look
    older than it is (a wrong or forged date, a version added to a list long after its date) but no upstream
    makes the proxy see it sooner. A publish time in the future is not believed beyond the moment the proxy
    learned it (`believed`).

    `known` False: the proxy has no first-seen time for the version (it was listed when the proxy first saw
    the provider or module, or after its record was lost, flushed, evicted or forged); `first_seen` is then
    only since when the proxy has listed it (`NEVER`: not even that), a lower bound of its age. Its age is
    unknown unless a publish time gives it (which then decides alone). `basis`: what a `first_seen` of
    `FIRST_LISTING` means (a baseline)."""

    first_seen: float
    published: float | None = None
    source: str = ""
    known: bool = True
    basis: str = ""

    @property
    def age_known(self) -> bool:
        return self.known or self.published is not None

    @property
    def counted_from(self) -> float:
        """When the age counts from (for an unknown age: since when the version has been listed, at least)."""
        if self.published is None:
            return self.first_seen
        return max(self.first_seen, self.published) if self.known else self.published

    @property
    def decided_by(self) -> str:
        """Which source the age is counted from."""
        if self.published is not None and (not self.known or self.published >= self.first_seen):
            return self.source
        if not self.known:
            return UNKNOWN
        if self.first_seen == FIRST_LISTING:
            return self.basis or "a baseline (recorded as old on purpose; no publish date)"
        return FIRST_SEEN


def believed(published: float, learned_at: float) -> float:
    """A publish time as the proxy takes it: never later than when the proxy learned it."""
    return min(published, learned_at)


@dataclass(frozen=True)
class Filtered:
    """A version list as a client may see it: the allowed versions, those withheld with their decisions, and
    until when this holds (the first held-back version's release)."""

    allowed: frozenset[Version]
    withheld: tuple[tuple[Version, Decision], ...]
    valid_until: float

    def warnings(self, address: str) -> list[str]:
        """One line per withheld version, for the `warnings` of a registry `versions` answer."""
        return [
            f"registry-proxy policy: {address} {version} withheld by rule {d.rule}: {d.reason}"
            for version, d in self.withheld
        ]


# A line of `Filtered.warnings`, read back by the commands (`warm`, `lock`) to name why no version matched.
WITHHELD_WARNING = re.compile(
    r"^registry-proxy policy: (?P<address>\S+) (?P<version>\S+) withheld by rule (?P<rule>[A-Za-z0-9_.-]{1,64}): "
    r"(?P<reason>.*)\Z",
    re.DOTALL,
)


@dataclass(frozen=True)
class Rule:
    """One `[[rule]]`, its globs compiled."""

    name: str
    providers: re.Pattern[str] | None
    modules: re.Pattern[str] | None
    versions: tuple[constraints.Constraint, ...] | None
    versions_text: str
    clients: re.Pattern[str] | None
    action: str
    reason: str
    min_age: float | None
    platforms: frozenset[str] | None
    min_age_text: str = ""
    scopes: re.Pattern[str] | None = None  # globs of the clients' scope texts (`HOST/NAMESPACE`)
    unknown_age: str = "hold"  # a min-age rule's decision about a version whose age is unknown

    @property
    def conditional(self) -> bool:
        """Matches only what fails its min-age or platform list (else the next rule decides)."""
        return self.min_age is not None or self.platforms is not None

    def selects(self, subject: Subject, client: str, scopes: Scopes = ()) -> bool | None:
        """Whether the rule is about `subject` asked for by `client` with `scopes` (None: it depends on the
        version)."""
        pattern = self.providers if subject.kind == PROVIDER else self.modules
        if pattern is None or not pattern.match(subject.address):
            return False
        if self.clients is not None and not self.clients.match(client):
            return False
        if self.scopes is not None and not any(self.scopes.match(scope) for scope in scopes):
            return False
        if self.versions is not None:
            if subject.version is None:
                return None
            return all(c.allows(subject.version) for c in self.versions)
        return True


@dataclass(frozen=True)
class Policy:
    """The rules in order, the default, and the mode."""

    rules: tuple[Rule, ...] = ()
    default_action: str = "allow"
    default_reason: str = ""
    mode: str = "enforce"
    source: str = ""
    keys: KeyTrust = DEFAULT_TRUST  # signing-key continuity and pins (`proxy.governance.key_trust`)
    ages: bool = field(init=False)  # any rule with a min-age (else no publish times are needed)
    names_clients: bool = field(init=False)  # any rule limited to some clients (decisions depend on the client)
    names_scopes: bool = field(init=False)  # any rule limited to some scopes (decisions depend on the scopes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ages", any(rule.min_age is not None for rule in self.rules))
        object.__setattr__(self, "names_clients", any(rule.clients is not None for rule in self.rules))
        object.__setattr__(self, "names_scopes", any(rule.scopes is not None for rule in self.rules))

    def client_key(self, client: str, scopes: Scopes) -> tuple[str, Scopes]:
        """The part of a client its decisions depend on: equal keys get equal decisions (memo keys)."""
        return (client if self.names_clients else "", scopes if self.names_scopes else ())

    def decide(
        self,
        subject: Subject,
        client: str = ANONYMOUS,
        *,
        scopes: Scopes = (),
        published: float | None = None,
        now: float = 0,
        age_source: str = "",
        age_known: bool = True,
    ) -> Decision:
        """The decision for `subject` (with its version) asked for by `client` (with `scopes`); `published`: when
        the version was published (or first seen), for min-age rules (None: unknown, with no lower bound);
        `age_source`: where that time comes from (`ReleaseTime.decided_by`), named in the reason of a held-back
        version; `age_known` False: `published` is only since when the version has been listed (its age is
        unknown, at least that), decided by the rule's `unknown-age` until the min-age has passed since then."""
        for rule in self.rules:
            if not rule.selects(subject, client, scopes):
                continue
            if not rule.conditional:
                return self._decision(rule.action == "allow", rule.name, rule.reason or _default_reason(rule, subject))
            if rule.platforms is not None and subject.platform is not None and subject.platform not in rule.platforms:
                reason = rule.reason or f"platform {subject.platform} is not one of {', '.join(sorted(rule.platforms))}"
                return self._decision(False, rule.name, reason)
            if rule.min_age is not None and subject.version is not None:
                since = NEVER if published is None else published
                until = since + rule.min_age
                if now >= until:
                    continue  # old enough, whether its age is known or only bounded
                if published is None or not age_known:
                    if rule.unknown_age == "allow":
                        continue
                    reason = _unknown_reason(subject, rule, until)
                    return self._decision(False, rule.name, reason, None if until == NEVER else until)
                counted = f" (age counted from: {age_source})" if age_source else ""
                reason = f"{subject.version} is younger than {rule.min_age_text}{counted}"
                reason += f"; available from {utc_timestamp(until)}"
                return self._decision(False, rule.name, reason + (f" ({rule.reason})" if rule.reason else ""), until)
        return self._decision(self.default_action == "allow", DEFAULT_RULE, self.default_reason or "the default")

    def decide_address(self, subject: Subject, client: str = ANONYMOUS, scopes: Scopes = ()) -> Decision | None:
        """The decision for every version and platform of `subject`'s address at once, when the policy makes
        one (a rule about the whole address comes first); None when it depends on the version or platform."""
        for rule in self.rules:
            selects = rule.selects(replace(subject, version=None, platform=None), client, scopes)
            if selects is False:
                continue
            if selects is None or rule.conditional:
                return None
            return self._decision(rule.action == "allow", rule.name, rule.reason or _default_reason(rule, subject))
        return self._decision(self.default_action == "allow", DEFAULT_RULE, self.default_reason or "the default")

    def needs_age(self, subject: Subject, client: str = ANONYMOUS, scopes: Scopes = ()) -> bool:
        """Whether a min-age rule may decide about some version of `subject` (its publish times are needed)."""
        if not self.ages:
            return False
        address_only = replace(subject, version=None, platform=None)
        for rule in self.rules:
            selects = rule.selects(address_only, client, scopes)
            if selects is False:
                continue
            if rule.min_age is not None:
                return True
            if selects is True and not rule.conditional:
                return False  # decided before any min-age rule
        return False

    def _decision(self, allowed: bool, rule: str, reason: str, until: float | None = None) -> Decision:
        return Decision(allowed, rule, reason, self.mode == "enforce", until)


def _unknown_reason(subject: Subject, rule: Rule, until: float) -> str:
    """Why a version whose age is unknown is held back, and what ends it."""
    ends = (
        "" if until == NEVER else f"; available from {utc_timestamp(until)} (min-age {rule.min_age_text} since listed)"
    )
    reason = (
        f"{subject.version}: {UNKNOWN}; held by unknown-age = hold{ends};"
        f" run `registry-proxy policy baseline {subject.address}` to record the versions listed now as old, or wait"
    )
    return reason + (f" ({rule.reason})" if rule.reason else "")


def _default_reason(rule: Rule, subject: Subject) -> str:
    return f"{subject.kind} {subject} is {'allowed' if rule.action == 'allow' else 'denied'} by rule {rule.name}"


def utc_timestamp(epoch: float) -> str:
    """`epoch` as the policy's reasons and commands show a time: ISO 8601 UTC to the second."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- parsing ---------------------------------------------------------------------------------------


def parse_policy(text: str, source: str = "policy") -> Policy:
    """The policy file's text → Policy, or PolicyError naming `source`, the rule and the key."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: not valid TOML: {exc}") from None
    unknown = set(data) - {"mode", "rule", "default"} - KEYS
    if unknown:
        raise PolicyError(
            f"{source}: unknown top-level key {sorted(unknown)[0]!r} (known: mode, key-change, default-pins, "
            "[[rule]], [[pin]], [default])"
        )
    try:
        key_trust = parse_key_trust(data, source)
    except KeyTrustError as exc:
        raise PolicyError(str(exc)) from None
    mode = data.get("mode", "enforce")
    if mode not in MODES:
        raise PolicyError(f'{source}: key \'mode\': must be "enforce" or "warn", not {mode!r}')
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise PolicyError(f"{source}: key 'rule': write each rule as a [[rule]] table")
    rules, names = [], set()
    for index, table in enumerate(tables, 1):
        rule = _rule(source, index, table)
        if rule.name in names:
            raise PolicyError(f"{source}: rule {rule.name!r} (#{index}): key 'name': another rule has this name")
        names.add(rule.name)
        rules.append(rule)
    default = data.get("default", {})
    if not isinstance(default, dict):
        raise PolicyError(f"{source}: key 'default': must be a [default] table")
    extra = set(default) - {"action", "reason"}
    if extra:
        raise PolicyError(f"{source}: [default]: unknown key {sorted(extra)[0]!r} (known: action, reason)")
    action = default.get("action", "allow")
    if action not in ACTIONS:
        raise PolicyError(f'{source}: [default]: key \'action\': must be "allow" or "deny", not {action!r}')
    reason = default.get("reason", "")
    if not isinstance(reason, str):
        raise PolicyError(f"{source}: [default]: key 'reason': must be a string")
    return Policy(tuple(rules), action, one_line(reason), mode, source, key_trust)


def _rule(source: str, index: int, table: object) -> Rule:
    where = f"{source}: rule #{index}"
    if not isinstance(table, dict):
        raise PolicyError(f"{where}: must be a [[rule]] table")
    entries: dict[str, object] = {}
    for key, value in table.items():
        canonical = _ALIASES.get(key, key)
        if canonical in entries:
            raise PolicyError(f"{where}: key {key!r}: given twice (as {canonical!r} too)")
        entries[canonical] = value
    name = entries.get("name", f"rule-{index}")
    if not isinstance(name, str) or not NAME.match(name) or name == DEFAULT_RULE:
        raise PolicyError(f"{where}: key 'name': use 1-64 letters, digits, '_', '-', '.' (not 'default')")
    where = f"{source}: rule {name!r} (#{index})"
    unknown = set(entries) - _RULE_KEYS
    if unknown:
        raise PolicyError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: {', '.join(sorted(_RULE_KEYS))})")

    def fail(key: str, why: str) -> PolicyError:
        return PolicyError(f"{where}: key {key!r}: {why}")

    providers = _globs(entries.get("providers"), 3, "HOST/NAMESPACE/TYPE", lambda why: fail("providers", why))
    modules = _globs(entries.get("modules"), 4, "HOST/NAMESPACE/NAME/SYSTEM", lambda why: fail("modules", why))
    if providers is None and modules is None:
        raise PolicyError(f"{where}: needs 'providers' or 'modules' (globs of what the rule is about)")
    versions, versions_text = None, ""
    if "versions" in entries:
        versions_text = entries["versions"]
        if not isinstance(versions_text, str) or not versions_text.strip():
            raise fail("versions", 'must be a version constraint such as ">= 1.0, < 2.0"')
        try:
            versions = tuple(constraints.parse(versions_text))
        except constraints.ConstraintError as exc:
            raise fail("versions", str(exc)) from None
    clients = None
    if "clients" in entries:
        names = entries["clients"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n.strip() for n in names):
            raise fail("clients", "must be a list of token names or globs")
        clients = re.compile("|".join(fnmatch.translate(n.strip()) for n in names))
    scopes = _globs(entries.get("scopes"), 2, "HOST/NAMESPACE", lambda why: fail("scopes", why))
    min_age = None
    if "min-age" in entries:
        try:
            min_age = parse_duration(str(entries["min-age"]))
        except ConfigError as exc:
            raise fail("min-age", str(exc)) from None
        if min_age <= 0:
            raise fail("min-age", "must be longer than 0")
    unknown_age = entries.get("unknown-age", "hold")
    if "unknown-age" in entries and min_age is None:
        raise fail("unknown-age", "only a rule with min-age decides about unknown ages")
    if unknown_age not in UNKNOWN_AGE:
        raise fail("unknown-age", f'must be "hold" or "allow", not {unknown_age!r}')
    platforms = None
    if "platforms" in entries:
        given = entries["platforms"]
        if not isinstance(given, list) or not given or not all(isinstance(p, str) for p in given):
            raise fail("platforms", 'must be a list such as ["linux_amd64", "darwin_arm64"]')
        bad = [p for p in given if not _PLATFORM.match(p)]
        if bad:
            raise fail("platforms", f"{bad[0]!r} is not OS_ARCH (e.g. linux_amd64)")
        platforms = frozenset(given)
    conditional = min_age is not None or platforms is not None
    action = entries.get("action", "deny" if conditional else None)
    if action not in ACTIONS:
        raise fail("action", f'must be "allow" or "deny", not {action!r}')
    if conditional and action != "deny":
        raise fail("action", "a rule with min-age or platforms holds back what fails them: it cannot allow")
    reason = entries.get("reason", "")
    if not isinstance(reason, str):
        raise fail("reason", "must be a string")
    min_age_text = format_duration(min_age) if min_age is not None else ""
    if isinstance(entries.get("min-age"), str):
        min_age_text = str(entries["min-age"]).strip()
    return Rule(
        name,
        providers,
        modules,
        versions,
        versions_text,
        clients,
        action,
        one_line(reason),
        min_age,
        platforms,
        min_age_text,
        scopes,
        str(unknown_age),
    )


def _globs(value: object, parts: int, shape: str, fail: Callable[[str], Exception]) -> re.Pattern[str] | None:
    globs = address_globs(value, parts, shape, fail)
    return None if globs is None else compile_globs(globs)


def describe(policy: Policy) -> Iterable[str]:
    """The rules in order, one line each (for `policy check`)."""
    yield f"mode: {policy.mode}"
    for index, rule in enumerate(policy.rules, 1):
        what = []
        if rule.versions is not None:
            what.append(f"versions {rule.versions_text}")
        if rule.min_age is not None:
            what.append(f"min-age {rule.min_age_text}, unknown-age {rule.unknown_age}")
        if rule.platforms is not None:
            what.append(f"platforms {', '.join(sorted(rule.platforms))}")
        if rule.clients is not None or rule.scopes is not None:
            what.append("some clients")
        yield f"{index}. {rule.name}: {rule.action}" + (f" ({'; '.join(what)})" if what else "")
    yield f"default: {policy.default_action}"
