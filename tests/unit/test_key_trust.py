"""Signing-key continuity, pure: the policy's `key-change`, `[[pin]]` and `default-pins`, the shipped HashiCorp pin
(matched by the fingerprint gpg reads from HashiCorp's real published key), the record of a provider's keys and
the verdicts on a release's key."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.governance.key_trust import (
    DEFAULT_PINS,
    HASHICORP_FINGERPRINT,
    UNREADABLE,
    KeyChange,
    KeyRecord,
    KnownKey,
    judge,
    read_key_record,
)
from proxy.governance.policy import PolicyError, parse_policy
from proxy.providers.signatures import Keyring

# HashiCorp's release key as Terraform embeds it (`HashicorpPublicKey`, hashicorp/terraform
# internal/getproviders/public_keys.go; also published at https://www.hashicorp.com/security).
HASHICORP_KEY = Path(__file__).parents[1] / "data" / "hashicorp-public-key.asc"
OLD = "A" * 40
NEW = "B" * 40


def test_the_shipped_pin_is_hashicorps_published_key_read_by_gpg(tmp_path):
    ring = Keyring(tmp_path / "keyring")
    try:
        fingerprints = ring.import_keys([HASHICORP_KEY.read_text()])
    finally:
        ring.close()
    assert fingerprints == {HASHICORP_FINGERPRINT} == {"C874011F0AB405110D02105534365D9472D7468F"}
    policy = parse_policy("", "policy.toml")  # no pin of its own: the shipped one is in force
    official = "registry.terraform.io/hashicorp/aws"
    assert policy.keys.pin_for(official) is DEFAULT_PINS[0]
    assert judge(policy.keys, official, HASHICORP_FINGERPRINT, None, unreadable=False).kind == "pinned"
    refused = judge(policy.keys, official, NEW, None, unreadable=False)
    assert (refused.kind, refused.refused, refused.pin.name) == ("unpinned", True, "hashicorp-official")
    assert policy.keys.pin_for("registry.terraform.io/acme/aws") is None  # other namespaces are not pinned
    assert policy.keys.pin_for("registry.opentofu.org/hashicorp/aws") is None  # nor other registries


def test_default_pins_false_switches_the_shipped_pin_off():
    policy = parse_policy("default-pins = false\n", "policy.toml")
    assert policy.keys.pin_for("registry.terraform.io/hashicorp/aws") is None


def test_a_pin_of_the_file_comes_before_the_shipped_one_and_takes_full_fingerprints():
    policy = parse_policy(
        'key-change = "hold"\n[[pin]]\nname = "mirror-of-hashicorp"\n'
        'providers = ["registry.terraform.io/hashicorp/*"]\n'
        f'keys = ["{OLD.lower()}", "{" ".join(NEW[i : i + 4] for i in range(0, 40, 4))}"]\nreason = "our re-signer"\n',
        "policy.toml",
    )
    pin = policy.keys.pin_for("registry.terraform.io/hashicorp/aws")
    assert pin is not None and pin.name == "mirror-of-hashicorp" and pin.keys == {OLD, NEW}
    assert policy.keys.key_change == "hold"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('key-change = "refuse"\n', '\'key-change\': must be "hold", "warn" or "allow"'),
        ('default-pins = "no"\n', "'default-pins': must be true or false"),
        ('[[pin]]\nname = "p"\nproviders = ["*/*/*"]\nkeys = ["34365D9472D7468F"]\n', "not a full fingerprint"),
        ('[[pin]]\nname = "p"\nproviders = ["acme/*"]\nkeys = ["' + OLD + '"]\n', "HOST/NAMESPACE/TYPE globs"),
        ('[[pin]]\nname = "p"\nproviders = ["*/*/*"]\n', "'keys': must be a list"),
        ('[[pin]]\nname = "p"\nproviders = ["*/*/*"]\nkeys = ["' + OLD + '"]\nkey = 1\n', "unknown key 'key'"),
        ("pin = 3\n", "write each pin as a [[pin]] table"),
    ],
)
def test_malformed_key_trust_is_one_policy_error_naming_the_key(text, says):
    with pytest.raises(PolicyError, match=r"^policy\.toml: ") as raised:
        parse_policy(text, "policy.toml")
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_verdicts_trust_the_first_key_and_decide_a_new_one_by_key_change():
    policy = parse_policy('key-change = "hold"\n', "p")
    address = "registry.example.test/acme/foo"
    record = KeyRecord().with_known(OLD, KnownKey("AAAAAAAAAAAAAAAA", 1.0, "1.0.0"))
    assert judge(policy.keys, address, OLD, None, unreadable=False).kind == "first"
    assert judge(policy.keys, address, OLD, record, unreadable=False).kind == "known"
    changed = judge(policy.keys, address, NEW, record, unreadable=False)
    assert (changed.kind, changed.decision, changed.old) == ("changed", "hold", ("AAAAAAAAAAAAAAAA",))
    assert judge(parse_policy("", "p").keys, address, NEW, record, unreadable=False).decision == "warn"  # default
    forged = judge(policy.keys, address, OLD, None, unreadable=True)  # never "first": fail closed
    assert (forged.kind, forged.decision, forged.old) == ("changed", "hold", (UNREADABLE,))


def test_the_record_round_trips_and_names_held_keys_by_key_id():
    record = (
        KeyRecord()
        .with_known(OLD, KnownKey(OLD[-16:], 1.0, "1.0.0"))
        .with_held(NEW, KnownKey(NEW[-16:], 2.0, "1.2.0"))
        .with_change(KeyChange(2.0, "1.2.0", (OLD[-16:],), NEW[-16:], NEW, "hold"))
    )
    assert read_key_record(record.encode()) == record
    assert record.resolve(NEW[-16:].lower()) == NEW and record.resolve(NEW) == NEW
    assert record.resolve("ABCDEF") is None  # too short to name a key
    accepted = record.with_known(NEW, KnownKey(NEW[-16:], 3.0, "1.2.0", "cli:alice"))
    assert NEW not in accepted.held and accepted.known[NEW].accepted_by == "cli:alice"
    assert read_key_record(b'{"v": 1}') is None and read_key_record(None) is None


def test_policy_check_lists_key_change_and_the_pins_in_force(tmp_path, capsys):
    from proxy.cli import main

    path = tmp_path / "policy.toml"
    path.write_text(f'key-change = "hold"\n[[pin]]\nname = "acme"\nproviders = ["*/acme/*"]\nkeys = ["{OLD}"]\n')
    assert main(["policy", "check", str(path)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "key-change: hold" in printed
    assert f"pin acme: */acme/* signed by {OLD}" in printed
    assert f"pin hashicorp-official: registry.terraform.io/hashicorp/* signed by {HASHICORP_FINGERPRINT}" in printed


def test_policy_explain_says_how_a_providers_signing_keys_are_decided(tmp_path, capsys):
    from proxy.cli import main

    path = tmp_path / "policy.toml"
    path.write_text('key-change = "hold"\n')
    assert main(["policy", "explain", "--policy", str(path), "registry.terraform.io/hashicorp/aws@5.0.0"]) == 0
    assert f"signing keys: pinned by hashicorp-official to {HASHICORP_FINGERPRINT}" in capsys.readouterr().out
    assert main(["policy", "explain", "--policy", str(path), "registry.terraform.io/acme/foo"]) == 0
    assert "signing keys: key-change = hold" in capsys.readouterr().out
