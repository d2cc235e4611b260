"""How long after the metadata answer the real `terraform init` fetches what the answer lists.

The clients send no token when they download archives, `SHA256SUMS` and module packages, so the proxy
signs those URLs in the documents it gives an authorised client (grants, `proxy.identity.tokens.Grants`). A grant
must outlive the wait between the document and the download it allows, and no more. This measures
that wait with the real `terraform` (on PATH) against a real proxy process that requires client tokens,
installing many providers from a slow upstream (every metadata answer delayed, every archive trickling
in), through the network mirror and through `host` blocks (the registry protocol, where `SHA256SUMS` and
its signature are fetched with grants too):

```
.venv/bin/python bench/grant_window.py [--providers 12] [--delay 0.3] [--archive-seconds 1.0] [--fail-first]
```

`--fail-first` makes the first two upstream requests for each archive fail (500), so the proxy answers
502 and a client that retries does so (OpenTofu retries twice, after 1 s and 2 s, with
go-retryablehttp; Terraform 1.11 sends HEAD, then GET, then gives up: the init then fails, and the
report says so). The times come from the proxy's JSON access log: a request's start is its line's time
minus its duration; the wait is from the end of the metadata answer to the start of the download it
allows.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trustme

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.identity.tokens import hash_token
from tests.fakes.packages import Release
from tests.fakes.process import REGISTRY_HOST, TERRAFORM, ProxyProcess, Terraform
from tests.fakes.registry import FakeRegistry, Fault
from tests.fakes.signing import SigningKey

PLATFORM = "linux_amd64"
TOKEN = "rpt_bench_grant_window_0123456789"
CHUNK = 256 * 1024  # the fake registry's archive chunk
FAILURES = 2  # with --fail-first: the upstream's failed answers per archive before it serves it


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--providers", type=int, default=12, help="providers in the configuration")
    parser.add_argument("--delay", type=float, default=0.3, help="seconds every upstream answer waits")
    parser.add_argument("--archive-seconds", type=float, default=1.0, help="seconds each archive trickles in")
    parser.add_argument(
        "--fail-first",
        action="store_true",
        help=f"the first {FAILURES} upstream requests for each archive fail (500): the proxy answers 502",
    )
    return parser.parse_args(argv)


class FirstFails(dict):
    """The fake registry's faults: the paths counted in `failing` answer 500 that many times first."""

    def __init__(self, failing: dict[str, int]) -> None:
        super().__init__()
        self.failing = failing

    def get(self, path, default=None):
        if self.failing.get(path, 0) > 0:
            self.failing[path] -= 1
            return Fault(status=500, body=b'{"errors":["try again"]}')
        return super().get(path, default)


def main_tf(releases: list[Release]) -> str:
    required = "".join(
        f'    {r.type} = {{\n      source = "{REGISTRY_HOST}/{r.namespace}/{r.type}"\n      version = "{r.version}"\n'
        "    }\n"
        for r in releases
    )
    return f"terraform {{\n  required_providers {{\n{required}  }}\n}}\n"


def mirror_config(proxy: ProxyProcess) -> str:
    host = proxy.url.removeprefix("https://")
    return (
        f'provider_installation {{\n  network_mirror {{\n    url = "{proxy.url}/mirror/v1/"\n  }}\n}}\n'
        f'credentials "{host}" {{\n  token = "{TOKEN}"\n}}\n'
    )


def host_config(proxy: ProxyProcess) -> str:
    base = f"{proxy.url}/registry/{REGISTRY_HOST}"
    return (
        f'host "{REGISTRY_HOST}" {{\n  services = {{\n'
        f'    "providers.v1" = "{base}/providers/v1/"\n    "modules.v1" = "{base}/modules/v1/"\n  }}\n}}\n'
        f'credentials "{REGISTRY_HOST}" {{\n  token = "{TOKEN}"\n}}\n'
    )


def requests(proxy: ProxyProcess) -> list[tuple[str, float, float]]:
    """(path, start, end) of every request the proxy logged, in seconds since the epoch."""
    found = []
    for record in proxy.events("request"):
        end = dt.datetime.fromisoformat(record["timestamp"]).timestamp()
        found.append((record["path"], end - record["duration_ms"] / 1000, end))
    return found


def provider_of(path: str) -> tuple[str, str]:
    """NAMESPACE and TYPE of `/mirror/v1/H/NS/TYPE/…` or `/registry/H/providers/v1/NS/TYPE/…`."""
    parts = path.split("/")
    return (parts[4], parts[5]) if parts[1] == "mirror" else (parts[5], parts[6])


def waits(logged: list[tuple[str, float, float]], document: str, follows: str, last: bool = False) -> list[float]:
    """Per provider: from the end of the answer whose path ends with `document` to the start of the first
    (or `last`) request after it, for the same provider, whose path contains `follows`."""
    found = []
    for path, _, answered in logged:
        if not path.endswith(document):
            continue
        later = [
            start
            for other, start, _ in logged
            if provider_of(other) == provider_of(path) and follows in other and start >= answered - 0.001
        ]
        if later:
            found.append((max(later) if last else min(later)) - answered)
    return found


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name:<46} no pairs found"
    return (
        f"{name:<46} n={len(values):>3}  median {statistics.median(values) * 1000:8.1f} ms"
        f"  max {max(values) * 1000:8.1f} ms"
    )


async def run(args: argparse.Namespace, root: Path) -> list[str]:
    key = SigningKey(root / "gpg", "Grant Window Signer")
    ca = trustme.CA()
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(upstream_ssl)
    registry = FakeRegistry(upstream_ssl)
    failing: dict[str, int] = {}
    if args.fail_first:
        registry.faults = FirstFails(failing)
    releases = [
        registry.add(Release("acme", f"p{index:02d}", "1.0.0", key, platforms=(PLATFORM,), noise=1024 * 1024))
        for index in range(args.providers)
    ]
    chunks = max(1, -(-len(releases[0].zips[PLATFORM]) // CHUNK))
    registry.archive_chunk_delay = args.archive_seconds / chunks
    for release in releases:
        base = f"/v1/providers/acme/{release.type}"
        files = f"/files/acme/{release.type}/{release.version}"
        for path in (
            f"{base}/versions",
            f"{base}/{release.version}/download/linux/amd64",
            f"{files}/{release.shasums_name}",
            f"{files}/{release.shasums_name}.sig",
            registry.archive_path(release, PLATFORM),
        ):
            registry.faults[path] = Fault(delay=args.delay)
    await registry.start()
    archives = {registry.archive_path(release, PLATFORM) for release in releases}
    tokens = root / "tokens.toml"
    tokens.write_text(f'[tokens.ci]\nhash = "{hash_token(TOKEN)}"\nhosts = ["{REGISTRY_HOST}"]\n')
    terraform = Terraform(root / "tf")
    lines = [
        f"terraform init of {args.providers} providers; every upstream answer waits {args.delay}s, every "
        f"archive ({len(releases[0].zips[PLATFORM]) // 1024} KiB) trickles in over {args.archive_seconds}s"
        + (f"; the first {FAILURES} upstream requests for each archive fail" if args.fail_first else "")
    ]
    try:
        for name, config in (("network mirror", mirror_config), ("host blocks", host_config)):
            failing.update(dict.fromkeys(archives, FAILURES) if args.fail_first else {})
            proxy = ProxyProcess(root / name.replace(" ", "-"), registry.url, ca_file, "--auth-tokens", str(tokens))
            await proxy.start()
            try:
                workdir = terraform.workdir(name.replace(" ", "-"), main_tf(releases))
                started = time.monotonic()
                code, output = await terraform.init(workdir, config(proxy), proxy.ca_file)
                took = time.monotonic() - started
                logged = requests(proxy)
                if code != 0 and not args.fail_first:
                    raise RuntimeError(f"terraform init through the {name} failed:\n{output}")
            finally:
                await proxy.stop()
            lines.append(f"{name}: init took {took:.1f}s" + (f", failed (exit code {code})" if code else ""))
            document = "1.0.0.json" if name == "network mirror" else "/download/linux/amd64"
            if name == "host blocks":
                lines.append(summary("  document -> SHA256SUMS requested", waits(logged, document, "SHA256SUMS")))
            lines.append(summary("  document -> archive requested", waits(logged, document, ".zip")))
            if args.fail_first:
                lines.append(summary("  document -> last archive request", waits(logged, document, ".zip", last=True)))
                tries = [len([p for p, _, _ in logged if p.endswith(a.rpartition("/")[2])]) for a in archives]
                lines.append(f"  archive requests per provider (HEAD and GET): {sorted(set(tries))}")
    finally:
        await registry.stop()
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if TERRAFORM is None:
        print("terraform NOT FOUND on PATH: nothing measured", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="grant-window-") as root:
        for line in asyncio.run(run(args, Path(root))):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
