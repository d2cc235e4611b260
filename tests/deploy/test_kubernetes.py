"""deploy/kubernetes: the base and each overlay rendered with `kubectl kustomize`, every manifest
validated against the pinned Kubernetes schema by kubernetes-validate in strict mode, and the parts checked
to fit together (probes, security context, selectors, ports, secrets, settings). The Prometheus Operator's
kinds (no schema there) come only from the opt-in component, checked field by field when an overlay opts in."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.fakes.process import REPO_ROOT, terminate, wait_healthy
from tests.fakes.redis_server import free_port

KUBERNETES_VERSION = "1.32.0"
ROOT = REPO_ROOT / "deploy" / "kubernetes"
TARGETS = ["base", "overlays/single", "overlays/fleet"]
OVERLAYS = [target for target in TARGETS if target.startswith("overlays/")]
COMPONENT = "components/prometheus-operator"
KUBECTL = shutil.which("kubectl")
# The Prometheus Operator's kinds have no schema in kubernetes-validate's set: checked field by field instead
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


def render(target: str, root: Path = ROOT) -> list[dict]:
    if KUBECTL is None:
        pytest.skip(
            "kubectl is missing: the overlays are not rendered (install kubectl for `kubectl kustomize`); "
            "the base's and overlays' own files are still validated one by one"
        )
    return [doc for doc in yaml.safe_load_all(kustomize(root / target)) if doc]


@functools.cache
def kustomize(folder: Path) -> str:
    """`kubectl kustomize FOLDER`'s output, once per folder for the session (a test's copy is a folder of its own)."""
    result = subprocess.run([KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def opted_in(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes whose overlays opt in to the component, by the lines their comment gives."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(ROOT, copy)
    for overlay in OVERLAYS:
        path = copy / overlay / "kustomization.yaml"
        text, count = re.subn(
            r"^# components:\n#   - (\S+)$", r"components:\n  - \1", path.read_text(), flags=re.MULTILINE
        )
        assert count == 1, f"{overlay}: no commented `components:` entry to opt in with"
        path.write_text(text)
    return copy


def by_kind(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [doc for doc in docs if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def validate(doc: dict, custom: bool = False) -> None:
    """Strict validation against the pinned Kubernetes; the operator's kinds only where `custom` allows them."""
    if custom and (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        (check_service_monitor if doc["kind"] == "ServiceMonitor" else check_prometheus_rule)(doc)
        return
    import kubernetes_validate  # here: every worker collects this module, few run it

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}") from None


def check_service_monitor(doc: dict) -> None:
    spec = doc["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}, set(spec)
    assert spec["selector"]["matchLabels"]
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}, set(endpoint)
        assert endpoint["path"] == "/metrics" and endpoint["port"]


def check_prometheus_rule(doc: dict) -> None:
    """The operator's fields: groups of named rules (their PromQL is checked by promtool in test_monitoring)."""
    assert set(doc["spec"]) == {"groups"}, set(doc["spec"])
    for group in doc["spec"]["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"] and group["rules"], group
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations"}, set(rule)
            assert rule["expr"] and ("alert" in rule) != ("record" in rule), rule


@pytest.mark.process
@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_manifest_is_valid_for_the_pinned_kubernetes(target):
    """No overlay needs the Prometheus Operator: every manifest has a schema and passes strict validation."""
    for doc in render(target):
        validate(doc)


def test_every_full_manifest_file_is_valid_on_its_own():
    """Runs without kubectl too: each file listed under `resources` (patches are partial by nature)."""
    for target in [*TARGETS, COMPONENT]:
        kustomization = yaml.safe_load((ROOT / target / "kustomization.yaml").read_text())
        for resource in kustomization["resources"]:
            if resource.startswith(".."):
                continue
            for doc in yaml.safe_load_all((ROOT / target / resource).read_text()):
                validate(doc, custom=target == COMPONENT)
        for patch in kustomization.get("patches", []):
            assert list(yaml.safe_load_all((ROOT / target / patch["path"]).read_text()))


def test_the_prometheus_operator_kinds_come_only_from_an_opt_in_component():
    kustomization = yaml.safe_load((ROOT / COMPONENT / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    for target in TARGETS:
        assert "components" not in yaml.safe_load((ROOT / target / "kustomization.yaml").read_text()), target
    from kubernetes_validate import SchemaNotFoundError

    with pytest.raises(SchemaNotFoundError):
        validate(yaml.safe_load((ROOT / COMPONENT / "servicemonitor.yaml").read_text()))


@pytest.mark.process
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_an_overlay_that_opts_in_scrapes_every_replica(overlay, tmp_path):
    docs = render(overlay, opted_in(tmp_path))
    for doc in docs:
        validate(doc, custom=True)
    monitor = by_kind(docs, "ServiceMonitor")
    service = by_kind(docs, "Service", "registry-proxy")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} <= service_ports
    plain = {(doc["kind"], doc["metadata"]["name"]) for doc in render(overlay)}
    added = {(doc["kind"], doc["metadata"]["name"]) for doc in docs} - plain
    assert added == {("ServiceMonitor", "registry-proxy"), ("PrometheusRule", "registry-proxy")}


def test_the_validation_can_fail():
    with pytest.raises(AssertionError, match="Deployment/x"):
        validate(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "x"},
                "spec": {"replicas": "three", "selector": {}, "template": {}},
            }
        )
    with pytest.raises(AssertionError):
        check_service_monitor({"spec": {"selector": {"matchLabels": {"a": "b"}}, "endpoints": [{"prot": "http"}]}})
    with pytest.raises(AssertionError):
        check_prometheus_rule({"spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "exp": "up == 0"}]}]}})


def proxy_container(docs: list[dict]) -> dict:
    return by_kind(docs, "Deployment", "registry-proxy")["spec"]["template"]["spec"]["containers"][0]


def settings(docs: list[dict]) -> dict[str, str]:
    return by_kind(docs, "ConfigMap", "registry-proxy-settings")["data"]


@pytest.mark.process
@pytest.mark.parametrize("target", TARGETS)
def test_the_proxy_pod_is_locked_down_and_probed(target):
    docs = render(target)
    pod = by_kind(docs, "Deployment", "registry-proxy")["spec"]["template"]["spec"]
    container = proxy_container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert container["args"] == ["serve"]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # the root filesystem is read-only
    assert {"emptyDir", "persistentVolumeClaim"} & set(volumes[mounts["/data"]])
    config = settings(docs)
    assert config["REGISTRY_PROXY_DATA_DIR"] == "/data"
    (port,) = container["ports"]
    assert config["REGISTRY_PROXY_LISTEN"].endswith(f":{port['containerPort']}")
    assert int(config["REGISTRY_PROXY_WORKERS"]) <= int(container["resources"]["limits"]["cpu"])
    # a secret file a setting names is a key of a mounted Secret
    for key in ("REGISTRY_PROXY_METADATA_SECRET_FILE", "REGISTRY_PROXY_AUTH_TOKENS"):
        if key in config:
            directory, _, name = config[key].rpartition("/")
            secret = by_kind(docs, "Secret", volumes[mounts[directory]]["secret"]["secretName"])
            assert name in secret["stringData"], key


@pytest.mark.process
@pytest.mark.parametrize("target", TARGETS)
def test_selectors_and_ports_meet(target):
    docs = render(target)
    deployment = by_kind(docs, "Deployment", "registry-proxy")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = by_kind(docs, "Service", "registry-proxy")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {port["name"] for port in proxy_container(docs)["ports"]}
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= port_names
    assert by_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    backend = by_kind(docs, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "registry-proxy" and backend["port"]["name"] in service_ports


@pytest.mark.process
@pytest.mark.parametrize("target", TARGETS)
def test_the_public_url_is_the_ingress_host_over_https(target):
    """Behind the Ingress (TLS there, plain HTTP to the pod) the proxy writes its URLs for the Ingress's host."""
    docs = render(target)
    ingress = by_kind(docs, "Ingress")["spec"]
    host = ingress["rules"][0]["host"]
    assert host in ingress["tls"][0]["hosts"]
    assert settings(docs)["REGISTRY_PROXY_PUBLIC_URL"] == f"https://{host}/"


@pytest.mark.process
def test_single_keeps_everything_on_one_persistent_volume():
    docs = render("overlays/single")
    deployment = by_kind(docs, "Deployment", "registry-proxy")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    data = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert set(data) == {"name", "persistentVolumeClaim"}
    by_kind(docs, "PersistentVolumeClaim", data["persistentVolumeClaim"]["claimName"])
    assert "REGISTRY_PROXY_REDIS_URL" not in settings(docs)
    assert not [doc for doc in docs if doc["kind"] == "HorizontalPodAutoscaler"]
    # the embedded store makes its own metadata secret on the volume: nothing to fill before applying
    assert not [doc for doc in docs if doc["kind"] == "Secret"]
    assert not {"REGISTRY_PROXY_METADATA_SECRET", "REGISTRY_PROXY_METADATA_SECRET_FILE"} & set(settings(docs))


@pytest.mark.process
async def test_single_starts_as_its_pod_would_with_nothing_filled_in(tmp_path):
    """The single overlay's container, run as a process: its ConfigMap as the environment, its volumes as
    directories (mounted Secrets as files of their keys), its args; only the listen port is a free one."""
    docs = render("overlays/single")
    container = proxy_container(docs)
    pod = by_kind(docs, "Deployment", "registry-proxy")["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    places = {}
    for mount in container["volumeMounts"]:
        place = places[mount["mountPath"]] = tmp_path / mount["name"]
        place.mkdir()
        if "secret" in volumes[mount["name"]]:
            for key, value in by_kind(docs, "Secret", volumes[mount["name"]]["secret"]["secretName"])[
                "stringData"
            ].items():
                (place / key).write_text(value)

    mounted = re.compile(rf"(?<![\w/])({'|'.join(map(re.escape, places))})(?=/|$)")

    def in_the_sandbox(value: str) -> str:
        return mounted.sub(lambda match: str(places[match[1]]), value)

    port = free_port()
    env = {name: value for name, value in os.environ.items() if not name.startswith("REGISTRY_PROXY_")}
    env.update({name: in_the_sandbox(value) for name, value in settings(docs).items()})
    env["REGISTRY_PROXY_LISTEN"] = f"127.0.0.1:{port}"
    log = tmp_path / "proxy.runtime.log"
    with open(log, "wb") as output:  # noqa: ASYNC230 - handed to the child process
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", *container["args"], env=env, stdout=output, stderr=output, cwd=tmp_path
        )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}/readyz", None, process, log.read_text, timeout=30)
    finally:
        await terminate(process, 15)
    assert (places["/data"] / "metadata" / "metadata.secret").is_file()


@pytest.mark.process
def test_fleet_shares_redis_and_s3_and_scales():
    docs = render("overlays/fleet")
    config = settings(docs)
    assert config["REGISTRY_PROXY_METADATA_SECRET_FILE"] and config["REGISTRY_PROXY_AUTH_TOKENS"]  # both mounted
    redis_service = by_kind(docs, "Service", "registry-proxy-redis")
    redis_port = redis_service["spec"]["ports"][0]["port"]
    assert config["REGISTRY_PROXY_REDIS_URL"] == f"redis://registry-proxy-redis:{redis_port}/0"
    redis_pod = by_kind(docs, "Deployment", "registry-proxy-redis")["spec"]["template"]
    assert redis_service["spec"]["selector"].items() <= redis_pod["metadata"]["labels"].items()
    assert redis_pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert config["REGISTRY_PROXY_ARCHIVE_STORE"].startswith("s3://")
    env = {item["name"]: item["valueFrom"]["secretKeyRef"] for item in proxy_container(docs)["env"]}
    assert set(env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    for ref in env.values():
        assert ref["key"] in by_kind(docs, "Secret", ref["name"])["stringData"]
    hpa = by_kind(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "registry-proxy"}
    deployment = by_kind(docs, "Deployment", "registry-proxy")
    assert hpa["spec"]["minReplicas"] > 1 and "replicas" not in deployment["spec"]  # the autoscaler's to set
    policy = by_kind(docs, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= redis_pod["metadata"]["labels"].items()
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
