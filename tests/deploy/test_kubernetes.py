"""deploy/kubernetes: the base and each overlay rendered with `kubectl kustomize`, every manifest
validated against the pinned Kubernetes schema by kubernetes-validate, and the parts checked to fit
together (probes, security context, selectors, ports, secrets, settings)."""

from __future__ import annotations

import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml

from tests.fakes.process import REPO_ROOT

KUBERNETES_VERSION = "1.32.0"
ROOT = REPO_ROOT / "deploy" / "kubernetes"
TARGETS = ["base", "overlays/single", "overlays/fleet"]
KUBECTL = shutil.which("kubectl")
# CRDs have no schema in kubernetes-validate's set: checked field by field below instead
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}


def render(target: str) -> list[dict]:
    if KUBECTL is None:
        pytest.skip(
            "kubectl is missing: the overlays are not rendered (install kubectl for `kubectl kustomize`); "
            "the base's and overlays' own files are still validated one by one"
        )
    result = subprocess.run([KUBECTL, "kustomize", str(ROOT / target)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [doc for doc in docs if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def validate(doc: dict) -> None:
    if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
        check_service_monitor(doc)
        return
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


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_manifest_is_valid_for_the_pinned_kubernetes(target):
    for doc in render(target):
        validate(doc)


def test_every_full_manifest_file_is_valid_on_its_own():
    """Runs without kubectl too: each file listed under `resources` (patches are partial by nature)."""
    for target in TARGETS:
        kustomization = yaml.safe_load((ROOT / target / "kustomization.yaml").read_text())
        for resource in kustomization["resources"]:
            if resource.startswith(".."):
                continue
            for doc in yaml.safe_load_all((ROOT / target / resource).read_text()):
                validate(doc)
        for patch in kustomization.get("patches", []):
            assert list(yaml.safe_load_all((ROOT / target / patch["path"]).read_text()))


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


def proxy_container(docs: list[dict]) -> dict:
    return by_kind(docs, "Deployment", "registry-proxy")["spec"]["template"]["spec"]["containers"][0]


def settings(docs: list[dict]) -> dict[str, str]:
    return by_kind(docs, "ConfigMap", "registry-proxy-settings")["data"]


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
    # the metadata secret file is a key of the mounted Secret
    secret_dir = next(path for path, name in mounts.items() if "secret" in volumes[name])
    secret = by_kind(docs, "Secret", volumes[mounts[secret_dir]]["secret"]["secretName"])
    for key in ("REGISTRY_PROXY_METADATA_SECRET_FILE", "REGISTRY_PROXY_AUTH_TOKENS"):
        if key in config:
            directory, _, name = config[key].rpartition("/")
            assert directory == secret_dir and name in secret["stringData"], key


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
    monitor = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["spec"]["endpoints"]} <= service_ports
    backend = by_kind(docs, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == "registry-proxy" and backend["port"]["name"] in service_ports


def test_single_keeps_everything_on_one_persistent_volume():
    docs = render("overlays/single")
    deployment = by_kind(docs, "Deployment", "registry-proxy")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    data = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "data")
    assert set(data) == {"name", "persistentVolumeClaim"}
    by_kind(docs, "PersistentVolumeClaim", data["persistentVolumeClaim"]["claimName"])
    assert "REGISTRY_PROXY_REDIS_URL" not in settings(docs)
    assert not [doc for doc in docs if doc["kind"] == "HorizontalPodAutoscaler"]


def test_fleet_shares_redis_and_s3_and_scales():
    docs = render("overlays/fleet")
    config = settings(docs)
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
    assert hpa["spec"]["minReplicas"] == deployment["spec"]["replicas"] > 1
    policy = by_kind(docs, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= redis_pod["metadata"]["labels"].items()
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
