"""Issue 31, item 3: a running proxy backed up under load, its data dir wiped and restored, serves `terraform init`
with the upstream down, and every restored record opens with the restored secret.

The proxy is `python -m proxy serve` (its own process: the backup reads the SQLite file another process writes). While
`registry-proxy backup --archives` runs, clients read through it (version lists, documents, an archive) and it
fetches, verifies and records versions it has not seen. Then it is stopped, its data dir removed, the backup
restored into it, and the proxy started again (in the test's process) with no upstream: the fake registry is
stopped and no `--upstream-map` is given. `terraform init` trusts the CA the first proxy generated (a copy taken
before the wipe), so it only succeeds if the restored CA and key are that one.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import ssl

import aiohttp
import pytest

from proxy.metadata_store.keys import FLEET_SECRET
from proxy.metadata_store.sealed import unseal
from tests.conftest import PROVIDER
from tests.e2e.test_network_mirror_e2e import MAIN_TF, mirror_config
from tests.fakes.packages import Release
from tests.fakes.process import registry_proxy_in_process

pytestmark = pytest.mark.e2e

NEW_VERSIONS = tuple(f"2.{minor}.0" for minor in range(10))  # fetched (written) one by one while the backup runs
READS = (
    f"/mirror/v1/{PROVIDER}/index.json",
    f"/mirror/v1/{PROVIDER}/1.0.0.json",
    f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip",
)


def archive_path(version: str) -> str:
    return f"/mirror/v1/{PROVIDER}/{version}/linux_amd64/terraform-provider-foo_{version}_linux_amd64.zip"


def sealed_records(data_dir) -> tuple[int, list[str]]:
    """The records of the data dir's metadata store (the fleet's marker aside): how many open with its
    metadata.secret, and the keys of those that do not."""
    secret = (data_dir / "metadata" / "metadata.secret").read_bytes().strip()
    database = data_dir / "metadata" / "metadata.sqlite"
    with contextlib.closing(sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT key, value FROM metadata WHERE key != ?", (FLEET_SECRET,)).fetchall()
    refused = [key for key, value in rows if unseal(secret, key, bytes(value))[0] is None]
    return len(rows) - len(refused), refused


async def test_backup_under_load_then_restore_serves_init_with_the_upstream_down(
    registry, signing_key, proxy_process, in_process_proxy, terraform, tmp_path
):
    for version in NEW_VERSIONS:
        registry.add(Release("acme", "foo", version, signing_key, platforms=("linux_amd64",)))
    data_dir, backup_dir, trusted_ca = tmp_path / "data", tmp_path / "backup", tmp_path / "trusted-ca.pem"
    proxy = await proxy_process(data_dir=data_dir)
    first = terraform.workdir("first", MAIN_TF)
    code, output = await terraform.init(first, mirror_config(proxy), proxy.ca_file)
    assert code == 0, output
    shutil.copy(proxy.ca_file, trusted_ca)

    context = ssl.create_default_context(cafile=str(proxy.ca_file))
    backed_up = asyncio.Event()
    statuses: list[int] = []
    written: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=16)) as session:

        async def get(path: str) -> None:
            async with session.get(proxy.url + path) as response:
                await response.read()
                statuses.append(response.status)

        async def reads() -> None:
            while not backed_up.is_set():
                await asyncio.gather(*(get(path) for path in READS))

        async def writes(first_written: asyncio.Event) -> None:
            for version in NEW_VERSIONS:
                if backed_up.is_set():
                    return
                await get(f"/mirror/v1/{PROVIDER}/{version}.json")
                await get(archive_path(version))
                written.append(version)
                first_written.set()

        first_written = asyncio.Event()
        load = [asyncio.create_task(reads()) for _ in range(6)] + [asyncio.create_task(writes(first_written))]
        await first_written.wait()  # the proxy is fetching and recording: the backup runs while it writes
        code, output = await registry_proxy_in_process(
            "backup", str(backup_dir), "--data-dir", str(data_dir), "--archives"
        )
        during = len(written)
        backed_up.set()
        await asyncio.gather(*load)
    assert code == 0, output
    assert set(statuses) == {200}, sorted(set(statuses))
    assert len(statuses) > 50 and during < len(NEW_VERSIONS), (len(statuses), during)  # under load, while writing
    assert "records: " in output and ", 0 do not; the fleet's marker opens" in output, output
    assert "hard-linked" in output, output

    await proxy.stop()
    await registry.stop()
    shutil.rmtree(data_dir)
    code, output = await registry_proxy_in_process("restore", str(backup_dir), "--data-dir", str(data_dir))
    assert code == 0, output
    opened, refused = sealed_records(data_dir)
    assert refused == [] and opened >= 5, (opened, refused)  # discovery, versions, download, sums, archive at least
    assert f"records: {opened} open with the metadata secret, 0 do not; the fleet's marker opens" in output, output
    assert (data_dir / "tls" / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    assert (data_dir / "metadata" / "metadata.secret").stat().st_mode & 0o777 == 0o600

    restored = await in_process_proxy(data_dir=data_dir, upstream=False)
    second = terraform.workdir("second", MAIN_TF)
    code, output = await terraform.init(second, mirror_config(restored), trusted_ca)
    assert code == 0, output
    assert (second / ".terraform.lock.hcl").read_text() == (first / ".terraform.lock.hcl").read_text()
    assert restored.events("security.metadata_poisoned") == []
