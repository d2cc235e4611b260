"""Runs `lock` and `warm`, the commands that work through a running proxy, from parsed CLI arguments and prints
their summaries. Apart from `proxy.commands.run`, whose stores and bundles they do not need; their arguments were
checked before (`proxy.commands.preflight`), and the client is imported only now."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from proxy.commands import CommandError, preflight
from proxy.runtime.log import command_logging
from proxy.runtime.progress import Progress

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


async def _lock(args: argparse.Namespace) -> int:
    platforms = preflight.platforms(args)  # checked before (`proxy.commands.preflight`)
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
    platforms = preflight.platforms(args)  # checked before (`proxy.commands.preflight`)
    from proxy.commands.warm import run_warm

    with Progress(args.command, "items", quiet=args.quiet) as progress:
        report = await _with_client(
            args,
            lambda client: run_warm(
                client,
                platforms,
                directory=Path(args.directory) if args.directory else None,
                lock_file=Path(args.lock_file) if args.lock_file else None,
                jobs=args.jobs,
                default_host=args.default_registry,
                progress=progress,
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
