"""deploy/helm/registry-proxy: the chart rendered and linted by Helm's own Go engine (helm-python-sdk: Helm v4's SDK
loaded through ctypes, in this process; no helm binary, no child process) for its defaults and five value sets.

Every object passes strict validation against Kubernetes 1.32 (the Prometheus Operator's kinds field by field),
the settings reach the container (and the proxy's own parser accepts them), the parts meet (selectors, ports,
mounted files), values.schema.json refuses a misspelt key, a change of the policy rolls the pods, and
deploy/kubernetes is the chart's rendering (scripts/render_kustomize.py). Each value set is rendered once.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import tarfile
from collections import Counter
from typing import Any

import helm_python
import pytest
import yaml

import proxy
from proxy.cli import build_parser
from proxy.settings import command_line
from scripts import render_kustomize
from tests.deploy.test_kubernetes import by_kind, render, validate
from tests.fakes.process import REPO_ROOT

CHART = REPO_ROOT / "deploy" / "helm" / "registry-proxy"
RELEASE = "rp"
FULLNAME = "rp-registry-proxy"
POLICY = '[[rules]]\naction = "deny"\nproviders = ["registry.terraform.io/hashicorp/null"]\n'
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "single": {
        "persistence": {"size": "100Gi", "storageClass": "fast-ssd"},
        "policy": {"content": POLICY},
        "config": {"workers": "4", "allowHosts": ["registry.opentofu.org"]},
    },
    "fleet": {
        "replicaCount": 4,
        "redis": {"existingSecret": "fleet-redis", "existingSecretKey": "url"},
        "persistence": {"enabled": False},
        "s3": {
            "bucket": "tf-archives",
            "prefix": "proxy/cache",
            "endpoint": "https://minio.storage:9000",
            "pathStyle": True,
            "existingSecret": "minio-keys",
        },
        "authTokens": {"existingSecret": "fleet-tokens"},
    },
    "ingress": {
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "host": "tf.example.com",
            "tlsSecretName": "tf-example-com",
            "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
            "trustedProxies": ["10.42.0.0/16"],
        }
    },
    "everything": {
        "image": {"repository": "ghcr.io/example/registry-proxy", "tag": "0.1.0-rc1", "pullSecrets": ["ghcr"]},
        "redis": {"standalone": {"enabled": True}},
        "persistence": {"enabled": False},
        "s3": {
            "bucket": "tf-archives",
            "region": "eu-west-1",
            "credentials": {"accessKeyId": "AK", "secretAccessKey": "SK"},
        },
        "authTokens": {"content": '[tokens.ci]\nhash = "sha256:00"\n'},
        "policy": {"content": POLICY},
        "oidcIssuers": {"existingConfigMap": "ci-issuers", "key": "issuers.toml"},
        "ingress": {"enabled": True, "host": "tf.example.com"},
        "autoscaling": {"enabled": True, "minReplicas": 2},
        "networkPolicy": {"enabled": True},
        "metrics": {
            "serviceMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "labels": {"release": "kps"}},
        },
        "serviceAccount": {"create": True, "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/proxy"}},
        "extraArgs": ["--ttl-versions", "30m"],
        "extraEnv": [{"name": "REGISTRY_PROXY_LOG_LEVEL", "value": "debug"}],
        "podAnnotations": {"example.com/team": "platform"},
    },
}
# What each value set makes, by kind: the numbers the chart is judged by.
KINDS = {
    "defaults": {
        "ConfigMap": 1,
        "Deployment": 1,
        "Service": 1,
        "PersistentVolumeClaim": 1,
        "PodDisruptionBudget": 1,
        "Pod": 1,
    },
    "single": {
        "ConfigMap": 2,
        "Deployment": 1,
        "Service": 1,
        "PersistentVolumeClaim": 1,
        "PodDisruptionBudget": 1,
        "Pod": 1,
    },
    "fleet": {"ConfigMap": 1, "Deployment": 1, "Service": 1, "PodDisruptionBudget": 1, "Secret": 1, "Pod": 1},
    "ingress": {
        "ConfigMap": 1,
        "Deployment": 1,
        "Service": 1,
        "PersistentVolumeClaim": 1,
        "PodDisruptionBudget": 1,
        "Ingress": 1,
        "Pod": 1,
    },
    "everything": {
        "ConfigMap": 2,
        "Deployment": 2,
        "Service": 2,
        "PodDisruptionBudget": 1,
        "Secret": 3,
        "Ingress": 1,
        "HorizontalPodAutoscaler": 1,
        "NetworkPolicy": 2,
        "ServiceAccount": 1,
        "ServiceMonitor": 1,
        "PrometheusRule": 1,
        "Pod": 1,
    },
}
VALUES_POD_SECURITY = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
STAND_IN = {"REGISTRY_PROXY_REDIS_URL": "redis://redis.example:6379/0"}  # what a referenced Secret would hold


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def render_chart(values: dict[str, Any]) -> list[dict]:
    return render_kustomize.render_chart(values, release=RELEASE)


@functools.cache
def objects(value_set: str) -> list[dict]:
    """The value set's objects, rendered once per session."""
    return render_chart(VALUE_SETS[value_set])


def pod(docs: list[dict]) -> dict:
    return by_kind(docs, "Deployment", FULLNAME)["spec"]["template"]


def container(docs: list[dict]) -> dict:
    return pod(docs)["spec"]["containers"][0]


def doctor(docs: list[dict]) -> dict:
    """The `helm test` pod."""
    return by_kind(docs, "Pod", f"{FULLNAME}-doctor")


def environment(docs: list[dict]) -> dict[str, Any]:
    """The proxy container's variables: its ConfigMap's, then its own (a value, or the secretKeyRef)."""
    env: dict[str, Any] = {}
    for source in container(docs).get("envFrom", []):
        env.update(by_kind(docs, "ConfigMap", source["configMapRef"]["name"])["data"])
    for item in container(docs).get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom", {}).get("secretKeyRef"))
    return env


def mounted(docs: list[dict], path: str) -> tuple[dict, str]:
    """The volume a file path of the container lies in, and the key of its Secret or ConfigMap it is."""
    directory, _, name = path.rpartition("/")
    (mount,) = [mount for mount in container(docs)["volumeMounts"] if mount["mountPath"] == directory]
    (volume,) = [volume for volume in pod(docs)["spec"]["volumes"] if volume["name"] == mount["name"]]
    source = volume.get("secret") or volume["configMap"]
    assert [item["path"] for item in source["items"]] == [name]
    return volume, source["items"][0]["key"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_lints_the_chart_clean(value_set):
    report = helm_python.lint(CHART, VALUE_SETS[value_set], strict=True, kube_version="v1.32.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # only "icon is recommended" (info)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_object_is_valid_for_the_pinned_kubernetes(value_set):
    docs = objects(value_set)
    assert Counter(doc["kind"] for doc in docs) == KINDS[value_set]
    for doc in docs:
        validate(doc, custom=True)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_pod_is_locked_down_probed_and_selected(value_set):
    docs = objects(value_set)
    template, proxy_container = pod(docs), container(docs)
    assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert template["spec"]["securityContext"]["runAsUser"] == 10001 == template["spec"]["securityContext"]["fsGroup"]
    assert template["spec"]["automountServiceAccountToken"] is False
    assert proxy_container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert proxy_container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert proxy_container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert proxy_container["resources"]["limits"]["memory"] and proxy_container["args"][0] == "serve"
    labels = template["metadata"]["labels"]
    service = by_kind(docs, "Service", FULLNAME)
    assert service["spec"]["selector"].items() <= labels.items()
    assert {port["targetPort"] for port in service["spec"]["ports"]} <= {p["name"] for p in proxy_container["ports"]}
    assert by_kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    env = environment(docs)
    assert env["REGISTRY_PROXY_LISTEN"].endswith(f":{proxy_container['ports'][0]['containerPort']}")
    assert env["REGISTRY_PROXY_DATA_DIR"] in {mount["mountPath"] for mount in proxy_container["volumeMounts"]}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_the_proxy_accepts_every_setting_the_chart_writes(value_set, monkeypatch):
    """The container's variables and arguments, through the proxy's own parser (an unknown variable, a URL
    that is not one, a bad CIDR each fail it)."""
    docs = objects(value_set)
    monkeypatch.setattr(command_line, "path_problem", lambda *_: None)  # the files are the pod's mounts, not here
    for name in [name for name in os.environ if name.startswith("REGISTRY_PROXY_")]:
        monkeypatch.delenv(name)
    for name, value in environment(docs).items():
        if name.startswith("REGISTRY_PROXY_"):
            monkeypatch.setenv(name, value if isinstance(value, str) else STAND_IN[name])
    args = build_parser().parse_args(container(docs)["args"])
    assert args.command == "serve" and args.listen.port == 8080 and args.plain_http is True
    args = build_parser().parse_args(doctor(docs)["spec"]["containers"][0]["args"])  # serve's extraArgs too
    assert args.command == "doctor" and args.url == f"http://{FULLNAME}:80/"


def test_the_image_defaults_to_the_proxys_version():
    assert chart().metadata["appVersion"] == proxy.__version__
    assert container(objects("defaults"))["image"] == f"registry.example.internal/registry-proxy:{proxy.__version__}"
    everything = objects("everything")
    assert container(everything)["image"] == "ghcr.io/example/registry-proxy:0.1.0-rc1"
    assert pod(everything)["spec"]["imagePullSecrets"] == [{"name": "ghcr"}]


def test_the_defaults_keep_one_replica_on_a_volume_with_nothing_to_fill_in():
    docs = objects("defaults")
    deployment = by_kind(docs, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    data = next(v for v in pod(docs)["spec"]["volumes"] if v["name"] == "data")
    assert by_kind(docs, "PersistentVolumeClaim")["metadata"]["name"] == data["persistentVolumeClaim"]["claimName"]
    env = environment(docs)
    assert not {"REGISTRY_PROXY_PUBLIC_URL", "REGISTRY_PROXY_TRUSTED_PROXIES", "REGISTRY_PROXY_REDIS_URL"} & set(env)
    assert "REGISTRY_PROXY_METADATA_SECRET_FILE" not in env  # the embedded store makes its own on the volume
    single = objects("single")
    claim = by_kind(single, "PersistentVolumeClaim")["spec"]
    assert claim["storageClassName"] == "fast-ssd" and claim["resources"]["requests"]["storage"] == "100Gi"
    assert environment(single)["REGISTRY_PROXY_WORKERS"] == "4"


def test_the_ingress_sets_the_public_url_and_trusted_proxies():
    docs = objects("ingress")
    ingress = by_kind(docs, "Ingress")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["tf.example.com"], "secretName": "tf-example-com"}]
    assert ingress["metadata"]["annotations"]["cert-manager.io/cluster-issuer"] == "letsencrypt"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "tf.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    service = by_kind(docs, "Service", backend["name"])
    assert backend["port"]["name"] in {port["name"] for port in service["spec"]["ports"]}
    env = environment(docs)
    assert env["REGISTRY_PROXY_PUBLIC_URL"] == "https://tf.example.com/"
    assert env["REGISTRY_PROXY_TRUSTED_PROXIES"] == "10.42.0.0/16"


def test_the_fleet_shares_redis_from_a_secret_and_s3():
    docs = objects("fleet")
    env = environment(docs)
    assert env["REGISTRY_PROXY_REDIS_URL"] == {"name": "fleet-redis", "key": "url"}
    assert env["REGISTRY_PROXY_ARCHIVE_STORE"] == "s3://tf-archives/proxy/cache"
    assert env["REGISTRY_PROXY_S3_ENDPOINT_URL"] == "https://minio.storage:9000"
    assert env["REGISTRY_PROXY_S3_PATH_STYLE"] == "true"
    assert env["AWS_ACCESS_KEY_ID"] == {"name": "minio-keys", "key": "access-key-id"}
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "minio-keys", "key": "secret-access-key"}
    volume, key = mounted(docs, env["REGISTRY_PROXY_AUTH_TOKENS"])
    assert volume["secret"]["secretName"] == "fleet-tokens" and key == "auth-tokens.toml"
    # the metadata secret every replica shares: made by the chart, mounted, kept across upgrades and uninstalls
    volume, key = mounted(docs, env["REGISTRY_PROXY_METADATA_SECRET_FILE"])
    secret = by_kind(docs, "Secret", volume["secret"]["secretName"])
    assert len(base64.b64decode(secret["data"][key])) == 64
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    deployment = by_kind(docs, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 4 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert pod(docs)["spec"]["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert "emptyDir" in next(v for v in pod(docs)["spec"]["volumes"] if v["name"] == "data")


def test_everything_on_mounts_each_file_and_wires_each_part():
    docs = objects("everything")
    env = environment(docs)
    for variable, kind, name, content in [
        ("REGISTRY_PROXY_POLICY", "ConfigMap", f"{FULLNAME}-policy", POLICY),
        (
            "REGISTRY_PROXY_AUTH_TOKENS",
            "Secret",
            f"{FULLNAME}-auth-tokens",
            VALUE_SETS["everything"]["authTokens"]["content"],
        ),
        ("REGISTRY_PROXY_OIDC_ISSUERS", "ConfigMap", "ci-issuers", None),
    ]:
        volume, key = mounted(docs, env[variable])
        assert (volume.get("secret", {}).get("secretName") or volume["configMap"]["name"]) == name
        if content is not None:  # the chart's own object holds the content under that key
            data = by_kind(docs, kind, name)["data"][key]
            assert (base64.b64decode(data).decode() if kind == "Secret" else data) == content
    assert env["REGISTRY_PROXY_OIDC_ISSUERS"].endswith("/issuers.toml")
    assert env["REGISTRY_PROXY_REDIS_URL"] == f"redis://{FULLNAME}-redis:6379/0"
    redis_pod = by_kind(docs, "Deployment", f"{FULLNAME}-redis")["spec"]["template"]
    redis_service = by_kind(docs, "Service", f"{FULLNAME}-redis")
    assert redis_service["spec"]["selector"].items() <= redis_pod["metadata"]["labels"].items()
    assert env["AWS_ACCESS_KEY_ID"] == {"name": f"{FULLNAME}-s3", "key": "access-key-id"}
    assert env["REGISTRY_PROXY_S3_REGION"] == "eu-west-1" and env["REGISTRY_PROXY_LOG_LEVEL"] == "debug"
    assert container(docs)["args"] == ["serve", "--ttl-versions", "30m"]
    assert "replicas" not in by_kind(docs, "Deployment", FULLNAME)["spec"]  # the autoscaler's to set
    assert by_kind(docs, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]["name"] == FULLNAME
    assert pod(docs)["spec"]["serviceAccountName"] == by_kind(docs, "ServiceAccount")["metadata"]["name"]
    assert pod(docs)["metadata"]["annotations"]["example.com/team"] == "platform"
    policies = {doc["metadata"]["name"]: doc["spec"] for doc in docs if doc["kind"] == "NetworkPolicy"}
    assert policies[FULLNAME]["podSelector"]["matchLabels"].items() <= pod(docs)["metadata"]["labels"].items()
    redis_policy = policies[f"{FULLNAME}-redis"]
    assert redis_policy["podSelector"]["matchLabels"].items() <= redis_pod["metadata"]["labels"].items()
    allowed = redis_policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed.items() <= pod(docs)["metadata"]["labels"].items()


def test_the_monitoring_scrapes_the_service_as_job_registry_proxy_with_the_shipped_rules():
    docs = objects("everything")
    monitor = by_kind(docs, "ServiceMonitor")["spec"]
    service = by_kind(docs, "Service", FULLNAME)
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "registry-proxy"  # the job the alert rules name
    assert {endpoint["port"] for endpoint in monitor["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    rule = by_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    alerts = REPO_ROOT / "deploy" / "monitoring" / "alerts.yaml"
    assert rule["spec"]["groups"] == yaml.safe_load(alerts.read_text())["groups"]
    link = CHART / "files" / "alerts.yaml"
    assert link.is_symlink() and link.resolve() == alerts  # read from deploy/monitoring, not a copy


def test_the_packaged_chart_carries_the_alert_rules_themselves(tmp_path):
    """`helm package` stores the linked file's content: a chart pulled from a repository has the rules too."""
    archive = helm_python.package(CHART, destination=tmp_path)
    with tarfile.open(archive) as packed:
        member = packed.getmember("registry-proxy/files/alerts.yaml")
        assert member.isfile() and packed.extractfile(member).read() == (CHART / "files" / "alerts.yaml").read_bytes()


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_helm_test_runs_the_doctor_with_the_proxys_settings_against_its_service(value_set):
    """The test pod: `doctor --url` of the Service, with the proxy container's variables, files, identity and
    lock-down; the data dir the proxy's (an emptyDir like its own, or the claim on its node)."""
    docs = objects(value_set)
    test_pod, proxy_pod = doctor(docs), pod(docs)
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert test_pod["spec"]["restartPolicy"] == "Never"
    (checker,) = test_pod["spec"]["containers"]
    proxy_container = container(docs)
    service = by_kind(docs, "Service", FULLNAME)
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/"
    assert checker["args"] == ["doctor", "--url", url, *VALUE_SETS[value_set].get("extraArgs", [])]
    assert checker["image"] == proxy_container["image"]
    for key in ("envFrom", "env", "volumeMounts", "securityContext"):
        assert checker.get(key) == proxy_container.get(key), key
    assert test_pod["spec"]["volumes"] == proxy_pod["spec"]["volumes"]
    for key in ("securityContext", "automountServiceAccountToken", "serviceAccountName", "imagePullSecrets"):
        assert test_pod["spec"].get(key) == proxy_pod["spec"].get(key), key
    assert checker["resources"]["limits"]["memory"]
    # not the Service's nor the disruption budget's: no client is sent to the test pod
    assert not service["spec"]["selector"].items() <= test_pod["metadata"]["labels"].items()
    claim = next(v for v in proxy_pod["spec"]["volumes"] if v["name"] == "data").get("persistentVolumeClaim")
    if claim:  # ReadWriteOnce: a second pod mounts the claim only on the node of the pod that has it
        (term,) = test_pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= proxy_pod["metadata"]["labels"].items()
    else:
        assert "affinity" not in test_pod["spec"]


def admits(policy: dict, labels: dict[str, str]) -> bool:
    """Whether a NetworkPolicy lets in pods of this namespace with these labels by a podSelector of its own."""
    peers = [
        peer["podSelector"]["matchLabels"] for peer in policy["spec"]["ingress"][0]["from"] if "podSelector" in peer
    ]
    return any(peer.items() <= labels.items() for peer in peers)


def test_the_doctor_reaches_the_proxy_and_redis_through_the_network_policies():
    docs = objects("everything")
    labels = doctor(docs)["metadata"]["labels"]
    policies = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    assert len(policies) == 2 and all(admits(policy, labels) for policy in policies)


def test_a_claim_only_one_pod_may_mount_leaves_the_doctor_a_data_dir_of_its_own():
    docs = render_chart({"persistence": {"accessModes": ["ReadWriteOncePod"]}})
    test_pod = doctor(docs)
    data = next(v for v in test_pod["spec"]["volumes"] if v["name"] == "data")
    assert data == {"name": "data", "emptyDir": {"sizeLimit": "20Gi"}}
    assert "affinity" not in test_pod["spec"]
    validate(test_pod)


def test_tests_enabled_false_leaves_the_test_pod_out():
    docs = render_chart({**VALUE_SETS["everything"], "tests": {"enabled": False}})
    assert "Pod" not in {doc["kind"] for doc in docs}
    labels = doctor(objects("everything"))["metadata"]["labels"]
    policies = [doc for doc in docs if doc["kind"] == "NetworkPolicy"]
    assert len(policies) == 2 and not any(admits(policy, labels) for policy in policies)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"ingress": {"enabled": True, "tlsSecret": "tls"}}, "at '/ingress': additional properties 'tlsSecret'"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "at '/metrics/serviceMonitor': additional properties"),
        ({"persistence": {"size": "10Gi", "storageclass": "ssd"}}, "'storageclass' not allowed"),
        ({"config": {"logFormat": "xml"}}, "at '/config/logFormat'"),
    ],
)
def test_a_misspelt_or_wrong_value_fails_the_schema(values, where):
    with pytest.raises(helm_python.HelmValuesError, match=re.escape(where)):
        render_chart(values)
    assert any(where in error for error in helm_python.lint(CHART, values)["errors"])


@pytest.mark.parametrize(
    ("values", "refusal"),
    [
        ({"replicaCount": 2}, "more than one replica (replicaCount > 1 or autoscaling.enabled) needs Redis"),
        ({"replicaCount": 2, "redis": {"url": "redis://r:6379/0"}}, "cannot mount one ReadWriteOnce volume"),
    ],
)
def test_settings_that_cannot_work_together_fail_with_one_line(values, refusal):
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(refusal)):
        render_chart(values)


def test_a_changed_policy_rolls_the_pods_and_a_changed_setting_too():
    def annotations(values: dict[str, Any]) -> dict[str, str]:
        return pod(render_chart(values))["metadata"]["annotations"]

    before = pod(objects("single"))["metadata"]["annotations"]
    changed = annotations({**VALUE_SETS["single"], "policy": {"content": POLICY + "# reviewed\n"}})
    assert changed["checksum/policy"] != before["checksum/policy"]
    assert changed["checksum/settings"] == before["checksum/settings"]
    bigger = annotations({**VALUE_SETS["single"], "config": {"minFreeSpace": "5GiB"}})
    assert bigger["checksum/settings"] != before["checksum/settings"]
    # a ConfigMap the chart does not write has no checksum here: reload it with SIGHUP (or a reloader)
    assert not [name for name in pod(objects("everything"))["metadata"]["annotations"] if "oidc" in name]


def test_deploy_kubernetes_is_the_charts_rendering():
    """The kustomize files are scripts/render_kustomize.py's output, nothing more, nothing less."""
    wanted = render_kustomize.files()
    for target in render_kustomize.TARGETS:
        folder = render_kustomize.KUSTOMIZE / target.folder
        assert sorted(folder.glob("*.yaml")) == sorted(path for path in wanted if path.parent == folder), target
    for path, text in wanted.items():
        assert path.read_text() == text, f"{path.relative_to(REPO_ROOT)}: run scripts/render_kustomize.py"


def _comparable(node: Any) -> Any:
    """Named lists (containers, env, volumes) in name order: kustomize appends what a patch adds."""
    if isinstance(node, dict):
        return {key: _comparable(value) for key, value in node.items()}
    if isinstance(node, list):
        items = [_comparable(item) for item in node]
        return sorted(items, key=lambda item: item["name"]) if render_kustomize.named_list(node) else items
    return node


@pytest.mark.process
@pytest.mark.parametrize("target", [target for target in render_kustomize.TARGETS if not target.kinds])
def test_kustomize_builds_what_the_chart_renders(target):
    """`kubectl kustomize` of the base and of each overlay (its patches applied) equals the chart's objects."""
    built = {(doc["kind"], doc["metadata"]["name"]): _comparable(doc) for doc in render(target.folder)}
    charted = {
        (doc["kind"], doc["metadata"]["name"]): _comparable(render_kustomize.without_helm(doc))
        for doc in render_kustomize.render_chart(target.values)
    }
    assert built == charted


def test_the_fleet_values_the_deployment_guide_shows_render_valid_objects():
    guide = (REPO_ROOT / "docs" / "deployment.md").read_text()
    (shown,) = re.findall(r"```yaml\n(# fleet\.yaml: helm install .*?)```", guide, flags=re.DOTALL)
    docs = render_chart(yaml.safe_load(shown))
    for doc in docs:
        validate(doc, custom=True)
    assert environment(docs)["REGISTRY_PROXY_REDIS_URL"] == {"name": "registry-proxy-redis", "key": "redis-url"}
    assert {"HorizontalPodAutoscaler", "ServiceMonitor", "PrometheusRule"} <= {doc["kind"] for doc in docs}


def test_the_first_week_the_deployment_guide_walks_through_names_what_the_chart_makes():
    """docs/deployment.md's first week: its values render a valid two-replica fleet whose test pod runs the
    doctor it shows; its label selectors pick the proxy's pods; its restore pod is valid and mounts the claim."""
    guide = (REPO_ROOT / "docs" / "deployment.md").read_text()
    (shown,) = re.findall(r"```yaml\n(# two\.yaml: helm install .*?)```", guide, flags=re.DOTALL)
    fleet = render_kustomize.render_chart(yaml.safe_load(shown), release="registry-proxy")
    for doc in fleet:
        validate(doc, custom=True)
    assert by_kind(fleet, "Deployment", "registry-proxy")["spec"]["replicas"] == 2
    test_pod = by_kind(fleet, "Pod", "registry-proxy-doctor")
    assert f"registry-proxy {' '.join(test_pod['spec']['containers'][0]['args'])}`" in guide
    single = render_kustomize.render_chart({}, release="registry-proxy")
    labels = by_kind(single, "Deployment", "registry-proxy")["spec"]["template"]["metadata"]["labels"]
    selectors = re.findall(r" -l ([\w./=,-]+)", guide)
    assert selectors and all(
        dict(pair.split("=") for pair in s.split(",")).items() <= labels.items() for s in selectors
    )
    (restore_pod,) = re.findall(r"```yaml\n# restore-pod\.yaml: .*?\n(.*?)```", guide, flags=re.DOTALL)
    restore_pod = yaml.safe_load(restore_pod)
    validate(restore_pod)
    (claim,) = [volume["persistentVolumeClaim"]["claimName"] for volume in restore_pod["spec"]["volumes"]]
    assert claim == by_kind(single, "PersistentVolumeClaim")["metadata"]["name"]
    assert restore_pod["spec"]["securityContext"].items() <= VALUES_POD_SECURITY.items()
