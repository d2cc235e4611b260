"""The page at `/` as rendered: the proxy's URL and CLI snippets, escaping of upstream strings, grouping."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser

import pytest

from proxy.governance.inventory import CachedModule, CachedProvider, HostHealth, Inventory, matches
from proxy.runtime.metrics import Totals
from proxy.web import home_page

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'
FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"
TOTALS = Totals(
    cache_hits=12,
    cache_misses=3,
    cache_stale=1,
    bytes_served=5 * 2**20,
    upstream_fetches=7,
    upstream_bytes=2**20,
    all_workers=False,
)


def data(**overrides) -> home_page.PageData:
    values = dict(
        version="1.2.3",
        base="https://proxy.example.com:8443/",
        ca_url="ca.pem",
        hosts=[
            HostHealth("registry.terraform.io", ("allowed",), None, "ok", "discovery document cached", 1_700_000_000.0),
            HostHealth("registry.opentofu.org", ("allowed", "default"), None, "unknown", "not contacted yet", None),
        ],
        inventory=Inventory(),
        query="",
        totals=TOTALS,
        offline=False,
        metadata_problem=None,
        nonce="n0nce",
        now=1_700_000_600.0,
    )
    values.update(overrides)
    return home_page.PageData(**values)


def provider(**overrides) -> CachedProvider:
    values = dict(
        host="registry.terraform.io",
        namespace="hashicorp",
        type="aws",
        version="5.0.0",
        platform="linux_amd64",
        sha256="a" * 64,
        size=3 * 2**20,
        filename="terraform-provider-aws.zip",
        signed_by=FINGERPRINT,
    )
    values.update(overrides)
    return CachedProvider(**values)


class Elements(HTMLParser):
    """Every start tag with its attributes, and the text of <pre> elements by id."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.pre: dict[str, str] = {}
        self._pre: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "pre":
            self._pre = dict(attrs)["id"]
            self.pre[self._pre] = ""

    def handle_endtag(self, tag):
        if tag == "pre":
            self._pre = None

    def handle_data(self, text):
        if self._pre:
            self.pre[self._pre] += text


def parse(html: str) -> Elements:
    parser = Elements()
    parser.feed(html)
    return parser


# ---- the proxy's URL ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("public", "scheme", "host", "expected"),
    [
        (None, "https", "proxy.example.com:8443", "https://proxy.example.com:8443/"),
        (None, "https", "proxy.example.com", "https://proxy.example.com/"),
        (None, "http", "10.0.0.5:8080", "http://10.0.0.5:8080/"),
        (None, "https", "[::1]:8443", "https://[::1]:8443/"),
        (None, "https", "Proxy.Example.COM:443", "https://proxy.example.com:443/"),
        ("https://mirror.example.org/tf", "http", "10.0.0.5:8080", "https://mirror.example.org/tf/"),
        ("https://mirror.example.org/", "http", None, "https://mirror.example.org/"),
    ],
)
def test_base_url_from_the_public_url_or_the_request(public, scheme, host, expected):
    assert home_page.base_url(public, scheme, host, "127.0.0.1:8443") == expected


@pytest.mark.parametrize(
    "host",
    [None, "", 'evil"}\nprovider_installation {', "a b", "x.com/path", "x.com@y", "<script>", "host:port", "-bad.com"],
)
def test_a_host_header_that_is_not_a_plain_host_falls_back_to_the_listen_address(host):
    assert home_page.base_url(None, "https", host, "127.0.0.1:8443") == "https://127.0.0.1:8443/"


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("0.0.0.0", 8443, "127.0.0.1:8443"),
        ("::", 9000, "[::1]:9000"),
        ("10.1.2.3", 443, "10.1.2.3:443"),
        ("::1", 80, "[::1]:80"),
    ],
)
def test_listen_address(host, port, expected):
    assert home_page.listen_address(host, port) == expected


# ---- snippets ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base", ["https://127.0.0.1:8443/", "http://proxy.internal:8080/", "https://proxy.example.com/"]
)
def test_snippets_name_this_proxy_for_terraform_and_opentofu(base):
    made = home_page.snippets(base, ["registry.opentofu.org", "registry.terraform.io"])
    assert [(s.client, s.file) for s in made["mirror"]] == [("Terraform", "~/.terraformrc"), ("OpenTofu", "~/.tofurc")]
    for snippet in made["mirror"]:
        assert snippet.text.startswith(f"# {snippet.file}\n")
        assert f'    url = "{base}mirror/v1/"\n' in snippet.text
        assert "provider_installation {\n  network_mirror {\n" in snippet.text
    for snippet in made["hosts"]:
        for host in ("registry.opentofu.org", "registry.terraform.io"):
            assert (
                f'host "{host}" {{\n  services = {{\n'
                f'    "providers.v1" = "{base}registry/{host}/providers/v1/"\n'
                f'    "modules.v1"   = "{base}registry/{host}/modules/v1/"\n  }}\n}}\n'
            ) in snippet.text
    terraform, tofu = made["hosts"]
    assert terraform.text.index("registry.terraform.io") < terraform.text.index("registry.opentofu.org")
    assert tofu.text.index("registry.opentofu.org") < tofu.text.index("registry.terraform.io")


def test_the_rendered_snippets_are_the_exact_configuration():
    html = home_page.render(data(base="https://proxy.example.com:8443/"))
    pre = parse(html).pre
    assert pre["mirror-terraform"].endswith(home_page.mirror_config("https://proxy.example.com:8443/"))
    assert pre["mirror-opentofu"].endswith(home_page.mirror_config("https://proxy.example.com:8443/"))
    assert 'url = "https://proxy.example.com:8443/mirror/v1/"' in pre["mirror-opentofu"]
    assert (
        '"providers.v1" = "https://proxy.example.com:8443/registry/registry.terraform.io/providers/v1/"'
        in pre["hosts-terraform"]
    )
    buttons = [attrs["data-target"] for tag, attrs in parse(html).tags if tag == "button" and "data-target" in attrs]
    assert sorted(buttons) == sorted(pre)  # a copy button for every snippet
    assert 'source = "proxy.example.com:8443/NAMESPACE/NAME/SYSTEM"' in html


def test_plain_http_says_the_clients_need_https_and_no_ca_link_without_a_generated_ca():
    html = home_page.render(data(base="http://10.0.0.5:8080/", ca_url=None))
    assert "accept only <code>https:</code>" in html
    assert "ca.pem" not in html
    assert "accept only" not in home_page.render(data())
    assert 'href="ca.pem"' in home_page.render(data())


def test_the_ca_steps_build_a_bundle_with_the_systems_roots_instead_of_replacing_them():
    text = " ".join(unescape(re.sub(r"<[^>]+>", "", home_page.render(data()))).split())
    downloaded = next(a["download"] for tag, a in parse(home_page.render(data())).tags if a.get("href") == "ca.pem")
    bundle = f"cat /etc/ssl/certs/ca-certificates.crt {downloaded} > registry-proxy-bundle.pem"
    assert f"{bundle} && export SSL_CERT_FILE=$PWD/registry-proxy-bundle.pem" in text
    assert f"SSL_CERT_FILE=$PWD/{downloaded}" not in text  # the CA alone would replace the system's roots
    assert "/etc/pki/tls/certs/ca-bundle.crt" in text and "macOS and Windows" in text


# ---- escaping: upstream strings are attacker-controlled ----------------------------------------


def test_upstream_strings_are_escaped_everywhere():
    evil = provider(
        namespace=XSS, type='x" onmouseover="alert(1)', version=XSS, platform=XSS, filename=XSS, signed_by=XSS
    )
    module = CachedModule("registry.example.test", XSS, "net", "aws", XSS, "b" * 64, 100, XSS, commit=XSS)
    hosts = [HostHealth(XSS, ("mapped",), XSS, "not found", XSS, 1.0)]
    html = home_page.render(data(inventory=Inventory([evil], [module]), hosts=hosts, query=XSS, metadata_problem=XSS))
    assert "<script>alert" not in html and "<img" not in html
    assert html.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") >= 8
    scripts = [attrs for tag, attrs in parse(html).tags if tag == "script"]
    assert scripts == [{"nonce": "n0nce"}]  # the page's own script, nothing injected
    assert not [attrs for _, attrs in parse(html).tags if any(name.startswith("on") for name in attrs)]


def test_the_page_loads_nothing_from_elsewhere():
    html = home_page.render(data(inventory=Inventory([provider()], [])))
    tags = parse(html).tags
    assert not [attrs for tag, attrs in tags if tag in ("script", "img", "iframe") and "src" in attrs]
    assert [attrs["href"] for tag, attrs in tags if tag == "link"] == ["data:,"]
    assert [attrs.get("nonce") for tag, attrs in tags if tag in ("style", "script")] == ["n0nce", "n0nce"]
    assert not [attrs for _, attrs in tags if "style" in attrs]  # inline styles would need 'unsafe-inline'
    assert not re.search(r'(src|href|action)="(https?:)?//', html)


# ---- inventory, hosts and numbers --------------------------------------------------------------


def test_inventory_groups_platforms_by_version_with_size_signer_and_last_served():
    archives = [
        provider(platform="linux_amd64", size=2**20, last_served=1_700_000_000.0),
        provider(platform="darwin_arm64", size=2**20),
        provider(version="4.9.0", platform="linux_amd64", signed_by=""),
        provider(version="5.10.0", platform="linux_amd64"),
    ]
    groups = home_page.releases(archives)
    assert [(g.address, g.version) for g in groups] == [
        ("registry.terraform.io/hashicorp/aws", v) for v in ("4.9.0", "5.0.0", "5.10.0")
    ]
    html = home_page.render(data(inventory=Inventory(archives, [], more=3)))
    address = "registry.terraform.io/hashicorp/aws"
    row = html[html.index(f'data-search="{address} {address}/5.0.0') :]
    row = row[: row.index("</tr>")]
    assert "linux_amd64" in row and "darwin_arm64" in row and "2.0 MiB" in row
    assert f'title="{FINGERPRINT}">{FINGERPRINT[-16:]}<' in row
    assert "2023-11-14 22:13 UTC" in row  # the last time any platform was served
    assert "3 more matching archives not listed" in html


def test_numbers_say_whether_they_are_per_process_or_all_workers():
    html = home_page.render(data())
    assert 'id="stat-hits">12<' in html and 'id="stat-served">5.0 MiB<' in html and 'id="stat-fetches">7<' in html
    assert "of this server process" in html
    workers = Totals(**{**TOTALS.__dict__, "all_workers": True})
    assert "summed over all worker processes" in home_page.render(data(totals=workers))


def test_hosts_show_role_state_and_last_discovery():
    html = home_page.render(data())
    assert "registry.terraform.io" in html and "2023-11-14 22:13 UTC" in html and "10 min ago" in html
    assert "not contacted yet" in html


@pytest.mark.parametrize(
    ("query", "subject", "found"),
    [
        ("", "h/ns/t/1.0.0/linux_amd64", True),
        ("AWS", "registry.terraform.io/hashicorp/aws/5.0.0/linux_amd64", True),
        ("aws@5.0.0", "registry.terraform.io/hashicorp/aws/5.0.0/linux_amd64", True),
        ("aws darwin", "registry.terraform.io/hashicorp/aws/5.0.0/linux_amd64", False),
        ("google", "registry.terraform.io/hashicorp/aws/5.0.0/linux_amd64", False),
    ],
)
def test_search_matches_every_word(query, subject, found):
    assert matches(subject, query) is found


@pytest.mark.parametrize(("size", "text"), [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 * 2**30, "5.0 GiB")])
def test_human_size(size, text):
    assert home_page.human_size(size) == text


def test_totals_are_the_metrics_counters():
    from proxy.runtime.metrics import Metrics

    metrics = Metrics()
    for outcome in ("hit", "hit", "miss", "stale"):
        metrics.count_cache(outcome)
    metrics.served_bytes.inc(1000)
    metrics.upstream_fetches.labels("archive", "ok").inc()
    metrics.upstream_fetches.labels("versions", "error").inc(2)
    metrics.upstream_bytes.inc(300)
    assert metrics.totals() == Totals(
        cache_hits=2,
        cache_misses=1,
        cache_stale=1,
        bytes_served=1000,
        upstream_fetches=3,
        upstream_bytes=300,
        all_workers=False,
    )


@pytest.mark.parametrize(
    ("base", "host"),
    [
        ("https://proxy.example.com:8443/", "proxy.example.com:8443"),
        ("https://[::1]:8443/", "[::1]:8443"),
        ("https://mirror.example.org/tf/", None),
    ],
)
def test_module_host_only_when_the_proxy_is_at_the_root(base, host):
    assert home_page.module_host(base) == host
    assert ("NAMESPACE/NAME/SYSTEM" in home_page.render(data(base=base))) is (host is not None)


class BrokenStore:
    """A metadata store that fails every call, as an unreachable Redis does."""

    problem = "Redis: connection refused"

    async def keys(self, prefix=""):
        raise ConnectionError("connection refused")
        yield  # pragma: no cover - makes this an async generator

    async def get_many(self, keys):
        raise ConnectionError("connection refused")


async def test_a_store_that_cannot_be_read_gives_an_empty_inventory_with_its_problem():
    from pathlib import Path

    from proxy.governance.inventory import InventoryReader, NoAccessTimes
    from proxy.settings.config import Settings

    reader = InventoryReader(Settings(data_dir=Path("unused")), BrokenStore(), NoAccessTimes())
    inventory = await reader.scan()
    assert inventory.providers == [] and inventory.problem == "Redis: connection refused"
    assert [(h.host, h.state) for h in await reader.hosts()] == [
        ("registry.opentofu.org", "unknown"),
        ("registry.terraform.io", "unknown"),
    ]
    html = home_page.render(data(inventory=inventory, metadata_problem=BrokenStore.problem))
    assert "The metadata store cannot be read now: Redis: connection refused" in html
    assert "degraded: metadata store" in html


async def test_the_hosts_listed_are_only_the_visible_ones():
    from pathlib import Path

    from proxy.governance.inventory import InventoryReader, NoAccessTimes
    from proxy.settings.config import Settings

    reader = InventoryReader(Settings(data_dir=Path("unused")), BrokenStore(), NoAccessTimes())
    listed = await reader.hosts(visible=lambda host: host != "registry.terraform.io")
    assert [h.host for h in listed] == ["registry.opentofu.org"]


def test_metrics_leave_out_the_series_of_hosts_not_shown():
    from proxy.runtime.metrics import Metrics

    metrics = Metrics()
    metrics.observe_upstream("public.example", 0.1)
    metrics.observe_upstream("private.example", 0.2)
    metrics.unsigned_archives.labels("private.example").inc()
    everything = metrics.exposition().decode()
    assert 'host="private.example"' in everything and 'host="public.example"' in everything
    shown = metrics.exposition(lambda host: host != "private.example").decode()
    assert "private.example" not in shown and 'host="public.example"' in shown
    assert "registry_proxy_build_info{" in shown  # series without a host label stay
