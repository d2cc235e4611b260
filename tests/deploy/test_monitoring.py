"""deploy/monitoring: the Grafana dashboard and the alert rules are built from the metrics the proxy exports.

Every query (dashboard panels and variables, alert rules) names only metrics and labels that
`proxy.runtime.metrics.Metrics` defines, every metric is on the dashboard, promtool accepts the rules and every
dashboard query, and promtool's unit tests show each alert firing on the series that should fire it and
not on the ones that should not. The Prometheus Operator's PrometheusRule carries the same rules.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import shutil
import ssl
import subprocess
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from proxy.runtime.metrics import Metrics
from tests.conftest import PROVIDER, serve_proxy
from tests.fakes.process import REPO_ROOT, terminate
from tests.fakes.redis_server import free_port

MONITORING = REPO_ROOT / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus to every series it scrapes
JOB = 'job="registry-proxy"'


def defined_series() -> dict[str, set[str]]:
    """Every series name the proxy can export, with its label names (the lazily made gauges included)."""
    metrics = Metrics()
    metrics.redis_up(True)
    metrics.store_cap(1)
    series: dict[str, set[str]] = {}
    for metric in vars(metrics).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name, labels = metric._name, set(metric._labelnames)
        if metric._type == "counter":
            series[f"{name}_total"] = labels
        elif metric._type == "histogram":
            series.update({f"{name}_bucket": labels | {"le"}, f"{name}_count": labels, f"{name}_sum": labels})
        else:
            series[name] = labels
    return series


def alert_rules() -> list[dict]:
    return [rule for group in _rules_document()["groups"] for rule in group["rules"]]


@functools.cache
def _rules_document() -> dict:
    """The alert rules file, parsed once per process (the cases below read it at collection, in every worker)."""
    return yaml.load(RULES.read_text(), Loader=yaml.CSafeLoader)


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def dashboard_queries() -> list[str]:
    queries = [target["expr"] for panel in panels() for target in panel["targets"]]
    variables = [v["query"]["query"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    return queries + variables


def as_promql(query: str) -> str:
    """A dashboard query with Grafana's variables replaced by values Prometheus accepts."""
    query = query.replace("$__rate_interval", "5m").replace("$__range", "1h")
    return re.sub(r"\$\w+", ".*", query)


SELECTOR = re.compile(r"\b([a-z_][a-z0-9_]*)\s*\{([^}]*)\}|\b(registry_proxy_[a-z0-9_]+)\b")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-z_][a-z0-9_]*)\s*(?:=~|!~|!=|=)")


def problems(query: str, series: dict[str, set[str]]) -> list[str]:
    """What in `query` is not a metric or label the proxy exports (empty: all of it is)."""
    found: list[str] = []
    used: set[str] = set()
    for match in SELECTOR.finditer(query):
        name = match[1] or match[3]
        if name == "up" and match[2] is not None and JOB in match[2]:
            used.add("up")
            continue
        if not name.startswith("registry_proxy_"):
            continue
        if name not in series:
            found.append(f"no metric {name}")
            continue
        used.add(name)
        for label in MATCHER.findall(match[2] or ""):
            if label not in series[name] | SCRAPE_LABELS:
                found.append(f"{name} has no label {label}")
    if not used and not found:
        found.append("names no metric of the proxy")
    labels = set().union(SCRAPE_LABELS, *(series.get(name, set()) for name in used))
    for grouping in GROUPING.findall(query):
        found += [
            f"no label {label} on {sorted(used)}" for label in re.findall(r"\w+", grouping) if label not in labels
        ]
    if query.startswith("label_values("):
        found += [f"no label {label}" for label in re.findall(r",\s*(\w+)\)$", query) if label not in labels]
    return found


def test_every_query_names_real_metrics_and_labels():
    series = defined_series()
    assert {"registry_proxy_requests_total", "registry_proxy_store_max_bytes", "registry_proxy_redis_up"} <= set(series)
    queries = [rule["expr"] for rule in alert_rules()] + dashboard_queries()
    assert len(queries) > 40
    bad = {query: found for query in queries if (found := problems(query, series))}
    assert not bad, bad


def test_the_check_catches_a_wrong_name_or_label():
    series = defined_series()
    assert problems("rate(registry_proxy_request_total[5m])", series) == ["no metric registry_proxy_request_total"]
    assert problems('registry_proxy_cache_total{outcom="hit"}', series) == [
        "registry_proxy_cache_total has no label outcom"
    ]
    assert problems("sum by (host) (registry_proxy_store_bytes)", series) == [
        "no label host on ['registry_proxy_store_bytes']"
    ]
    assert problems('up{job="other"} == 0', series) == ["names no metric of the proxy"]
    assert problems("label_values(registry_proxy_build_info, versoin)", series) == ["no label versoin"]
    assert problems('up{job="registry-proxy"} == 0', series) == []


@pytest.mark.parametrize("cap", [None, 5 * 2**30])
async def test_a_running_proxy_exports_only_defined_series_and_its_cap(make_local_settings, client_ssl, tmp_path, cap):
    settings = make_local_settings(data_dir=tmp_path / "data", max_store_size=cap)
    async with serve_proxy(settings, client_ssl) as proxy:
        assert (await proxy.get("/mirror/v1/registry.example.test/acme/foo/index.json"))[0] == 200
        status, _, body = await proxy.get("/metrics")
    assert status == 200
    samples = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert "registry_proxy_requests_total" in samples
    assert {name for name in samples if not name.endswith("_created")} <= set(defined_series())
    assert samples.get("registry_proxy_store_max_bytes") == cap


def test_the_dashboard_shows_every_metric():
    used = " ".join(dashboard_queries())
    families = {re.sub(r"_(bucket|count|sum)$", "", name) for name in defined_series()}
    missing = sorted(name for name in families if not re.search(rf"\b{name}(_bucket|_count|_sum)?\b", used))
    assert not missing, missing


def test_the_dashboard_is_well_formed():
    board = dashboard()
    assert board["uid"] == "registry-proxy" and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        place = panel["gridPos"]
        assert place["x"] + place["w"] <= 24, panel["title"]
        taken = {
            (x, y)
            for x in range(place["x"], place["x"] + place["w"])
            for y in range(place["y"], place["y"] + place["h"])
        }
        assert not taken & cells, f"{panel['title']} overlaps another panel"
        cells |= taken
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}" and panel["description"], panel["title"]
        assert [target["refId"] for target in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
        for target in panel["targets"]:
            assert '{job=~"$job", instance=~"$instance"' in target["expr"], (panel["title"], target["expr"])


def test_the_prometheus_rule_carries_the_same_rules():
    """The kustomize component's PrometheusRule (written from the Helm chart, whose rules are this file's)."""
    component = REPO_ROOT / "deploy" / "kubernetes" / "components" / "prometheus-operator"
    written = yaml.safe_load((component / "prometheusrule.yaml").read_text())
    assert written["spec"]["groups"] == _rules_document()["groups"], "run scripts/render_kustomize.py"
    assert "prometheusrule.yaml" in yaml.safe_load((component / "kustomization.yaml").read_text())["resources"]


def test_every_alert_says_what_is_wrong_and_how_bad():
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    for rule in alert_rules():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        for text in rule["annotations"].values():  # only label templates: the unit tests render them
            assert re.sub(r"\{\{ \$labels\.\w+ \}\}", "", text).count("{{") == 0, text
    wanted = {
        "RegistryProxyDown",
        "RegistryProxyHighErrorRate",
        "RegistryProxyUpstreamFailing",
        "RegistryProxyVerificationFailed",
        "RegistryProxyMetadataPoisoned",
        "RegistryProxyStoreCorrupted",
        "RegistryProxyRedisDown",
        "RegistryProxyStoreNearCap",
        "RegistryProxyStoreOverCap",
    }
    assert wanted <= set(names)


# ---- promtool ----------------------------------------------------------------------------------


def promtool(*args: str) -> subprocess.CompletedProcess:
    if PROMTOOL is None:
        pytest.skip(
            "promtool NOT FOUND: the alert rules and dashboard queries are not checked by Prometheus itself "
            "(`make system-deps` installs it: Debian package `prometheus`)"
        )
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.process
def test_promtool_accepts_the_rules_and_every_dashboard_query(tmp_path):
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    recorded = [
        {"record": f"dashboard:query_{index}", "expr": as_promql(query)}
        for index, query in enumerate(dashboard_queries())
        if not query.startswith("label_values(")
    ]
    queries = tmp_path / "dashboard-queries.yaml"
    queries.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    result = promtool("check", "rules", str(queries))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_the_example_prometheus_configuration_scrapes_the_job_the_rules_expect():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert f'job="{job["job_name"]}"' == JOB and job["metrics_path"] == "/metrics"
    assert config["rule_files"] == [RULES.name]
    result = promtool("check", "config", str(MONITORING / "prometheus.yml"))  # also checks the rule files
    assert result.returncode == 0 and f"{len(alert_rules())} rules found" in result.stdout, (
        result.stdout + result.stderr
    )


@pytest.mark.process
def test_promtool_rejects_a_broken_rule(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.read_text().replace("== 0", "=== 0", 1))
    assert promtool("check", "rules", str(broken)).returncode != 0


def expected(alert: str, *label_sets: dict[str, str]) -> list[dict]:
    """The alerts promtool should see: the rule's own labels and its annotations rendered for each label set."""
    rule = next(rule for rule in alert_rules() if rule["alert"] == alert)
    found = []
    for labels in label_sets:
        labels = {"job": "registry-proxy", **labels}
        annotations = {
            key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m, labels=labels: labels[m[1]], text)
            for key, text in rule["annotations"].items()
        }
        found.append({"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations})
    return found


def series(name: str, values: str, **labels: str) -> dict:
    labels = {"job": "registry-proxy", "instance": "a:8080", **labels}
    return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


B, C = {"instance": "b:8080"}, {"instance": "c:8080"}
A = {"instance": "a:8080"}
# (interval, input series, [(eval time, alert, expected alerts)]): each alert fires where it should, and
# neither before its `for` has passed nor for the series next to it that should not fire it.
CASES = {
    "down": (
        "1m",
        [series("up", "0x10"), series("up", "1x10", **B)],
        [("4m", "RegistryProxyDown", []), ("6m", "RegistryProxyDown", expected("RegistryProxyDown", A))],
    ),
    "5xx": (
        "1m",
        [
            series("registry_proxy_requests_total", "0+100x20", route="mirror_json", status="200"),
            series("registry_proxy_requests_total", "0+10x20", route="mirror_archive", status="502"),
            series("registry_proxy_requests_total", "0+100x20", route="mirror_json", status="200", **B),
            series("registry_proxy_requests_total", "0+1x20", route="mirror_archive", status="503", **B),
            series("registry_proxy_requests_total", "0+10x20", route="mirror_json", status="200", **C),
            series("registry_proxy_requests_total", "0+50x20", route="readyz", status="503", **C),
        ],
        [
            ("8m", "RegistryProxyHighErrorRate", []),
            ("16m", "RegistryProxyHighErrorRate", expected("RegistryProxyHighErrorRate", A)),
        ],
    ),
    "upstream failing": (
        "1m",
        [
            series("registry_proxy_upstream_fetches_total", "0+6x30", kind="metadata", outcome="error"),
            series("registry_proxy_upstream_fetches_total", "0+4x30", kind="metadata", outcome="200"),
            series("registry_proxy_upstream_fetches_total", "0+1x30", kind="metadata", outcome="error", **B),
            series("registry_proxy_upstream_fetches_total", "0+9x30", kind="metadata", outcome="200", **B),
        ],
        [("25m", "RegistryProxyUpstreamFailing", expected("RegistryProxyUpstreamFailing", A))],
    ),
    "upstream slow": (
        "1m",
        [
            series("registry_proxy_upstream_request_duration_seconds_bucket", f"0+{n}x40", host="slow.example", le=le)
            for le, n in (("5.0", 0), ("10.0", 1), ("30.0", 10), ("+Inf", 10))
        ]
        + [
            series("registry_proxy_upstream_request_duration_seconds_bucket", "0+10x40", host="fast.example", le=le)
            for le in ("5.0", "10.0", "30.0", "+Inf")
        ],
        [
            ("12m", "RegistryProxyUpstreamSlow", []),
            ("30m", "RegistryProxyUpstreamSlow", expected("RegistryProxyUpstreamSlow", {**A, "host": "slow.example"})),
        ],
    ),
    "verification": (
        "1m",
        [
            series("registry_proxy_verification_failures_total", "0x3 1x30", check="archive"),
            series("registry_proxy_verification_failures_total", "0x33", check="signature"),
        ],
        [
            ("2m", "RegistryProxyVerificationFailed", []),
            (
                "5m",
                "RegistryProxyVerificationFailed",
                expected("RegistryProxyVerificationFailed", {**A, "check": "archive"}),
            ),
            ("25m", "RegistryProxyVerificationFailed", []),
        ],
    ),
    "signing keys": (
        "1m",
        [
            series("registry_proxy_signing_key_changes_total", "0x3 1x30", decision="hold"),
            series("registry_proxy_signing_key_changes_total", "0x33", decision="warn"),
        ],
        [
            ("2m", "RegistryProxySigningKeyChanged", []),
            (
                "5m",
                "RegistryProxySigningKeyChanged",
                expected("RegistryProxySigningKeyChanged", {**A, "decision": "hold"}),
            ),
            ("25m", "RegistryProxySigningKeyChanged", []),
        ],
    ),
    "seals": (
        "1m",
        [
            series("registry_proxy_metadata_rejected_total", "0 0 2x10", store="redis", reason="bad_seal"),
            series("registry_proxy_metadata_rejected_total", "0 0 0 0 7x10", store="embedded", reason="no_seal", **B),
        ],
        [
            ("5m", "RegistryProxyMetadataPoisoned", expected("RegistryProxyMetadataPoisoned", {**A, "store": "redis"})),
            (
                "5m",
                "RegistryProxyMetadataUnsealed",
                expected("RegistryProxyMetadataUnsealed", {**B, "store": "embedded"}),
            ),
        ],
    ),
    "corruption": (
        "1m",
        [series("registry_proxy_store_corruptions_total", "0 1x10", check="sha256")],
        [("3m", "RegistryProxyStoreCorrupted", expected("RegistryProxyStoreCorrupted", {**A, "check": "sha256"}))],
    ),
    "audit": (
        "1m",
        [
            series("registry_proxy_audit_events_dropped_total", "0 0 3x10"),
            series("registry_proxy_audit_events_dropped_total", "0x12", **B),
        ],
        [
            ("1m", "RegistryProxyAuditEventsDropped", []),
            ("4m", "RegistryProxyAuditEventsDropped", expected("RegistryProxyAuditEventsDropped", A)),
        ],
    ),
    "redis": (
        "1m",
        [series("registry_proxy_redis_up", "1 1 0x10"), series("registry_proxy_redis_up", "1x12", **B)],
        [("3m", "RegistryProxyRedisDown", []), ("5m", "RegistryProxyRedisDown", expected("RegistryProxyRedisDown", A))],
    ),
    "not ready": (
        "1m",
        [
            series("registry_proxy_requests_total", "0+1x20", route="readyz", status="503"),
            series("registry_proxy_requests_total", "0+1x20", route="readyz", status="200", **B),
        ],
        [("10m", "RegistryProxyNotReady", expected("RegistryProxyNotReady", A))],
    ),
    "disk full": (
        "1m",
        [series("registry_proxy_archive_passthrough_total", "0 0 1x10", kind="provider", outcome="complete")],
        [("1m", "RegistryProxyDiskFull", []), ("3m", "RegistryProxyDiskFull", expected("RegistryProxyDiskFull", A))],
    ),
    "store cap": (
        "1m",
        [
            series("registry_proxy_store_bytes", "95x40"),
            series("registry_proxy_store_max_bytes", "100x40"),
            series("registry_proxy_store_evictions_total", "0x40"),
            series("registry_proxy_store_bytes", "95x40", **B),  # at the cap, evicting: expected
            series("registry_proxy_store_max_bytes", "100x40", **B),
            series("registry_proxy_store_evictions_total", "0+1x40", **B),
            series("registry_proxy_store_bytes", "120x40", **C),
            series("registry_proxy_store_max_bytes", "100x40", **C),
            series("registry_proxy_store_evictions_total", "0x40", **C),
            series("registry_proxy_store_bytes", "500x40", instance="uncapped:8080"),
            series("registry_proxy_store_evictions_total", "0x40", instance="uncapped:8080"),
        ],
        [
            ("20m", "RegistryProxyStoreNearCap", expected("RegistryProxyStoreNearCap", A, C)),
            ("20m", "RegistryProxyStoreOverCap", []),
            ("35m", "RegistryProxyStoreOverCap", expected("RegistryProxyStoreOverCap", C)),
        ],
    ),
    "thrashing": (
        "10m",
        [
            series("registry_proxy_store_evicted_bytes_total", "0+60x60"),
            series("registry_proxy_upstream_bytes_total", "0+100x60"),
            series("registry_proxy_store_evicted_bytes_total", "0+10x60", **B),
            series("registry_proxy_upstream_bytes_total", "0+100x60", **B),
            series("registry_proxy_store_evicted_bytes_total", "0x60", **C),
            series("registry_proxy_upstream_bytes_total", "0x60", **C),
        ],
        [("8h", "RegistryProxyStoreThrashing", expected("RegistryProxyStoreThrashing", A))],
    ),
    "refused": (
        "1m",
        [series("registry_proxy_connections_refused_total", "0 0 5x10")],
        [("3m", "RegistryProxyConnectionsRefused", expected("RegistryProxyConnectionsRefused", A))],
    ),
}


def unit_tests(cases: dict) -> dict:
    return {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": name,
                "interval": interval,
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": t, "alertname": alert, "exp_alerts": exp} for t, alert, exp in checks
                ],
            }
            for name, (interval, inputs, checks) in cases.items()
        ],
    }


@pytest.mark.process
def test_every_alert_fires_when_it_should_and_only_then(tmp_path):
    tested = {alert for _, _, checks in CASES.values() for _, alert, _ in checks}
    assert tested == {rule["alert"] for rule in alert_rules()}
    path = tmp_path / "alerts-test.yaml"
    path.write_text(yaml.safe_dump(unit_tests(CASES), sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.process
def test_the_unit_tests_can_fail(tmp_path):
    interval, inputs, _ = CASES["down"]
    wrong = {"down": (interval, inputs, [("6m", "RegistryProxyDown", expected("RegistryProxyDown", B))])}
    path = tmp_path / "wrong-test.yaml"
    path.write_text(yaml.safe_dump(unit_tests(wrong), sort_keys=False))
    result = promtool("test", "rules", str(path))
    assert result.returncode != 0 and "RegistryProxyDown" in result.stdout + result.stderr


# ---- a real Prometheus scraping a real proxy -----------------------------------------------------


async def test_a_real_prometheus_scraping_a_proxy_evaluates_every_rule_and_dashboard_query(proxy_process, tmp_path):
    """The proxy (2 workers, a store cap) serves a few requests; Prometheus (Debian's, the package that brings
    promtool) scrapes it every second and loads the alert rules. Every rule evaluates without an error and
    every dashboard query is accepted; the panels for traffic, the store and the versions show data."""
    if PROMETHEUS is None:
        pytest.skip("prometheus NOT FOUND: the rules are not evaluated by a real Prometheus (`make system-deps`)")
    proxy = await proxy_process("--workers", "2", "--max-store-size", "1GiB")
    archive = f"/mirror/v1/{PROVIDER}/1.0.0/linux_amd64/terraform-provider-foo_1.0.0_linux_amd64.zip"
    async with aiohttp.ClientSession() as session:
        for path in (f"/mirror/v1/{PROVIDER}/index.json", f"/mirror/v1/{PROVIDER}/1.0.0.json", archive, "/nope"):
            async with session.get(
                proxy.url + path, ssl=ssl.create_default_context(cafile=str(proxy.ca_file))
            ) as response:
                await response.read()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": "registry-proxy",
                        "scheme": "https",
                        "tls_config": {"ca_file": str(proxy.ca_file)},
                        "static_configs": [{"targets": [f"127.0.0.1:{proxy.port}"]}],
                    }
                ],
            }
        )
    )
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as output:  # noqa: ASYNC230 - handed to the child process
        server = await asyncio.create_subprocess_exec(
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            stdout=output,
            stderr=output,
        )
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        async with aiohttp.ClientSession() as session:

            async def query(expr: str) -> list:
                async with session.get(f"{api}/query", params={"query": expr}) as response:
                    body = await response.json()
                assert body["status"] == "success", (expr, body)
                return body["data"]["result"]

            async def scraped(samples: int) -> bool:
                try:
                    found = await query('count_over_time(up{job="registry-proxy"}[1m])')
                except (aiohttp.ClientError, AssertionError):
                    return False
                return bool(found) and float(found[0]["value"][1]) >= samples

            await wait_until(lambda: scraped(4), 30, "4 scrapes of the proxy (see prometheus.log)")
            assert (
                await query('up{job="registry-proxy"}')
                and (await query('up{job="registry-proxy"}'))[0]["value"][1] == "1"
            )

            async def evaluated() -> list:
                async with session.get(f"{api}/rules") as response:
                    groups = (await response.json())["data"]["groups"]
                return [rule for group in groups for rule in group["rules"]]

            await wait_until(lambda: _all_evaluated(evaluated), 30, "every rule evaluated")
            rules = await evaluated()
            assert len(rules) == len(alert_rules())
            assert {rule["name"]: rule["health"] for rule in rules} == {rule["alert"]: "ok" for rule in alert_rules()}

            results = {}
            for query_text in dashboard_queries():
                if not query_text.startswith("label_values("):
                    expr = query_text.replace("$__rate_interval", "30s").replace("$__range", "1m")
                    results[query_text] = await query(re.sub(r"\$\w+", ".*", expr))
    finally:
        await terminate(server, 10)
    showing = {panel["title"] for panel in panels() for target in panel["targets"] if results.get(target["expr"])}
    for title in (
        "Requests/s by route",
        "Answers/s by status",
        "Store size and cap",
        "Versions running",
        "Upstream fetches/s",
        "Client connections open",
        "Metadata cache outcomes/s",
    ):
        assert title in showing, (title, sorted(showing))


async def _all_evaluated(evaluated) -> bool:
    try:
        return all(rule.get("lastEvaluation", "").startswith("20") for rule in await evaluated())
    except (aiohttp.ClientError, KeyError):
        return False


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Poll an async `condition` until it holds; fail naming `what` after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not await condition():  # noqa: ASYNC110 - polls another process's HTTP API
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
