"""Unit tests for proxy.domain.lockfile: rendering, parsing and trust-on-first-use hash merging.

The golden files under tests/data/lockfiles/ were written by Terraform 1.11.4 itself
(`terraform init` against a local filesystem mirror; the `zh:` hashes of one_provider were
seeded into an existing lock file, which `init` then rewrote). render() must reproduce them
byte for byte so that a following `terraform init` finds nothing to change.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from proxy.domain.lockfile import HEADER, LockedProvider, LockFileError, merge_hashes, parse_lockfile, render

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "lockfiles"

AWS = "registry.terraform.io/hashicorp/aws"
AWS_H1 = "h1:plfqEaldQaPUoF12PdEjn9pFPuvB1haQg6CSzg2Vuok="
ZH_0A = "zh:0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5061728394a5b6c7d8e9f"
ZH_F3 = "zh:f3a2b6c1d9e8470a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2"


def golden(name: str) -> str:
    return (GOLDEN / name).read_bytes().decode("utf-8")


def entries(*providers: LockedProvider) -> dict[str, LockedProvider]:
    return {p.address: p for p in providers}


ONE_PROVIDER = entries(LockedProvider(AWS, "5.40.0", "~> 5.0", [ZH_F3, AWS_H1, ZH_0A]))

TWO_PROVIDERS = entries(  # deliberately not in address order
    LockedProvider(
        "registry.terraform.io/hashicorp/random", "3.6.0", "", ["h1:7+3+Tkx2O8Jeuorc1bfvz8PbHm6r+BGZq+J2cBQz+3c="]
    ),
    LockedProvider(
        "registry.opentofu.org/integrations/github",
        "6.2.1",
        ">= 6.0.0, < 7.0.0",
        ["h1:uzp5owknZ1dpDhNJtpa7+0a3mYN/l0AXiY0H7QdHyzo="],
    ),
)

IDNA_HOST = entries(
    LockedProvider("münchen.de/acme/cloud", "1.2.3", "1.2.3", ["h1:7/WX1tFjIf5vqvMeMidUEeA8FazndHZN7APLjiSi41w="]),
)

# Terraform orders blocks by provider (hostname in its ASCII/punycode comparison form, then
# namespace, then type), not by the address string: "example.com" before "example.com.au",
# "acme" before "acme-x", and "münchen.de" (xn--mnchen-3ya.de) after "registry.terraform.io".
SORT_ORDER = entries(
    LockedProvider("münchen.de/acme/cloud", "1.2.3", "", ["h1:7/WX1tFjIf5vqvMeMidUEeA8FazndHZN7APLjiSi41w="]),
    LockedProvider("example.com.au/acme/thing", "1.0.0", "", ["h1:ni56YgO80u9/yTDdA+MutjxvBnyzSHDgliKTskbKVIU="]),
    LockedProvider(AWS, "5.40.0", "5.40.0", [AWS_H1]),
    LockedProvider("example.com/acme-x/thing", "1.0.0", "", ["h1:+dfmjn3qdzsN/oIS1RRbi88h2CIx6EzOnmfob4UjR5I="]),
    LockedProvider("example.com/acme/thing-x", "1.0.0", "", ["h1:8d7hVP75dqbWEc1PPPrj3BnkKvROYyQvahf8C4eKgJc="]),
    LockedProvider("example.com/acme/thing", "1.0.0", "", ["h1:oJZ0IBrn0bVRHFQ2JXMYGUS6Llfdjo8HphwzxfNo+0E="]),
)

GOLDEN_CASES = [
    ("one_provider.lock.hcl", ONE_PROVIDER),
    ("two_providers.lock.hcl", TWO_PROVIDERS),
    ("idna_host.lock.hcl", IDNA_HOST),
    ("sort_order.lock.hcl", SORT_ORDER),
]


# ---------------------------------------------------------------------------------------------
# render()
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "providers"), GOLDEN_CASES, ids=[c[0] for c in GOLDEN_CASES])
def test_render_matches_terraform_golden_file(name, providers):
    assert render(providers) == golden(name)


def test_golden_files_have_terraform_layout():
    # The goldens themselves, checked line by line against the format `terraform init` writes.
    text = golden("one_provider.lock.hcl")
    assert text.splitlines(keepends=True) == [
        '# This file is maintained automatically by "terraform init".\n',
        "# Manual edits may be lost in future updates.\n",
        "\n",
        f'provider "{AWS}" {{\n',
        '  version     = "5.40.0"\n',
        '  constraints = "~> 5.0"\n',
        "  hashes = [\n",
        f'    "{AWS_H1}",\n',
        f'    "{ZH_0A}",\n',
        f'    "{ZH_F3}",\n',
        "  ]\n",
        "}\n",
    ]
    unconstrained = golden("two_providers.lock.hcl")
    assert '\n  version = "3.6.0"\n  hashes = [\n' in unconstrained
    assert unconstrained.count("\n\nprovider ") == 2


def test_render_empty_is_just_the_header():
    assert render({}) == HEADER
    assert HEADER == (
        '# This file is maintained automatically by "terraform init".\n# Manual edits may be lost in future updates.\n'
    )


def test_render_sorts_and_deduplicates_hashes():
    text = render(entries(LockedProvider(AWS, "1.0.0", "", ["zh:b", "h1:a", "zh:b", "zh:a"])))
    assert text.endswith('  hashes = [\n    "h1:a",\n    "zh:a",\n    "zh:b",\n  ]\n}\n')


def test_render_keeps_unicode_host_unescaped():
    text = render(IDNA_HOST)
    assert 'provider "münchen.de/acme/cloud" {\n' in text
    assert "\\u" not in text and "xn--" not in text


def test_render_does_not_modify_its_input():
    providers = entries(LockedProvider(AWS, "5.40.0", "~> 5.0", [ZH_F3, AWS_H1, ZH_F3]))
    render(providers)
    assert providers[AWS].hashes == [ZH_F3, AWS_H1, ZH_F3]


# ---------------------------------------------------------------------------------------------
# parse_lockfile()
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "providers"), GOLDEN_CASES, ids=[c[0] for c in GOLDEN_CASES])
def test_parse_golden_file(name, providers):
    expected = {a: replace(p, hashes=sorted(set(p.hashes))) for a, p in providers.items()}
    assert parse_lockfile(golden(name)) == expected


@pytest.mark.parametrize(
    "providers",
    [
        {},
        ONE_PROVIDER,
        TWO_PROVIDERS,
        IDNA_HOST,
        SORT_ORDER,
        entries(LockedProvider(AWS, "1.0.0-beta.1", "~> 1.0-beta, != 1.0.5", [])),
        entries(LockedProvider("example.com:8443/acme/thing", "0.0.1", ">= 0.0.1, < 1.0.0", ["zh:00"])),
    ],
)
def test_round_trip(providers):
    normalised = {a: replace(p, hashes=sorted(set(p.hashes))) for a, p in providers.items()}
    assert parse_lockfile(render(providers)) == normalised
    assert render(parse_lockfile(render(providers))) == render(providers)


HAND_WRITTEN = """\
# A lock file edited by hand.
// Comments of every kind, odd spacing, hashes unsorted and repeated.

provider "registry.terraform.io/hashicorp/aws" {
    version="5.40.0"   # trailing comment
  constraints    =   "~> 5.0"
  /* a block
     comment */
  hashes = [ "zh:bbb", "h1:aaa",
     "zh:bbb" ]
}


provider "registry.terraform.io/hashicorp/random"   {
version = "3.6.0"
}
provider "registry.terraform.io/hashicorp/null" { version = "3.2.2" }
"""


def test_parse_hand_written_file():
    assert parse_lockfile(HAND_WRITTEN) == entries(
        LockedProvider(AWS, "5.40.0", "~> 5.0", ["h1:aaa", "zh:bbb"]),
        LockedProvider("registry.terraform.io/hashicorp/random", "3.6.0", "", []),
        LockedProvider("registry.terraform.io/hashicorp/null", "3.2.2", "", []),
    )


@pytest.mark.parametrize("text", ["", "\n", HEADER, "# only a comment\n"])
def test_parse_file_without_providers(text):
    assert parse_lockfile(text) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("provider {", "cannot parse HCL"),
        ('provider "a/b/c" { version = }', "cannot parse HCL"),
        ('"unterminated', "cannot parse HCL"),
        ('provider "a/b/c" {\n  version = "1.0.0"\n', "cannot parse HCL"),
        ('provider "a/b/c" {\n  hashes = ["h1:x"]\n}\n', "has no version"),
        ('provider "a/b/c" {\n}\n', "has no version"),
        ('provider "a/b/c" {\n  version = 5\n}\n', "has no version"),
        ('provider "a/b/c" {\n  version = ["1.0.0"]\n}\n', "has no version"),
        ('provider "a/b/c" {\n  version = "1.0.0"\n  hashes = "h1:x"\n}\n', "invalid hashes"),
        ('provider "a/b/c" {\n  version = "1.0.0"\n  hashes = { a = "b" }\n}\n', "invalid hashes"),
        ('provider "a/b/c" {\n  version = "1.0.0"\n  hashes = ["h1:x", 2]\n}\n', "invalid hashes"),
    ],
)
def test_parse_errors(text, message):
    with pytest.raises(LockFileError, match=message) as info:
        parse_lockfile(text, "some/dir/.terraform.lock.hcl")
    assert "some/dir/.terraform.lock.hcl" in str(info.value)


# ---------------------------------------------------------------------------------------------
# merge_hashes(): trust on first use
# ---------------------------------------------------------------------------------------------

LOCKED = LockedProvider(AWS, "1.0.0", ">= 1.0.0", ["h1:a", "zh:b"])


@pytest.mark.parametrize(
    ("locked", "version", "new", "expected"),
    [
        # new entry: the new hashes, sorted and deduplicated
        (None, "1.0.0", ["zh:b", "h1:a", "zh:b"], ["h1:a", "zh:b"]),
        (None, "1.0.0", [], []),
        # same version, overlapping: union
        (LOCKED, "1.0.0", ["zh:b", "zh:c"], ["h1:a", "zh:b", "zh:c"]),
        (LOCKED, "1.0.0", ["zh:c", "h1:a"], ["h1:a", "zh:b", "zh:c"]),
        (LOCKED, "1.0.0", ["h1:a"], ["h1:a", "zh:b"]),
        (LOCKED, "1.0.0", ["zh:b", "h1:a"], ["h1:a", "zh:b"]),
        # different version: replaced outright
        (LOCKED, "2.0.0", ["zh:y", "h1:x"], ["h1:x", "zh:y"]),
        (LOCKED, "0.9.0", ["h1:a"], ["h1:a"]),
        # existing entry without hashes: the new ones
        (replace(LOCKED, hashes=[]), "1.0.0", ["zh:y", "h1:z"], ["h1:z", "zh:y"]),
    ],
)
def test_merge_hashes(locked, version, new, expected):
    assert merge_hashes(locked, version, new) == expected


@pytest.mark.parametrize("new", [["zh:x"], ["h1:x", "zh:y"], ["H1:a"]])
def test_merge_hashes_refuses_disjoint_hashes_for_the_locked_version(new):
    with pytest.raises(LockFileError) as info:
        merge_hashes(LOCKED, "1.0.0", new)
    assert AWS in str(info.value) and "1.0.0" in str(info.value)


def test_merge_hashes_does_not_modify_the_locked_entry():
    locked = LockedProvider(AWS, "1.0.0", "", ["zh:b", "h1:a"])
    merge_hashes(locked, "1.0.0", ["zh:c", "h1:a"])
    assert locked.hashes == ["zh:b", "h1:a"]
