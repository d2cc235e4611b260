"""Publish times for min-age, pure parts: the upstream's dates read (registry API `published_at`, HTTP
`Last-Modified`), which source the age counts from (the later of publish time and first-seen), the records
that keep them (first-seen, baseline), unknown ages (no record: held by `unknown-age = "hold"`, never old), and
the decisions they make with an injected clock."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from yarl import URL

from proxy.domain.addresses import ModuleAddr, ProviderAddr, Version
from proxy.governance.gatekeeper import explain
from proxy.governance.policy import (
    FIRST_LISTING,
    FIRST_SEEN,
    NEVER,
    PROVIDER,
    UNKNOWN,
    ReleaseTime,
    Subject,
    believed,
    parse_policy,
)
from proxy.governance.release_times import (
    Baseline,
    ReleaseRecord,
    Releases,
    read_baseline,
    read_release_record,
    release_time_in,
)
from proxy.protocol.publish_dates import (
    LAST_MODIFIED,
    REGISTRY_API,
    SOURCES,
    parse_last_modified,
    parse_published_at,
    registry_api_url,
)

HOUR = 3600.0
NOW = 1_900_000_000.0  # 2030-03-17T17:46:40Z
V = Version.parse("5.1.0")
COOLDOWN = parse_policy('[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\n', "policy.toml")
SUBJECT = Subject(PROVIDER, "registry.terraform.io/hashicorp/aws", V)
API = SOURCES[REGISTRY_API]


def document(**fields) -> bytes:
    return json.dumps({"id": "hashicorp/aws/5.1.0", "version": "5.1.0", **fields}).encode()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (document(published_at="2030-03-17T16:46:40Z"), NOW - HOUR),
        (document(published_at="2030-03-17T18:46:40+02:00"), NOW - HOUR),
        (document(published_at="2030-03-17T16:46:40.123456Z"), NOW - HOUR + 0.123456),
        (document(), None),  # absent
        (document(published_at="last tuesday"), None),  # malformed
        (document(published_at="2030-03-17T16:46:40"), None),  # no time zone: not a point in time
        (document(published_at=1900000000), None),  # not text
        (document(published_at="1970-01-01T00:00:00Z"), None),  # before any registry
        (document(published_at="x" * 100), None),
        (json.dumps({"version": "5.0.0", "published_at": "2030-03-17T16:46:40Z"}).encode(), None),  # another one
        (json.dumps({"version": "v5.1.0", "published_at": "2030-03-17T16:46:40Z"}).encode(), NOW - HOUR),
        (json.dumps({"version": "5.1", "published_at": "2030-03-17T16:46:40Z"}).encode(), None),
        (b"[]", None),
        (b"{not json", None),
        (b"", None),
    ],
)
def test_published_at_is_read_or_no_date(body, expected):
    found = parse_published_at(body, V)
    assert found == (pytest.approx(expected) if expected is not None else None)


def test_last_modified_is_read_or_no_date():
    assert parse_last_modified("Sun, 17 Mar 2030 16:46:40 GMT") == NOW - HOUR
    for bad in (None, "", "yesterday", "Sun, 99 Mar 2030 16:46:40 GMT", "x" * 100, "Mon, 01 Jan 1990 00:00:00 GMT"):
        assert parse_last_modified(bad) is None


def test_the_registry_api_is_asked_only_where_discovery_lists_the_public_registrys_bases_on_its_origin():
    provider = ProviderAddr.parse("registry.terraform.io", "hashicorp", "aws")
    module = ModuleAddr.parse("registry.terraform.io", "terraform-aws-modules", "vpc", "aws")
    found = URL("https://registry.terraform.io/.well-known/terraform.json")
    assert registry_api_url(URL("https://registry.terraform.io/v1/providers/"), found, provider, V) == URL(
        "https://registry.terraform.io/v1/providers/hashicorp/aws/5.1.0"
    )
    assert registry_api_url(URL("https://registry.terraform.io/v1/modules/"), found, module, V) == URL(
        "https://registry.terraform.io/v1/modules/terraform-aws-modules/vpc/aws/5.1.0"
    )
    assert registry_api_url(URL("https://elsewhere.example/v1/providers/"), found, provider, V) is None
    assert registry_api_url(URL("https://registry.terraform.io/api/providers/v1/"), found, provider, V) is None
    assert registry_api_url(URL("https://registry.terraform.io/v1/modules/"), found, provider, V) is None


def test_the_age_counts_from_the_later_of_publish_time_and_first_seen():
    old, recent = NOW - 1000 * HOUR, NOW - HOUR
    assert ReleaseTime(FIRST_LISTING, recent, API).counted_from == recent  # listed at first sight, published lately
    assert ReleaseTime(FIRST_LISTING, recent, API).decided_by == API
    assert ReleaseTime(recent, old, API).counted_from == recent  # an old date for a version just seen: held back
    assert ReleaseTime(recent, old, API).decided_by == FIRST_SEEN
    assert ReleaseTime(recent).counted_from == recent and ReleaseTime(recent).decided_by == FIRST_SEEN
    assert ReleaseTime(FIRST_LISTING).counted_from == FIRST_LISTING  # baselined: old on purpose
    assert "baseline" in ReleaseTime(FIRST_LISTING).decided_by
    unknown = ReleaseTime(recent, known=False)  # listed an hour ago, in a record made anew: no evidence of age
    assert not unknown.age_known and unknown.counted_from == recent and unknown.decided_by == UNKNOWN
    dated = ReleaseTime(recent, old, API, known=False)  # a publish time gives an unknown age: it alone decides
    assert dated.age_known and dated.counted_from == old and dated.decided_by == API
    assert believed(NOW + 1000 * HOUR, NOW) == NOW and believed(recent, NOW) == recent  # the future is not believed


@pytest.mark.parametrize(
    ("released", "held_until", "source"),
    [
        (ReleaseTime(FIRST_LISTING, NOW - 100 * HOUR, API), None, None),  # published long ago
        (ReleaseTime(FIRST_LISTING, NOW - HOUR, API), NOW + 71 * HOUR, API),  # published an hour ago
        (ReleaseTime(FIRST_LISTING), None, None),  # no date, baselined: old on purpose
        (ReleaseTime(NOW - HOUR, NOW - 100 * HOUR, API, known=False), None, None),  # unknown first-seen, dated old
        (ReleaseTime(NOW - HOUR, NOW - HOUR, API, known=False), NOW + 71 * HOUR, API),  # unknown, dated lately
        (ReleaseTime(NOW - HOUR), NOW + 71 * HOUR, FIRST_SEEN),  # no date, seen an hour ago
        (ReleaseTime(NOW - HOUR, NOW - 1000 * HOUR, API), NOW + 71 * HOUR, FIRST_SEEN),  # an old date, new to us
        (ReleaseTime(FIRST_LISTING, believed(NOW + 500 * HOUR, NOW), API), NOW + 72 * HOUR, API),  # the future
    ],
)
def test_decisions_with_an_injected_clock(released, held_until, source):
    decision = COOLDOWN.decide(
        SUBJECT,
        published=released.counted_from,
        now=NOW,
        age_source=released.decided_by,
        age_known=released.age_known,
    )
    assert decision.until == held_until and decision.allowed == (held_until is None)
    if source is not None:
        assert f"age counted from: {source}" in decision.reason
        later = COOLDOWN.decide(SUBJECT, published=released.counted_from, now=held_until, age_source=source)
        assert later.allowed  # available at the time the refusal gave


def test_the_record_keeps_first_seen_and_publish_times_by_source():
    record = ReleaseRecord(
        {Version.parse("5.2.0"): NOW},
        {V: {LAST_MODIFIED: NOW - 2 * HOUR, REGISTRY_API: NOW - HOUR}, Version.parse("5.2.0"): {REGISTRY_API: None}},
        {V: NOW - 10 * HOUR},
    )
    again = read_release_record(record.encode())
    assert again == record
    releases = Releases(again)
    # the registry API is trusted first, and gives the age the record does not know
    assert releases.time_of(V) == ReleaseTime(NOW - 10 * HOUR, NOW - HOUR, API, known=False)
    assert releases.time_of(Version.parse("5.2.0")) == ReleaseTime(NOW)  # asked, no date
    assert again.asked(Version.parse("5.2.0"), REGISTRY_API) and not again.asked(V, "other")
    assert release_time_in(record.encode(), Version.parse("9.9.9")) == ReleaseTime(NEVER, known=False)
    assert release_time_in(None, V) == ReleaseTime(NEVER, known=False)  # no record: unknown, never old


def test_a_record_written_when_first_listings_counted_as_old_is_no_evidence():
    old_format = b'{"v": 1, "kind": "record", "data": {"v": 1, "seen": {"5.1.0": 0.0, "5.2.0": 5.0}}}'
    assert read_release_record(old_format) is None  # its 0.0 ("seen long ago") may be the bypass itself
    assert read_release_record(b"not json") is None and read_release_record(None) is None


def test_a_baseline_makes_versions_old_on_purpose_but_not_those_seen_new_nor_those_published_lately():
    baseline = Baseline({V: NOW - HOUR, Version.parse("5.2.0"): NOW - HOUR}, "alice")
    assert read_baseline(baseline.encode()) == baseline
    assert read_baseline(b"junk") == Baseline() and read_baseline(None) == Baseline()
    record = ReleaseRecord(seen={Version.parse("5.2.0"): NOW - HOUR}, since={V: NOW, Version.parse("5.3.0"): NOW})
    releases = Releases(record, baseline)
    assert releases.time_of(V).counted_from == FIRST_LISTING and "alice" in releases.time_of(V).decided_by
    assert releases.time_of(Version.parse("5.2.0")) == ReleaseTime(NOW - HOUR)  # its first-seen time wins
    assert not releases.time_of(Version.parse("5.3.0")).age_known
    dated = Releases(replace(record, published={V: {REGISTRY_API: NOW - HOUR}}), baseline).time_of(V)
    assert dated.counted_from == NOW - HOUR  # the later of the two still counts


@pytest.mark.parametrize("unknown_age", ["hold", "allow"])
def test_an_unknown_age_is_decided_by_the_rules_unknown_age_until_the_min_age_passed_since_listed(unknown_age):
    policy = parse_policy(
        f'[[rule]]\nname = "cooldown"\nproviders = ["*/*/*"]\nmin-age = "72h"\nunknown-age = "{unknown_age}"\n'
    )
    listed_lately = ReleaseTime(NOW - HOUR, known=False)
    decision = policy.decide(SUBJECT, published=listed_lately.counted_from, now=NOW, age_known=False)
    if unknown_age == "allow":
        assert decision.allowed and decision.rule == "default"
    else:
        assert decision.denied and decision.until == NOW + 71 * HOUR
        assert "its age is unknown (no first-seen record, no publish time); held by unknown-age = hold" in (
            decision.reason
        )
        assert "run `registry-proxy policy baseline registry.terraform.io/hashicorp/aws` to" in decision.reason
    # listed for longer than the min-age: old enough whatever its age
    assert policy.decide(SUBJECT, published=NOW - 73 * HOUR, now=NOW, age_known=False).allowed
    never = policy.decide(SUBJECT, published=None, now=NOW)  # no lower bound at all
    assert never.allowed == (unknown_age == "allow") and never.until is None


def test_explain_says_which_source_the_age_counts_from():
    lines = explain(COOLDOWN, SUBJECT, "anonymous", ReleaseTime(FIRST_LISTING, NOW - HOUR, API), NOW)
    assert lines[0] == f"age: 1h, counted from {API} (2030-03-17T16:46:40Z)"
    assert lines[-1].startswith("decision: deny by cooldown") and API in lines[-1]
    lines = explain(COOLDOWN, SUBJECT, "anonymous", ReleaseTime(NOW - 100 * HOUR), NOW)
    assert lines[0].startswith(f"age: 4d 4h, counted from {FIRST_SEEN}") and lines[-1].startswith("decision: allow")
    unknown = explain(COOLDOWN, SUBJECT, "anonymous", None, NOW)
    assert unknown[0].startswith("age: unknown") and "its age is unknown" in unknown[-1]
    assert "held by unknown-age = hold" in unknown[-1] and unknown[-1].startswith("decision: deny by cooldown")
    lines = explain(COOLDOWN, SUBJECT, "anonymous", ReleaseTime(NOW - HOUR, known=False), NOW)
    assert lines[0] == "age: unknown: no first-seen record, no publish time; listed since 2030-03-17T16:46:40Z (1h)"
    assert "(of an unknown age: hold)" in lines[1] and "held by unknown-age = hold" in lines[-1]
