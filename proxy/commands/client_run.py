"""Runs `lock` and `warm`, the commands that work through a running proxy, from parsed CLI arguments and prints
their summaries. Apart from `proxy.commands.run`, whose stores and bundles they do not need, and their arguments
checked before the client and the commands are imported: a mistake is answered at once (about half a second)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from proxy.commands import CommandError
from proxy.commands.terraform_config import ProjectConfigError, check_root_module
from proxy.domain.addresses import AddressError, Platform
from proxy.runtime.log import command_logging
from proxy.settings.config import ConfigError

if TYPE_CHECKING:
    from proxy.commands.proxy_api import ProxyClient

T = TypeVar("T")


async def dispatch(args: argparse.Namespace) -> int:
    """Run `lock` or `warm`, with its log at info (`command_logging`)."""
    with command_logging():
        return await (_lock(args) if args.command == "lock" else _warm(args))


async def _with_client(args: argparse.Namespace, work: Callable[[ProxyClient], Awaitable[T]]) -> T:
    """Run `work` with a client of the proxy; a proxy that cannot be used is one clear CommandError."""
    from proxy.commands.proxy_api import ProxyClient, ProxyUnreachableError  # aiohttp: once the arguments passed

    try:
        async with ProxyClient(args.proxy, args.ca_file, token=args.token) as client:
            return await work(client)
    except ProxyUnreachableError as exc:
        raise CommandError(str(exc)) from None


def _checked(args: argparse.Namespace) -> list[Platform]:
    """The platforms asked for, once the arguments are known good (ConfigError, exit 2, naming what is not)."""
    platforms = _platforms(args, required=True)
    if args.directory:
        _root_module(args.directory)
    if not args.proxy:
        raise ConfigError("--proxy URL is required (or REGISTRY_PROXY_PROXY): the running proxy's base URL")
    return platforms


def _platforms(args: argparse.Namespace, required: bool) -> list[Platform]:
    try:
        platforms = list(dict.fromkeys(Platform.parse(p) for p in args.platform))
    except AddressError as exc:
        raise ConfigError(f"--platform: {exc}") from None
    if required and not platforms:
        raise ConfigError("name at least one --platform OS_ARCH (e.g. linux_amd64)")
    return platforms


def _root_module(directory: str) -> Path:
    """The configuration directory `lock` or `warm` was given, refused (exit 2) before the proxy is asked when
    it is not one."""
    try:
        check_root_module(Path(directory))
    except ProjectConfigError as exc:
        raise ConfigError(str(exc)) from None
    return Path(directory)


async def _lock(args: argparse.Namespace) -> int:
    platforms = _checked(args)
    from proxy.commands.lock import run_lock

    entries = await _with_client(
        args,
        lambda client: run_lock(
            Path(args.directory), client, platforms, upgrade=args.upgrade, default_host=args.default_registry
        ),
    )
    for entry in entries.values():
        print(f"locked {entry.address} {entry.version} ({len(entry.hashes)} hashes)")
    print(f"wrote {Path(args.directory) / '.terraform.lock.hcl'} for {', '.join(map(str, platforms))}")
    return 0


async def _warm(args: argparse.Namespace) -> int:
    platforms = _checked(args)
    from proxy.commands.warm import run_warm

    report = await _with_client(
        args,
        lambda client: run_warm(
            client,
            platforms,
            directory=Path(args.directory) if args.directory else None,
            lock_file=Path(args.lock_file) if args.lock_file else None,
            jobs=args.jobs,
            default_host=args.default_registry,
        ),
    )
    print(
        f"warm: {len(report.done)} fetched ({report.bytes} bytes), {len(report.skipped)} skipped, "
        f"{len(report.refused)} refused by policy, {len(report.failed)} failed"
    )
    for name, reason in report.skipped.items():
        print(f"  skipped {name}: {reason}")
    for refusal in report.refused:
        print(f"  refused {refusal}", file=sys.stderr)
    for name, reason in report.failed.items():
        print(f"  FAILED {name}: {reason}", file=sys.stderr)
    return 1 if report.failed or report.refused else 0
