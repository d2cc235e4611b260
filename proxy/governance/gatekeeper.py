"""The policy at work: what the handlers and commands ask before anything is fetched, and what they record.

`Gatekeeper` holds the policy in force (`--policy`, read again by `reload` on SIGHUP; a broken file keeps
the old one), decides with it (`proxy.governance.policy`, pure), refuses with `PolicyDeniedError` (403 naming the rule
and its reason) and writes every refusal to the audit trail (`proxy.governance.audit`) and the metrics. The order of a
request: the address alone first (a denied namespace is refused before any upstream request, its version
list included), then, when a min-age rule may apply, the version list and the recorded release times, then the
version and platform. Version lists are filtered (`filter`), so a constraint resolves to the newest allowed
version; the filtered list is the same object while the list, the policy and the held-back times are.

The min-age rules go by the times of `proxy.governance.release_times.FirstSeen`: when any replica first saw a version,
and the upstream's publish time where it gives one, the later of the two, or an operator's baseline. Lists use
what is recorded; a version a client asks for, whose age decides, has its publish time asked for (once for the
fleet) first. An age none of them establishes is unknown (a first listing, a lost or forged record), decided by
the rule's `unknown-age` (hold by default); a list withholding versions for it asks the registry API for their
dates first (`FirstSeen.learn_unknown`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from proxy.domain.addresses import ModuleAddr, Platform, ProviderAddr, Version
from proxy.errors import PolicyDeniedError, PolicyHeldBackError, StoreUnavailableError
from proxy.governance.audit import AuditLog, ClientIdentity
from proxy.governance.policy import (
    FIRST_LISTING,
    MODULE,
    NEVER,
    PROVIDER,
    Decision,
    Filtered,
    Policy,
    PolicyError,
    ReleaseTime,
    Scopes,
    Subject,
    parse_policy,
    utc_timestamp,
)
from proxy.governance.release_times import FirstSeen
from proxy.protocol.provider_registry import VersionInfo
from proxy.protocol.publish_dates import LAST_MODIFIED, parse_last_modified
from proxy.runtime.memo import Memo
from proxy.runtime.metrics import Metrics

log = structlog.get_logger(__name__)
Address = ProviderAddr | ModuleAddr
_FOREVER = float("inf")
_FACTS_PER_ADDRESS = 4096


@dataclass
class _AddressFacts:
    """The policy's decisions about one address for one client key (`Gatekeeper._facts`)."""

    policy: Policy
    decision: Decision | None  # about every version at once (None: it depends on the version)
    ages: bool  # a min-age rule may decide about some version
    # decisions per (version, platform): (the version list object, the decision, `Gatekeeper.stamp`)
    versions: dict[tuple[Version, str | None], tuple[object, Decision, int]] = field(default_factory=dict)
    platforms: dict[Version, tuple[object, frozenset[Platform] | None]] = field(default_factory=dict)
    # `:version.json` answers allowed outright: version → (the version list object, the platforms allowed,
    # `Gatekeeper.stamp`)
    documents: dict[Version, tuple[object, frozenset[Platform] | None, int]] = field(default_factory=dict)

    @staticmethod
    def remember(memo: dict, key: object, value: object) -> None:
        if len(memo) >= _FACTS_PER_ADDRESS:
            memo.clear()
        memo[key] = value


def load_policy(path: Path) -> Policy:
    """The policy file, parsed (raises OSError or PolicyError)."""
    return parse_policy(path.read_text(encoding="utf-8"), str(path))


def subject_of(addr: Address, version: Version | None = None, platform: str | None = None) -> Subject:
    return Subject(MODULE if isinstance(addr, ModuleAddr) else PROVIDER, str(addr), version, platform)


def artifact_of(subject: Subject) -> dict:
    """The audit trail's `artifact`."""
    found: dict = {"kind": subject.kind, "address": subject.address}
    if subject.version is not None:
        found["version"] = str(subject.version)
    if subject.platform:
        found["platform"] = subject.platform
    return found


class Gatekeeper:
    """The policy in force, its decisions, and the audit trail of them."""

    def __init__(
        self,
        policy: Policy | None,
        *,
        path: Path | None = None,
        first_seen: FirstSeen | None = None,
        audit: AuditLog | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.path = path
        self.first_seen = first_seen
        self.audit = audit or AuditLog()
        self.metrics = metrics
        self.clock = clock
        self._filtered: Memo[tuple, tuple[object, Policy, Filtered, int]] = Memo()
        # Decisions per address and client key, then per version and platform: reused while the policy and
        # their source (the version list, the offered platforms) are the same objects. Precompiled rules are
        # cheap, but 50 of them per request are not free on the warm path (bench/policy.py).
        self._addresses: Memo[tuple, _AddressFacts] = Memo()
        self._last: tuple[Address, str, _AddressFacts] | None = None

    @property
    def active(self) -> bool:
        return self.policy is not None

    def reload(self) -> None:
        """Read the policy file again; a broken file keeps the policy in force (and the log says why)."""
        if self.path is None:
            return
        try:
            policy = load_policy(self.path)
        except (OSError, PolicyError) as exc:
            log.error(
                "policy.reload_failed",
                file=str(self.path),
                error=str(exc),
                effect="the previous policy stays",
                pid=os.getpid(),
            )
            return
        self.policy = policy
        log.info("policy.reloaded", file=str(self.path), rules=len(policy.rules), mode=policy.mode, pid=os.getpid())

    def client_key(self, client: ClientIdentity) -> tuple[str, tuple[str, ...]]:
        """The part of the client a decision depends on (its name and scopes only when some rule names them)."""
        policy = self.policy
        return ("", ()) if policy is None else policy.client_key(client.name, client.scopes)

    # ---- decisions -----------------------------------------------------------------------------

    def check_address(self, addr: Address, client: ClientIdentity) -> None:
        """Refuse now when the policy denies every version of `addr` (nothing is fetched for it)."""
        policy = self.policy
        if policy is not None:
            self._admitted_facts(policy, addr, client)

    def _admitted_facts(self, policy: Policy, addr: Address, client: ClientIdentity) -> _AddressFacts:
        """What is known of `addr` for `client`, after refusing when the policy denies every version of it."""
        facts = self._facts(policy, addr, client)
        if facts.decision is not None and not facts.decision.allowed:
            self._refuse(subject_of(addr), client, facts.decision)
        return facts

    def _facts(self, policy: Policy, addr: Address, client: ClientIdentity) -> _AddressFacts:
        """What the policy says about `addr` for this client, and its memo of version and platform decisions:
        one lookup per request on the warm path."""
        client_key = policy.client_key(client.name, client.scopes)
        last = self._last
        if last is not None and last[0] is addr and last[1] == client_key and last[2].policy is policy:
            return last[2]  # the same request asks again (its version, then its platforms)
        key = (addr, client_key)
        facts = self._addresses.get(key)
        if facts is None or facts.policy is not policy:
            subject = subject_of(addr)
            facts = _AddressFacts(
                policy,
                policy.decide_address(subject, client.name, client.scopes),
                policy.needs_age(subject, client.name, client.scopes),
            )
            self._addresses.put(key, facts)
        self._last = (addr, client_key, facts)
        return facts

    async def filter(
        self,
        addr: Address,
        versions: Iterable[Version],
        client: ClientIdentity,
        source: object,
    ) -> Filtered | None:
        """The versions of `addr` the client may see (None: no policy, every version). `source`: the object
        the versions come from, the same while they are unchanged (the result is too)."""
        policy = self.policy
        if policy is None:
            return None
        memo_key = (addr, self.client_key(client))
        known = self._filtered.get(memo_key)
        now = self.clock()
        stamp = self.stamp
        if (
            known is not None
            and known[0] is source
            and known[1] is policy
            and known[3] == stamp
            and now < known[2].valid_until
        ):
            return known[2]
        versions = list(versions)
        times = await self._times(policy, addr, versions, client)
        allowed, withheld, until = self._sort(policy, addr, versions, client, times, now)
        unknown = [
            v for v, d in withheld if self._date_may_tell(policy, subject_of(addr, v), client, times.get(v), now)
        ]
        if unknown and self.first_seen is not None:  # where the upstream dates them, its dates decide
            await self.first_seen.learn_unknown(addr, unknown)
            stamp = self.stamp
            times = await self._times(policy, addr, versions, client)
            allowed, withheld, until = self._sort(policy, addr, versions, client, times, now)
        withheld.sort(key=lambda pair: pair[0].precedence(), reverse=True)
        filtered = Filtered(frozenset(allowed), tuple(withheld), until)
        for version, decision in withheld:  # recorded when a list is filtered anew, not on every request
            self.audit.withheld(  # (with --audit-required, a refusal leaves the list to be filtered anew)
                artifact_of(subject_of(addr, version)), client, rule=decision.rule, reason=decision.reason
            )
            if self.metrics is not None:
                self.metrics.policy_decisions.labels(decision.rule, "withheld").inc()
        self._filtered.put(memo_key, (source, policy, filtered, stamp))
        return filtered

    @staticmethod
    def _sort(
        policy: Policy,
        addr: Address,
        versions: list[Version],
        client: ClientIdentity,
        times: Mapping[Version, ReleaseTime],
        now: float,
    ) -> tuple[set[Version], list[tuple[Version, Decision]], float]:
        """The versions allowed, those withheld with their decisions, and the first time a held one is not."""
        allowed, withheld, until = set(), [], _FOREVER
        for version in versions:
            decision = _decide(policy, subject_of(addr, version), client, times.get(version), now)
            if decision.allowed or not decision.enforced:
                allowed.add(version)
            else:
                withheld.append((version, decision))
                if decision.until is not None:
                    until = min(until, decision.until)
        return allowed, withheld, until

    async def check(
        self,
        addr: Address,
        version: Version,
        platform: str | None,
        client: ClientIdentity,
        listed: Callable[[], Awaitable[Iterable[Version]]],
    ) -> Decision | None:
        """Refuse `addr` `version` (on `platform`) when the policy denies it; `listed`: the version list, asked
        for only when a min-age rule may apply (for the first-seen times). The decision (None: no policy, or
        a version the upstream does not list)."""
        policy = self.policy
        if policy is None:
            return None
        facts = self._admitted_facts(policy, addr, client)
        source = await listed() if facts.ages else None  # the same object while the list is unchanged
        now = self.clock()
        stamp = self.stamp
        known = facts.versions.get((version, platform))
        if (
            known is not None
            and known[0] is source
            and known[2] == stamp
            and (known[1].until is None or now < known[1].until)
        ):
            decision = known[1]  # a held-back version is decided again once its time has come
        else:
            subject = subject_of(addr, version, platform)
            time_of: ReleaseTime | None = None
            if source is not None:
                versions = list(source)
                if version not in versions:
                    return None  # not in the upstream's list: the service answers 404
                time_of = (await self._times(policy, addr, versions, client)).get(version)
            decision = _decide(policy, subject, client, time_of, now)
            if time_of is not None and self._age_decides(policy, subject, client, decision, time_of, now):
                time_of = await self.first_seen.learn(addr, version)  # asks for the publish time once
                decision = _decide(policy, subject, client, time_of, now)
                stamp = self.stamp
            facts.remember(facts.versions, (version, platform), (source, decision, stamp))
        if not decision.allowed:
            self._refuse(subject_of(addr, version, platform), client, decision)
        return decision

    async def version_platforms(
        self,
        addr: ProviderAddr,
        version: Version,
        client: ClientIdentity,
        listed: Callable[[], Awaitable[Mapping[Version, VersionInfo]]],
    ) -> frozenset[Platform] | None:
        """For a `:version.json`: refuse `version` when the policy denies it, else which of its platforms the
        client may have (None: all of them). A version allowed outright is remembered per (policy, address,
        client key, version) with the version list it was decided from: a warm request makes one lookup and
        asks for the (memoized) list once."""
        policy = self.policy
        if policy is None:
            return None
        facts = self._admitted_facts(policy, addr, client)
        known = facts.documents.get(version)
        if known is not None:
            source = await listed()
            if known[0] is source and known[2] == self.stamp:
                return known[1]
        decision = await self.check(addr, version, None, client, listed)
        source = await listed()
        info = source.get(version)
        only = None if info is None else self.platforms(addr, version, info.platforms, client)
        if decision is None or decision.allowed:  # a would-be denial (warn mode) is recorded every time
            facts.remember(facts.documents, version, (source, only, self.stamp))
        return only

    def platforms(
        self, addr: Address, version: Version, offered: Iterable[Platform], client: ClientIdentity
    ) -> frozenset[Platform] | None:
        """Which of the `offered` platforms the client may have (None: all of them): a `:version.json` lists
        only those, and nothing about the others is fetched."""
        policy = self.policy
        if policy is None:
            return None
        facts = self._facts(policy, addr, client)
        known = facts.platforms.get(version)
        if known is not None and known[0] is offered:
            return known[1]
        source, offered = offered, tuple(offered)
        allowed = frozenset(
            p
            for p in offered
            if policy.decide(
                subject_of(addr, version, str(p)), client.name, scopes=client.scopes, published=0, now=_FOREVER
            ).allowed
        )
        result = None if len(allowed) == len(offered) or policy.mode == "warn" else allowed
        facts.remember(facts.platforms, version, (source, result))
        return result

    async def _times(
        self, policy: Policy, addr: Address, versions: list[Version], client: ClientIdentity
    ) -> Mapping[Version, ReleaseTime]:
        if self.first_seen is None or not policy.needs_age(subject_of(addr), client.name, client.scopes):
            return {}
        return await self.first_seen.times(addr, versions)

    @property
    def stamp(self) -> int:
        """Changes when this process learns a publish time: decisions remembered before are made again (a handler
        whose fetch learned one, a SHA256SUMS's `Last-Modified`, decides again before answering)."""
        return 0 if self.first_seen is None else self.first_seen.changes

    def _age_decides(
        self,
        policy: Policy,
        subject: Subject,
        client: ClientIdentity,
        decision: Decision,
        time_of: ReleaseTime,
        now: float,
    ) -> bool:
        """Whether a publish time could hold back a version its known times let through, or tell the age of a
        version held for an unknown one: asked for only then (a version denied, held back by a known age or
        in warn mode would-be denied already costs no request)."""
        if self.first_seen is None:
            return False
        if not decision.allowed:
            return decision.enforced and self._date_may_tell(policy, subject, client, time_of, now)
        youngest = policy.decide(subject, client.name, scopes=client.scopes, published=now, now=now)
        return youngest.until is not None

    @staticmethod
    def _date_may_tell(
        policy: Policy, subject: Subject, client: ClientIdentity, time_of: ReleaseTime | None, now: float
    ) -> bool:
        """Whether a version is held for an unknown age only (an old one would let it through): a publish date
        may tell it."""
        if time_of is None or time_of.age_known:
            return False
        return policy.decide(subject, client.name, scopes=client.scopes, published=FIRST_LISTING, now=now).allowed

    def dates_wanted(self) -> bool:
        """Whether a publish time (e.g. a SHA256SUMS's `Last-Modified`) may hold a release back now."""
        return self.policy is not None and self.policy.ages and self.first_seen is not None

    async def dated(self, addr: ProviderAddr, version: Version, last_modified: str) -> None:
        """A release's SHA256SUMS was fetched with this `Last-Modified`: a publish time, recorded when a min-age
        rule may need it (`Mirror.on_dated`)."""
        when = parse_last_modified(last_modified)
        if when is None or not self.dates_wanted():
            return
        assert self.first_seen is not None  # (`dates_wanted`)
        try:
            await self.first_seen.note_published(addr, version, when, LAST_MODIFIED)
        except StoreUnavailableError as exc:  # the SHA256SUMS fetched is not failed by it
            log.warning("policy.publish_time_not_recorded", artifact=f"{addr} {version}", error=exc.message)

    def _refuse(self, subject: Subject, client: ClientIdentity, decision: Decision) -> None:
        """Record the denial (or would-be denial), and raise it unless in warn mode (AuditUnavailableError instead
        when --audit-required and the audit log cannot be written: counted and logged all the same)."""
        if self.metrics is not None:
            self.metrics.policy_decisions.labels(decision.rule, decision.outcome).inc()
        log.info(
            "policy.denied" if decision.enforced else "policy.would_deny",
            artifact=str(subject),
            client=client.name,
            rule=decision.rule,
            reason=decision.reason,
        )
        self.audit.denied(
            artifact_of(subject), client, rule=decision.rule, reason=decision.reason, decision=decision.outcome
        )
        if not decision.enforced:
            return
        message = f"{subject.kind} {subject} is denied by policy rule {decision.rule}: {decision.reason}"
        if decision.until is not None:
            available = utc_timestamp(decision.until)
            raise PolicyHeldBackError(message, rule=decision.rule, reason=decision.reason, available_at=available)
        raise PolicyDeniedError(message, rule=decision.rule, reason=decision.reason)

    # ---- the audit trail of what passed -----------------------------------------------------------

    def fetched(self, addr: Address, version: Version, platform: str | None = None) -> None:
        self.audit.fetched(artifact_of(subject_of(addr, version, platform)))

    def served(self, addr: Address, version: Version, platform: str | None, client: ClientIdentity) -> None:
        self.audit.served(artifact_of(subject_of(addr, version, platform)), client)


def _age_text(seconds: float) -> str:
    """An age in days, hours and minutes (`3d 4h 12m`; a long one: from the epoch when nothing was known)."""
    minutes = max(0, int(seconds // 60))
    days, hours, minutes = minutes // 1440, minutes // 60 % 24, minutes % 60
    return " ".join(f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n) or "0m"


def _decide(
    policy: Policy, subject: Subject, client: ClientIdentity, time_of: ReleaseTime | None, now: float
) -> Decision:
    """`policy.decide` with what the version's age counts from (None: not known)."""
    if time_of is None:
        return policy.decide(subject, client.name, scopes=client.scopes, now=now)
    return policy.decide(
        subject,
        client.name,
        scopes=client.scopes,
        published=time_of.counted_from,
        now=now,
        age_source=time_of.decided_by,
        age_known=time_of.age_known,
    )


def explain(
    policy: Policy, subject: Subject, client: str, released: ReleaseTime | None, now: float, scopes: Scopes = ()
) -> list[str]:
    """Which rule decides about `subject` for `client` with `scopes` and why, one line each (`registry-proxy
    policy explain`); `released`: what the version's age counts from (None: not known)."""
    lines = []
    if subject.version is not None and policy.needs_age(subject, client, scopes):
        if released is None:
            lines.append(
                "age: unknown (no first-seen time or publish time given: --age, --published): each min-age rule"
                " decides by its unknown-age"
            )
        else:
            counted = released.counted_from
            if not released.age_known:
                since = (
                    "" if counted == NEVER else f"; listed since {utc_timestamp(counted)} ({_age_text(now - counted)})"
                )
                lines.append(f"age: unknown: no first-seen record, no publish time{since}")
            else:
                lines.append(
                    f"age: {_age_text(now - counted)}, counted from {released.decided_by} ({utc_timestamp(counted)})"
                )
    for index, rule in enumerate(policy.rules, 1):
        selects = rule.selects(subject, client, scopes)
        if selects is False:
            lines.append(f"{index}. {rule.name}: does not apply")
            continue
        if selects is None:
            lines.append(f"{index}. {rule.name}: applies to the versions {rule.versions_text} only")
            continue
        if not rule.conditional:
            lines.append(f"{index}. {rule.name}: applies: {rule.action}")
            break
        parts = []
        if rule.platforms is not None:
            parts.append(f"refuses platforms other than {', '.join(sorted(rule.platforms))}")
        if rule.min_age is not None:
            parts.append(
                f"holds back versions younger than {rule.min_age_text} (of an unknown age: {rule.unknown_age})"
            )
        lines.append(f"{index}. {rule.name}: {'; '.join(parts)}")
    if subject.version is None:
        decision = policy.decide_address(subject, client, scopes)
        if decision is None:
            lines.append("decision: depends on the version (give ADDRESS@VERSION)")
            return lines
    else:
        decision = policy.decide(
            subject,
            client,
            scopes=scopes,
            published=None if released is None else released.counted_from,
            now=now,
            age_source="" if released is None else released.decided_by,
            age_known=released is None or released.age_known,
        )
    verdict = "allow" if decision.allowed else "deny"
    warn = "" if decision.enforced else " (warn mode: not enforced)"
    lines.append(f"decision: {verdict} by {decision.rule}: {decision.reason}{warn}")
    return lines
