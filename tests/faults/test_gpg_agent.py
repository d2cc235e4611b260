"""No gpg-agent outlives the proxy (issue 8, item 9).

python-gnupg's key imports made gpg start a `gpg-agent --homedir DATA_DIR/gnupg --daemon` that
kept running after the proxy stopped: one leaked daemon per data dir and start.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tests.conftest import PROVIDER

ARCHIVE = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"


def agents_for(home: Path) -> list[int]:
    """Pids of live gpg-agent processes whose --homedir is `home`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z" or not argv or not argv[0].endswith(b"gpg-agent"):
            continue
        at = argv.index(b"--homedir") + 1 if b"--homedir" in argv else len(argv)
        if at < len(argv) and os.path.realpath(os.fsdecode(argv[at])) == os.path.realpath(home):
            pids.append(int(entry.name))
    return pids


async def no_agents_within(home: Path, seconds: float) -> list[int]:
    """Poll until no agent for `home` is left (an agent told to stop exits asynchronously)."""
    deadline = time.monotonic() + seconds
    for _ in range(int(seconds * 10)):
        if not agents_for(home) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    return agents_for(home)


@pytest.mark.parametrize("ending", ["stop", "kill"])
async def test_no_gpg_agent_outlives_the_proxy(proxy_process, connect, registry, tmp_path, ending):
    process = await proxy_process()
    home = process.data_dir / "gnupg"
    client = await connect(process)
    status, _, body = await client.get(ARCHIVE)  # imports the upstream's key and verifies SHA256SUMS.sig
    assert status == 200 and body == registry.releases[("acme", "foo")]["1.0.0"].zips["linux_amd64"]
    assert (home / "pubring.kbx").exists()  # the key went through this keyring
    assert agents_for(home) == []  # verification needs no agent, so none is started
    await (process.stop() if ending == "stop" else process.kill())
    assert await no_agents_within(home, 10) == []


async def test_an_agent_left_in_the_data_dir_is_stopped_at_shutdown(proxy_process, connect, tmp_path):
    """An agent started earlier for the data dir's keyring (by an older version) goes with the proxy."""
    # A short path: the agent's sockets (S.gpg-agent.browser the longest) must fit in 107 bytes, and a
    # parallel worker's tmp_path is longer (".../popen-gw2/test_an_agent_left_in_the_data0/").
    data_dir = tmp_path / "d"
    home = data_dir / "gnupg"
    home.mkdir(parents=True, mode=0o700)
    starter = await asyncio.create_subprocess_exec(
        "gpg-connect-agent",
        "--homedir",
        str(home),
        "/bye",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert await asyncio.wait_for(starter.wait(), 30) == 0
    started = agents_for(home)
    assert started, "gpg-connect-agent did not start an agent"
    try:
        process = await proxy_process(data_dir=data_dir)
        await process.stop()
        assert await no_agents_within(home, 10) == []
    finally:
        for pid in agents_for(home):  # only the agent this test started
            os.kill(pid, 15)
