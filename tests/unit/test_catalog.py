"""The catalog's pure parts (purge targets, cursors, entries), the `admin` token scope, and how a process's
memory front follows a purge made by another process."""

from __future__ import annotations

import pytest

from proxy.errors import InvalidAddressError, InvalidRequestError
from proxy.governance.catalog import PurgeTarget, decode_cursor, encode_cursor, parse_limit, provider_entry
from proxy.governance.inventory import CachedProvider
from proxy.identity.tokens import AuthConfigError, hash_token, parse_tokens, token_entry
from proxy.metadata_store import keys
from proxy.metadata_store.memory import MemoryFront
from proxy.runtime.memo import Memo


class DictStore:
    """The part of a metadata store the memory front uses, in a dict shared like Redis between "processes"."""

    def __init__(self, data: dict[str, bytes]) -> None:
        self.data = data
        self.reads = 0

    async def get(self, key: str) -> bytes | None:
        self.reads += 1
        return self.data.get(key)

    async def get_many(self, names: list[str]) -> list[bytes | None]:
        return [self.data.get(name) for name in names]

    async def set(self, key: str, value: bytes, ttl: float | None = None) -> None:
        self.data[key] = value

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)


def test_purge_targets():
    provider = PurgeTarget.parse("Registry.Terraform.io/hashicorp/aws@5.31.0")
    assert (provider.kind, provider.address, provider.version) == (
        "provider",
        "registry.terraform.io/hashicorp/aws",
        "5.31.0",
    )
    assert str(provider) == "registry.terraform.io/hashicorp/aws@5.31.0"
    module = PurgeTarget.parse("registry.example.com/acme/net/aws")
    assert (module.kind, module.host, module.namespace, module.version) == (
        "module",
        "registry.example.com",
        "acme",
        None,
    )
    assert module.patterns() == (keys.MODULE, keys.MODULE_DOWNLOAD, keys.MODULE_VERSIONS)
    assert provider.patterns() == (keys.ARCHIVE, keys.DOWNLOAD)  # one version: its version list stays
    for bad in ("registry.terraform.io/hashicorp", "a/b/c/d/e", "registry.terraform.io/hashicorp/aws@x.y", "../x/y"):
        with pytest.raises(InvalidAddressError):
            PurgeTarget.parse(bad)


def test_a_target_names_only_its_own_keys():
    target = PurgeTarget.parse("h.example/acme/foo@1.0.0")
    assert target.names(keys.ARCHIVE, "archive:h.example/acme/foo/1.0.0/linux_amd64")
    assert not target.names(keys.ARCHIVE, "archive:h.example/acme/foo/1.0.1/linux_amd64")
    assert not target.names(keys.ARCHIVE, "archive:h.example/acme/foobar/1.0.0/linux_amd64")  # a prefix, not it
    every = PurgeTarget.parse("h.example/acme/foo")
    assert every.names(keys.VERSIONS, "versions:h.example/acme/foo")
    assert not every.names(keys.VERSIONS, "versions:h.example/acme/foo2")


def test_cursors_and_limits():
    entry = ("provider", "h.example/acme/foo")
    assert decode_cursor(encode_cursor(entry)) == entry
    for bad in ("!!", encode_cursor(("nonsense", "x")), ""):
        with pytest.raises(InvalidRequestError):
            decode_cursor(bad)
    assert parse_limit(None) == 100 and parse_limit("7") == 7
    for bad in ("0", "501", "-1", "1.5"):
        with pytest.raises(InvalidRequestError):
            parse_limit(bad)


def test_a_provider_entry_groups_platforms_under_versions_newest_first():
    def archive(version: str, platform: str) -> CachedProvider:
        return CachedProvider("h", "acme", "foo", version, platform, "ab" * 32, 10, "f.zip")

    entry = provider_entry(
        "h/acme/foo",
        [archive("1.2.0", "linux_amd64"), archive("1.10.0", "linux_arm64"), archive("1.10.0", "darwin_arm64")],
    )
    assert [v["version"] for v in entry["versions"]] == ["1.10.0", "1.2.0"]  # by version, not as text
    assert [p["platform"] for p in entry["versions"][0]["platforms"]] == ["darwin_arm64", "linux_arm64"]
    assert entry["size"] == 30


def test_the_admin_scope_is_read_from_the_tokens_file_and_written_by_token_new():
    book = parse_tokens(token_entry("ops", "rpt_x", ["*"], admin=True) + token_entry("ci", "rpt_y", ["*"]))
    assert [(t.name, t.scope.admin) for t in book.tokens] == [("ops", True), ("ci", False)]
    with pytest.raises(AuthConfigError, match="admin"):
        parse_tokens(f'[tokens.x]\nhash = "{hash_token("t")}"\nhosts = ["*"]\nadmin = "yes"\n')


async def test_a_purge_elsewhere_empties_this_processs_memory_at_its_next_check():
    shared: dict[str, bytes] = {"archive:k": b"old record"}
    now = [100.0]
    here = MemoryFront(DictStore(shared), purge_check_interval=1.0, clock=lambda: now[0])
    elsewhere = MemoryFront(DictStore(shared), clock=lambda: now[0])
    memo: Memo[str, str] = Memo()
    memo.put("decoded", "old")
    assert await here.follow_purges() is False  # the mark as of the start
    assert await here.get("archive:k") == b"old record"

    del shared["archive:k"]  # what a purge does in the shared store...
    await elsewhere.set(keys.PURGES, b"mark 1")  # ...then its mark
    assert await here.get("archive:k") == b"old record"  # remembered: nothing was checked yet
    now[0] += 0.5
    assert await here.follow_purges() is False  # not due: no read of the store
    now[0] += 0.6
    assert await here.follow_purges() is True
    assert await here.get("archive:k") is None and memo.get("decoded") is None
    now[0] += 5
    assert await here.follow_purges() is False  # the same mark: nothing dropped again


async def test_the_purging_process_forgets_at_once():
    shared: dict[str, bytes] = {"archive:k": b"record"}
    now = [0.0]
    front = MemoryFront(DictStore(shared), clock=lambda: now[0])
    await front.follow_purges()
    assert await front.get("archive:k") == b"record"
    del shared["archive:k"]
    await front.set(keys.PURGES, b"mark")
    assert await front.get("archive:k") is None
    now[0] += 5
    assert await front.follow_purges() is False  # its own mark is not another purge
