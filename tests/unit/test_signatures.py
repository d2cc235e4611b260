"""Unit tests for proxy.providers.signatures.Keyring with the real gpg binary: which detached signatures it accepts."""

from __future__ import annotations

import pytest

from proxy.providers.signatures import Keyring, SignatureError, SignatureResult
from tests.fakes.signing import SigningKey

DATA = b"0123abcd  terraform-provider-foo_1.0.0_linux_amd64.zip\n"
LONG_AGO = "20200101T000000"


@pytest.fixture
def keyring(tmp_path):
    ring = Keyring(tmp_path / "keyring")
    yield ring
    ring.close()


@pytest.fixture(scope="module")
def expired_key(tmp_path_factory):
    key = SigningKey(
        tmp_path_factory.mktemp("gpg-expired"), "Expired Signer", algorithm="ed25519", expires="1d", made_at=LONG_AGO
    )
    yield key
    key.close()


@pytest.fixture(scope="module")
def revoked_key(tmp_path_factory):
    """A revoked key and its signature over DATA, made before the revocation."""
    key = SigningKey(tmp_path_factory.mktemp("gpg-revoked"), "Revoked Signer", algorithm="ed25519")
    signature = key.sign(DATA)
    key.revoke()
    yield key, signature
    key.close()


def test_good_signature_names_its_key(keyring, signing_key):
    result = keyring.verify_detached(DATA, signing_key.sign(DATA), [signing_key.armored_public_key])
    assert result == SignatureResult(key_id=signing_key.key_id, fingerprint=signing_key.fingerprint)


def test_good_signature_among_several_keys_and_junk(keyring, signing_key, other_key):
    keys = ["not a key", other_key.armored_public_key, signing_key.armored_public_key]
    result = keyring.verify_detached(DATA, signing_key.sign(DATA), keys)
    assert result.fingerprint == signing_key.fingerprint


def test_signature_over_other_data_is_refused(keyring, signing_key):
    with pytest.raises(SignatureError, match="signature verification failed"):
        keyring.verify_detached(DATA + b"tampered", signing_key.sign(DATA), [signing_key.armored_public_key])


def test_signature_by_a_key_not_handed_in_is_refused(keyring, signing_key, other_key):
    with pytest.raises(SignatureError, match=f"unknown key {other_key.key_id}"):
        keyring.verify_detached(DATA, other_key.sign(DATA), [signing_key.armored_public_key])


def test_a_key_imported_for_another_check_never_vouches(keyring, signing_key, other_key):
    """Both keys end up in the one keyring; only the keys of this check count."""
    keyring.verify_detached(DATA, other_key.sign(DATA), [other_key.armored_public_key])
    with pytest.raises(SignatureError, match="not among the upstream's signing keys"):
        keyring.verify_detached(DATA, other_key.sign(DATA), [signing_key.armored_public_key])


@pytest.mark.parametrize(
    "keys",
    [
        [],
        [""],
        ["-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nnot base64 at all\n-----END PGP PUBLIC KEY BLOCK-----\n"],
        ["-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGVhbGxvd29ybGQ=\n=AAAA\n-----END PGP PUBLIC KEY BLOCK-----\n"],
    ],
)
def test_no_readable_key_is_refused(keyring, signing_key, keys):
    with pytest.raises(SignatureError, match="none of the upstream's signing keys could be read"):
        keyring.verify_detached(DATA, signing_key.sign(DATA), keys)


def test_a_truncated_key_is_not_read(keyring, signing_key):
    armored = signing_key.armored_public_key
    with pytest.raises(SignatureError, match="could be read"):
        keyring.verify_detached(DATA, signing_key.sign(DATA), [armored[: len(armored) // 2]])


@pytest.mark.parametrize("signature", [b"", b"not a signature", b"\x89\x01\x33" + b"\x00" * 300])
def test_garbage_signature_is_refused(keyring, signing_key, signature):
    with pytest.raises(SignatureError, match="signature verification failed"):
        keyring.verify_detached(DATA, signature, [signing_key.armored_public_key])


def test_signature_by_an_expired_key_is_accepted_as_the_clients_accept_it(keyring, expired_key):
    result = keyring.verify_detached(DATA, expired_key.sign(DATA), [expired_key.armored_public_key])
    assert result.fingerprint == expired_key.fingerprint


def test_signature_by_a_revoked_key_is_refused(keyring, revoked_key):
    key, signature = revoked_key
    with pytest.raises(SignatureError, match="revoked"):
        keyring.verify_detached(DATA, signature, [key.armored_public_key])


def test_a_key_block_is_imported_once_then_verifies_with_one_gpg_run(keyring, signing_key, monkeypatch):
    keys = [signing_key.armored_public_key]
    keyring.import_quietly(keys)  # as the mirror does while it fetches SHA256SUMS and its signature
    imports = []
    real_import = keyring._gpg.import_keys
    monkeypatch.setattr(keyring._gpg, "import_keys", lambda armor: imports.append(armor) or real_import(armor))
    result = keyring.verify_detached(DATA, signing_key.sign(DATA), keys)
    assert result.fingerprint == signing_key.fingerprint
    assert imports == []


def test_keys_the_keyring_lost_are_imported_again(keyring, signing_key):
    keys = [signing_key.armored_public_key]
    keyring.verify_detached(DATA, signing_key.sign(DATA), keys)
    keyring._gpg.delete_keys(signing_key.fingerprint)  # e.g. the keyring was replaced under the proxy
    assert keyring.verify_detached(DATA, signing_key.sign(DATA), keys).fingerprint == signing_key.fingerprint


def test_an_early_import_failure_is_left_to_the_verification(keyring, signing_key):
    keyring.import_quietly(["not a key"])
    with pytest.raises(SignatureError, match="none of the upstream's signing keys could be read"):
        keyring.verify_detached(DATA, signing_key.sign(DATA), ["not a key"])
