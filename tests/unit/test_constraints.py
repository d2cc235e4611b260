"""Unit tests for proxy.domain.constraints: provider version constraints as Terraform/OpenTofu apply them.

Every expectation in the tables below was cross-checked against Terraform 1.11.4 itself
(`terraform init` against a local filesystem mirror holding exactly the listed versions,
reading the selected version and the `constraints` string from the lock file it wrote, or
from its "no available releases match the given constraints ..." error when nothing matched).
Terraform parses with apparentlymart/go-versions `ParseRubyStyleMulti` and renders lock-file
constraints with `getproviders.VersionConstraintsString`.
"""

from __future__ import annotations

import itertools

import pytest

from proxy.domain.addresses import Version
from proxy.domain.constraints import Constraint, ConstraintError, allows, canonical, newest, parse

# Releases only.
RELEASES = ["0.9.0", "1.0.0", "1.0.5", "1.1.0", "1.2.0", "1.2.3", "1.2.7", "1.3.0", "1.10.0", "2.0.0", "2.5.1", "3.0.0"]
# The same, plus pre-releases scattered in between and above the newest release.
WITH_PRE = [*RELEASES, "1.2.8-beta1", "1.11.0-rc1", "3.1.0-alpha.1", "4.0.0-beta"]


def versions(texts: list[str]) -> list[Version]:
    return [Version.parse(t) for t in texts]


def select(constraint_strings: list[str], available: list[str]) -> str | None:
    """Parse each string (as from several modules), merge, and select like `terraform init`."""
    terms = [term for text in constraint_strings for term in parse(text)]
    chosen = newest(terms, versions(available))
    return None if chosen is None else str(chosen)


# ---------------------------------------------------------------------------------------------
# Selection: one operator at a time, then combinations
# ---------------------------------------------------------------------------------------------

SELECTION = [
    # no constraint at all: the newest release
    ("", "3.0.0"),
    # exact, with `=` or without an operator; omitted parts are zero
    ("1.2.3", "1.2.3"),
    ("= 1.2.3", "1.2.3"),
    ("=1.2.3", "1.2.3"),
    ("1.2", "1.2.0"),
    ("1", "1.0.0"),
    ("2.5.1", "2.5.1"),
    ("= 1.4.0", None),
    # !=
    ("!= 3.0.0", "2.5.1"),
    ("!=3.0.0", "2.5.1"),
    ("!= 1.0.0", "3.0.0"),
    # >
    ("> 2.0.0", "3.0.0"),
    ("> 2.5", "3.0.0"),
    ("> 3.0.0", None),
    (">2.5.1", "3.0.0"),
    # >=
    (">= 3", "3.0.0"),
    (">= 2.5.1", "3.0.0"),
    (">= 3.0.1", None),
    # <
    ("< 2", "1.10.0"),
    ("< 2.0.0", "1.10.0"),
    ("< 1.2.3", "1.2.0"),
    ("< 0.9", None),
    # <=
    ("<= 1.2.3", "1.2.3"),
    ("<=1.2", "1.2.0"),
    ("<= 0.9.0", "0.9.0"),
    # ~> with one part: ~> 1 is >= 1.0.0, < 2.0.0
    ("~> 1", "1.10.0"),
    ("~> 2", "2.5.1"),
    ("~> 0", "0.9.0"),
    # ~> with two parts: ~> 1.2 is >= 1.2.0, < 2.0.0
    ("~> 1.2", "1.10.0"),
    ("~> 2.0", "2.5.1"),
    ("~> 0.9", "0.9.0"),
    ("~> 1.11", None),
    ("~> 3.1", None),
    # ~> with three parts: ~> 1.2.3 is >= 1.2.3, < 1.3.0
    ("~> 1.2.3", "1.2.7"),
    ("~> 1.2.0", "1.2.7"),
    ("~>1.2.0", "1.2.7"),
    ("~> 2.0.0", "2.0.0"),
    ("~> 1.0.5", "1.0.5"),
    ("~> 1.3.0", "1.3.0"),
    # combinations
    (">= 1.0, < 2.0", "1.10.0"),
    (">=1.0,<2.0", "1.10.0"),
    (" >= 1.0 ,  < 1.2 ", "1.1.0"),
    (">= 1.2, < 1.3, != 1.2.7", "1.2.3"),
    ("~> 1.2, != 1.10.0", "1.3.0"),
    ("!= 1.2.7, != 1.10.0, ~> 1.2", "1.3.0"),
    ("> 1.0.0, <= 1.1", "1.1.0"),
    ("~> 1.0, ~> 1.2.0", "1.2.7"),
    (">= 2.0.0, < 2.0.0", None),
    ("1.2.3, 1.2.7", None),
]


@pytest.mark.parametrize(("constraint", "expected"), SELECTION)
@pytest.mark.parametrize("available", [RELEASES, WITH_PRE], ids=["releases", "with-prereleases"])
def test_newest_selection(constraint, available, expected):
    assert select([constraint], available) == expected


@pytest.mark.parametrize(
    ("per_module", "available", "expected"),
    [
        ([">= 1.0", "< 2.0", "~> 1.2.0"], RELEASES, "1.2.7"),
        (["~> 1.2", ">= 1.0", "~> 1.2"], RELEASES, "1.10.0"),
        ([">= 1.0", "1.2.8-beta1"], WITH_PRE, "1.2.8-beta1"),
        ([">= 2", "< 2"], RELEASES, None),
        (["", ">= 1.3"], RELEASES, "3.0.0"),
    ],
)
def test_constraints_from_several_modules_intersect(per_module, available, expected):
    assert select(per_module, available) == expected


@pytest.mark.parametrize(
    ("available", "expected"),
    [
        ([], None),
        (["1.0.0-beta1", "2.0.0-rc1"], None),  # only pre-releases: nothing without an exact request
        (["2.0.0", "10.0.0", "9.9.9"], "10.0.0"),  # numeric, not lexical, order
        (["1.0.0", "1.0.0-rc1"], "1.0.0"),
    ],
)
def test_no_constraint_selects_newest_release(available, expected):
    assert newest(parse(""), versions(available)) == (None if expected is None else Version.parse(expected))


# ---------------------------------------------------------------------------------------------
# Pre-releases: never selected unless named exactly with `=` (or no operator)
# ---------------------------------------------------------------------------------------------

PRERELEASES = [
    (">= 1.0", ["1.0.0", "1.1.0-beta1"], "1.0.0"),
    ("1.1.0-beta1", ["1.0.0", "1.1.0-beta1"], "1.1.0-beta1"),
    ("= 1.1.0-beta1", ["1.0.0", "1.1.0-beta1"], "1.1.0-beta1"),
    (">= 1.1.0-beta1", ["1.0.0", "1.1.0-beta1"], None),
    ("~> 1.1", ["1.0.0", "1.1.0", "1.2.0-rc1"], "1.1.0"),
    (">= 1.0.0, ~> 1.1.0-beta1", ["1.0.0", "1.1.0-beta1", "1.1.0"], "1.1.0"),
    ("", WITH_PRE, "3.0.0"),
    (">= 1.0", WITH_PRE, "3.0.0"),
    (">= 1.2.8-beta1", WITH_PRE, "3.0.0"),
    ("~> 1.2.8-beta1", WITH_PRE, None),  # 1.2.8-beta1 is in range, but only named by ~>
    ("~> 1.2.7", WITH_PRE, "1.2.7"),  # not 1.2.8-beta1
    ("> 1.2.7", WITH_PRE, "3.0.0"),
    ("~> 1.11", WITH_PRE, None),  # 1.11.0-rc1 is not a release
    ("~> 1.11.0", WITH_PRE, None),
    ("1.11.0-rc1", WITH_PRE, "1.11.0-rc1"),
    (">= 1.11.0-rc1, < 2.0.0", WITH_PRE, None),
    ("1.2.8-beta1, >= 1.0", WITH_PRE, "1.2.8-beta1"),
    ("1.2.8-beta1, > 2.0", WITH_PRE, None),  # named exactly, but excluded by another term
    ("!= 1.2.8-beta1", WITH_PRE, "3.0.0"),
    ("<= 1.2.8-beta1", WITH_PRE, "1.2.7"),
    ("~> 4.0", WITH_PRE, None),
    ("4.0.0-beta", WITH_PRE, "4.0.0-beta"),
    (">= 4.0.0-beta", WITH_PRE, None),
    ("~> 3.1", WITH_PRE, None),
    ("3.1.0-alpha.1", WITH_PRE, "3.1.0-alpha.1"),
    ("3.1.0-alpha.1, 4.0.0-beta", WITH_PRE, None),
    ("1.1.0-beta1", ["1.0.0", "1.1.0"], None),  # the named pre-release is not available
]


@pytest.mark.parametrize(("constraint", "available", "expected"), PRERELEASES)
def test_prerelease_selection(constraint, available, expected):
    assert select([constraint], available) == expected


@pytest.mark.parametrize(
    ("constraint", "version", "expected"),
    [
        ("1.1.0-beta1", "1.1.0-beta1", True),
        ("1.1.0-beta1", "1.1.0-beta2", False),
        (">= 1.1.0-beta1", "1.1.0-beta1", False),
        ("<= 1.1.0-beta1", "1.1.0-beta1", False),
        ("~> 1.1.0-beta1", "1.1.0-beta2", False),
        (">= 1.0", "1.1.0-beta1", False),
        (">= 1.0", "1.1.0", True),
        ("", "1.1.0-beta1", False),
        ("", "1.1.0", True),
    ],
)
def test_allows(constraint, version, expected):
    assert allows(parse(constraint), Version.parse(version)) is expected


# ---------------------------------------------------------------------------------------------
# Build metadata in a boundary: ignored by every operator except `=` and `!=`
# (go-versions MeetingConstraints clears it: "metadata is only considered for exact matches")
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("constraint", "available", "expected"),
    [
        ("1.2.3+build", ["1.2.3"], None),
        ("!= 1.2.3+build", ["1.2.3"], "1.2.3"),
        (">= 1.0.0+b", ["1.0.0"], "1.0.0"),
        ("< 1.0.0+b", ["1.0.0"], None),
        ("<= 1.0.0+b", ["1.0.0", "2.0.0"], "1.0.0"),
        ("> 1.0.0+b", ["0.9.0", "1.0.0"], None),
        ("~> 1.0.0+b", ["1.0.0", "2.0.0"], "1.0.0"),
    ],
)
def test_build_metadata_only_counts_for_exact_matches(constraint, available, expected):
    assert select([constraint], available) == expected


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", []),
        ("   ", []),
        ("1.2.3", [Constraint("=", Version(1, 2, 3), 3)]),
        ("= 1.2", [Constraint("=", Version(1, 2, 0), 2)]),
        ("!= 1", [Constraint("!=", Version(1, 0, 0), 1)]),
        ("~> 1", [Constraint("~>", Version(1, 0, 0), 1)]),
        ("~> 1.2", [Constraint("~>", Version(1, 2, 0), 2)]),
        ("~> 1.2.3", [Constraint("~>", Version(1, 2, 3), 3)]),
        (">1.0,<=2", [Constraint(">", Version(1, 0, 0), 2), Constraint("<=", Version(2, 0, 0), 1)]),
        ("  >= 1.0.0-rc.1 ", [Constraint(">=", Version(1, 0, 0, "rc.1"), 3)]),
        ("1.2.3+meta", [Constraint("=", Version(1, 2, 3, "", "meta"), 3)]),
        ("01.02.03", [Constraint("=", Version(1, 2, 3), 3)]),
    ],
)
def test_parse(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "kind"),
    [("~> 1", "~>minor"), ("~> 1.2", "~>minor"), ("~> 1.2.3", "~>patch"), (">= 1.2.3", ">="), ("1.2.3", "=")],
)
def test_kind(text, kind):
    assert parse(text)[0].kind == kind


@pytest.mark.parametrize(
    "text",
    [
        "garbage",
        ">=",
        ">= ",
        "~>",
        "~> ",
        "1.2.3.4",
        ">= 1.2.3.4",
        "=> 1",
        "=< 2",
        "== 1.0",
        "^1.0",
        "-1.0",
        ",",
        "1.0,",
        ", 1.0",
        "1.0,,2.0",
        "1.0, ,2.0",
        "1.*",
        "~> 1.x",
        "1.0 2.0",
        ">= 1.0 < 2.0",
        "1.0beta",
        "1.",
        "1..2",
        "V1.0",
        # go-versions: 'a "v" prefix should not be used'
        "v1.0",
        ">= v1.0",
        "~> v1.2.0",
        # go-versions: 'only one space is expected after the operator'
        ">=  1.0",
        "~>  1.0",
    ],
)
def test_parse_errors(text):
    with pytest.raises(ConstraintError):
        parse(text)


@pytest.mark.parametrize(
    ("text", "available", "expected", "lock_form"),
    [
        # A pre-release with fewer than three parts is accepted; the omitted parts are zero
        # (go-versions parseRubyStyle: "any unconstrained segments are implied to be zero").
        ("1.0-beta", ["1.0.0", "1.0.0-beta"], "1.0.0-beta", "1.0.0-beta"),
        ("1-beta", ["1.0.0", "1.0.0-beta"], "1.0.0-beta", "1.0.0-beta"),
        (">= 1.0-beta", ["1.0.0", "1.1.0", "2.0.0"], "2.0.0", ">= 1.0.0-beta"),
        # ~> keeps its precision: two parts written, so minor-only (upper bound 2.0.0)
        ("~> 1.0-beta", ["1.0.0", "1.1.0", "2.0.0"], "1.1.0", "~> 1.0-beta"),
        ("~> 1-beta", ["1.0.0-beta", "1.5.0"], "1.5.0", "~> 1.0-beta"),
    ],
)
def test_short_prerelease_is_zero_filled(text, available, expected, lock_form):
    assert select([text], available) == expected
    assert canonical(parse(text)) == lock_form


# ---------------------------------------------------------------------------------------------
# canonical(): the lock-file form (getproviders.VersionConstraintsString)
# ---------------------------------------------------------------------------------------------

CANONICAL = [
    ("", ""),
    ("1.2.3", "1.2.3"),
    ("= 1.2", "1.2.0"),
    ("=1.2.3", "1.2.3"),
    ("!=3.0.0", "!= 3.0.0"),
    ("> 2.5", "> 2.5.0"),
    (">= 3", ">= 3.0.0"),
    ("< 2", "< 2.0.0"),
    ("<=1.2", "<= 1.2.0"),
    ("~> 1", "~> 1.0"),
    ("~> 2", "~> 2.0"),
    ("~> 0", "~> 0.0"),
    ("~> 1.2", "~> 1.2"),
    ("~> 1.2.0", "~> 1.2.0"),
    ("~>1.2.0", "~> 1.2.0"),
    ("1.2.3+meta", "1.2.3+meta"),
    (">= 1.0.0-rc.1", ">= 1.0.0-rc.1"),
    # deduplication after zero-filling
    (">= 2, >= 2.0.0", ">= 2.0.0"),
    ("~> 1, ~> 1.0", "~> 1.0"),
    ("1.2.3, = 1.2.3", "1.2.3"),
    ("1.2, = 1.2.0, 1.2.0", "1.2.0"),
    # sorted by boundary...
    ("< 3.0, >= 1.0", ">= 1.0.0, < 3.0.0"),
    (">=1.0,<2.0", ">= 1.0.0, < 2.0.0"),
    (" >= 1.0 ,  < 1.2 ", ">= 1.0.0, < 1.2.0"),
    ("!= 1.5.0, ~> 1.0", "~> 1.0, != 1.5.0"),
    (">= 1.2, < 1.3, != 1.2.7", ">= 1.2.0, != 1.2.7, < 1.3.0"),
    ("!= 1.2.7, != 1.10.0, ~> 1.2", "~> 1.2, != 1.2.7, != 1.10.0"),
    ("< 1.10.0, >= 1.9.0", ">= 1.9.0, < 1.10.0"),
    ("1.0.0, 1.0.0-beta", "1.0.0-beta, 1.0.0"),
    ("> 1.0.0-rc.10, > 1.0.0-rc.9", "> 1.0.0-rc.9, > 1.0.0-rc.10"),
    ("> 1.0.0-beta, > 1.0.0-alpha", "> 1.0.0-alpha, > 1.0.0-beta"),
    ("~> 0.1.2, ~> 0.1", "~> 0.1, ~> 0.1.2"),
    # ...then by operator: > >= = ~>(patch) ~>(minor) <= < !=
    ("~> 1.2, ~> 1.2.0", "~> 1.2.0, ~> 1.2"),
    ("~> 1.2.0, ~> 1.2", "~> 1.2.0, ~> 1.2"),
    (
        "<= 2.0.0, < 2.0.0, > 2.0.0, >= 2.0.0, = 2.0.0, ~> 2.0.0, ~> 2.0, != 2.0.0",
        "> 2.0.0, >= 2.0.0, 2.0.0, ~> 2.0.0, ~> 2.0, <= 2.0.0, < 2.0.0, != 2.0.0",
    ),
    ("<= 1.5, < 1.5.0, != 1.5", "<= 1.5.0, < 1.5.0, != 1.5.0"),
    ("0.0.1, > 0.0.1", "> 0.0.1, 0.0.1"),
    # equal precedence: build metadata decides, an empty one first
    (">= 1.0.0+b, >= 1.0.0+a", ">= 1.0.0+a, >= 1.0.0+b"),
    (">= 1.0.0+b, >= 1.0.0", ">= 1.0.0, >= 1.0.0+b"),
    (">= 1.0.0, >= 1.0.0+a", ">= 1.0.0, >= 1.0.0+a"),
]


@pytest.mark.parametrize(("text", "expected"), CANONICAL)
def test_canonical(text, expected):
    assert canonical(parse(text)) == expected


@pytest.mark.parametrize(
    ("per_module", "expected"),
    [
        (["~> 1.2", ">= 1.0", "~> 1.2"], ">= 1.0.0, ~> 1.2"),
        (["~> 2", "~> 2.0.0", ">= 2"], ">= 2.0.0, ~> 2.0.0, ~> 2.0"),
        ([">= 1.0", "< 2.0", "~> 1.2.0"], ">= 1.0.0, ~> 1.2.0, < 2.0.0"),
        ([">= 1.0", "1.2.8-beta1"], ">= 1.0.0, 1.2.8-beta1"),
    ],
)
def test_canonical_of_merged_module_constraints(per_module, expected):
    assert canonical([term for text in per_module for term in parse(text)]) == expected


@pytest.mark.parametrize(("text", "expected"), [c for c in CANONICAL if "+" not in c[0]])
def test_canonical_ignores_input_order_and_is_idempotent(text, expected):
    terms = parse(text)
    for permutation in itertools.islice(itertools.permutations(terms), 50):
        assert canonical(list(permutation)) == expected
    assert canonical(parse(expected)) == expected
