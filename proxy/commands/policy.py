"""`registry-proxy policy check FILE` and `registry-proxy policy explain ADDRESS[@VERSION]`: the policy offline."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from proxy.domain.addresses import AddressError, ModuleAddr, Platform, ProviderAddr, Version
from proxy.governance.gatekeeper import explain, load_policy, subject_of
from proxy.governance.policy import FIRST_LISTING, Policy, PolicyError, ReleaseTime, describe
from proxy.settings.config import ConfigError, declared
from proxy.settings.values import parse_duration


def run(args: argparse.Namespace) -> int:
    if args.policy_command == "check":
        policy = _load(args.file)
        for line in describe(policy):
            print(line)
        for line in policy.keys.describe():  # signing keys: key-change and the pins in force
            print(line)
        print(f"{args.file}: OK")
        return 0
    if not args.policy_path:
        option = declared("--policy")
        raise ConfigError(f"policy explain needs the policy file: {option.flag} FILE or {option.env_name}")
    policy = _load(args.policy_path)
    address, _, version_text = args.address.partition("@")
    try:
        parts = address.split("/")
        if len(parts) == 3:
            addr: ProviderAddr | ModuleAddr = ProviderAddr.parse(*parts)
        elif len(parts) == 4:
            addr = ModuleAddr.parse(*parts)
        else:
            raise AddressError(f"{address!r}: expected HOST/NAMESPACE/TYPE or HOST/NAMESPACE/NAME/SYSTEM")
        version = Version.parse(version_text) if version_text else None
        platform = str(Platform.parse(args.platform)) if args.platform else None
    except AddressError as exc:
        raise ConfigError(str(exc)) from None
    now = time.time()
    subject = subject_of(addr, version, platform)
    scopes = tuple(args.scope or ())
    asker = args.client + (f" (scopes {', '.join(scopes)})" if scopes else "")
    print(f"{subject.kind} {subject} asked for by {asker}, policy {args.policy_path} ({policy.mode} mode):")
    for line in explain(policy, subject, args.client, _released(args, now), now, scopes):
        print(f"  {line}")
    if isinstance(addr, ProviderAddr):
        print(f"  signing keys: {_key_trust(policy, str(addr))}")
    return 0


def _key_trust(policy: Policy, address: str) -> str:
    """What the policy says about the signing keys of the provider `address`."""
    pin = policy.keys.pin_for(address)
    if pin is not None:
        return f"pinned by {pin.name} to {', '.join(sorted(pin.keys))} (any other key, or none, is refused)"
    return f"key-change = {policy.keys.key_change} (a key never seen for the provider, after another)"


def _released(args: argparse.Namespace, now: float) -> ReleaseTime | None:
    """What the version's age counts from, as given: first seen `--age` ago, published `--published` ago."""
    if not args.age and not args.published:
        return None
    try:
        first_seen = now - parse_duration(args.age) if args.age else FIRST_LISTING
        published = now - parse_duration(args.published) if args.published else None
    except ValueError as exc:
        raise ConfigError(f"--age/--published: {exc}") from None
    return ReleaseTime(first_seen, published, "the upstream's publish time given with --published")


def _load(path: str) -> Policy:
    try:
        return load_policy(Path(path))
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
