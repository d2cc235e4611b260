"""The checks of a command's own arguments (its options are checked as they are read, `proxy.settings`), made
before the command's modules are imported: a mistake is one line naming the argument, exit 2, in about half a
second, and nothing is made or asked for."""

from __future__ import annotations

import argparse
from pathlib import Path

from proxy.commands.terraform_config import ProjectConfigError, check_root_module
from proxy.domain.addresses import AddressError, Platform
from proxy.settings.config import ConfigError

BUNDLE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst")


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse (ConfigError) the arguments of `lock`, `warm`, `export` or `import` that cannot work."""
    if args.command in ("lock", "warm"):
        platforms(args)
        if args.directory:
            _root_module(Path(args.directory))
        if not args.proxy:
            raise ConfigError("--proxy URL is required (or REGISTRY_PROXY_PROXY): the running proxy's base URL")
    elif args.command == "export":
        out = export_destination(args)
        if args.format == "filesystem-mirror":
            check_mirror_directory(out)
        else:
            check_bundle_out(out)
    elif args.command == "import":
        if not args.trust_key and not args.trust_bundle_keys:
            raise ConfigError(
                "name the signing keys to trust: --trust-key FINGERPRINT (printed by `export`), "
                "or --trust-bundle-keys to accept the keys the bundle carries"
            )
        bundle = Path(args.bundle)
        if not bundle.is_file():
            raise ConfigError(f"bundle {bundle}: {'is a directory' if bundle.is_dir() else 'no such file'}")


def platforms(args: argparse.Namespace) -> list[Platform]:
    """The `--platform`s of `lock` or `warm`, at least one (ConfigError)."""
    try:
        found = list(dict.fromkeys(Platform.parse(p) for p in args.platform))
    except AddressError as exc:
        raise ConfigError(f"--platform: {exc}") from None
    if not found:
        raise ConfigError("name at least one --platform OS_ARCH (e.g. linux_amd64)")
    return found


def _root_module(directory: Path) -> None:
    try:
        check_root_module(directory)
    except ProjectConfigError as exc:
        raise ConfigError(str(exc)) from None


def export_destination(args: argparse.Namespace) -> Path:
    """`export`'s destination, `--out PATH` or the last argument, exactly one of them (then `args.out`)."""
    given = [path for path in (args.out, args.destination) if path]
    if len(given) != 1:
        raise ConfigError(
            "export: give the destination once, as --out FILE|DIR or as the last argument"
            + (f" (given twice: {' and '.join(given)})" if given else "")
        )
    args.out = given[0]
    return Path(given[0])


def check_mirror_directory(out: Path) -> None:
    """Refuse (ConfigError) an `export --format filesystem-mirror` destination that exists and is not a
    directory (a missing one is made)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: not a directory (a filesystem mirror is written into a directory)")


def check_bundle_out(out: Path) -> None:
    """Refuse (ConfigError) an `export --out` whose suffix says no format the bundle can be written in, or
    whose directory is not there."""
    if out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; name the bundle file, e.g. {out / 'bundle.tar.zst'}")
    if not out.name.endswith(BUNDLE_SUFFIXES) or out.name in BUNDLE_SUFFIXES:
        raise ConfigError(
            f"--out {out.name!r}: unknown bundle format; name it NAME.tar, NAME.tar.gz (or .tgz) or NAME.tar.zst"
        )
    directory = out.absolute().parent
    if not directory.is_dir():
        raise ConfigError(f"--out {out}: no such directory {directory}: create it first")
