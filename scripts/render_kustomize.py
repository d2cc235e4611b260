"""Write deploy/kubernetes (the kustomize base, its overlays and the Prometheus Operator component) from the
Helm chart, so both ways of deploying carry the same manifests, written once in the chart.

Each target is the chart rendered with Helm's own engine (helm-python-sdk) for one set of values, without what
only Helm uses (its labels, the checksum annotations) and with every Secret's values left empty to fill. The
base's objects are written whole; an overlay writes the objects the base lacks whole and the base's objects it
changes as strategic-merge patches. Run after changing the chart:
`.venv/bin/python scripts/render_kustomize.py`. tests/deploy/test_helm_chart.py fails while deploy/kubernetes
differs from what this writes; tests/deploy/test_kubernetes.py checks `kubectl kustomize` of each overlay equals
the chart's rendering.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "registry-proxy"
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
RELEASE = "registry-proxy"  # the objects' names then are the chart's own: registry-proxy, registry-proxy-redis...
HELM_ONLY = frozenset(
    {
        "helm.sh/chart",
        "helm.sh/resource-policy",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
    }
)
FILE_HEADER = (
    "# Written by scripts/render_kustomize.py from the Helm chart deploy/helm/registry-proxy: change the chart,\n"
    "# then run the script.\n"
)
SECRET_HEADER = "# Fill in before applying (or create the Secret yourself, with these keys).\n"
OPT_IN_COMPONENTS = """\
# With the Prometheus Operator (its CRDs installed), scrape /metrics and load the alert rules:
# components:
#   - ../../components/prometheus-operator
"""

# `helm test`'s doctor pod is Helm's alone: kubectl has no test hooks (run `registry-proxy doctor` with kubectl exec)
NO_TESTS = {"tests": {"enabled": False}}
BASE = {**NO_TESTS, "persistence": {"enabled": False}, "ingress": {"enabled": True}}
SINGLE = {**NO_TESTS, "persistence": {"enabled": True}, "ingress": {"enabled": True}}
FLEET = {
    **NO_TESTS,
    "persistence": {"enabled": False},
    "ingress": {"enabled": True},
    "autoscaling": {"enabled": True},
    "redis": {"standalone": {"enabled": True}},
    "s3": {
        "bucket": "registry-proxy-archives",
        "prefix": "cache",
        "region": "eu-central-1",
        "credentials": {"accessKeyId": "-", "secretAccessKey": "-"},  # emptied: to fill in, or IRSA
    },
    "authTokens": {"content": "-"},  # emptied: the tokens file to fill in
    "networkPolicy": {"enabled": True, "from": []},  # only the Redis policy: the proxy takes the ingress's and fronts'
}
MONITORING = {**BASE, "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}


@dataclass(frozen=True)
class Target:
    """One kustomize folder: the chart's values it renders and its kustomization.yaml's words."""

    folder: str
    values: dict[str, Any]
    about: str
    footer: str = ""
    base: str | None = None  # the folder whose objects this one patches
    kinds: frozenset[str] = field(default_factory=frozenset)  # only these kinds (a component)


TARGETS = (
    Target(
        "base",
        BASE,
        """\
# registry-proxy on Kubernetes: the parts every set-up shares. Deploy an overlay, not this directly:
#   kubectl apply -k deploy/kubernetes/overlays/single   # one replica, PVC, embedded metadata store
#   kubectl apply -k deploy/kubernetes/overlays/fleet    # replicas + HPA, Redis, archives in S3
# The proxy serves plain HTTP inside the cluster; the Ingress terminates TLS (clients need HTTPS).
# With the Prometheus Operator, add the opt-in component to your overlay (a ServiceMonitor and the alert rules):
#   components:
#     - ../../components/prometheus-operator
""",
    ),
    Target(
        "overlays/single",
        SINGLE,
        """\
# One replica with a persistent volume: archives and the embedded metadata store on the PVC. No Secret
# to fill: the metadata secret is made on the volume on first start (DATA_DIR/metadata/metadata.secret).
""",
        OPT_IN_COMPONENTS,
        base="base",
    ),
    Target(
        "overlays/fleet",
        FLEET,
        """\
# Several replicas (HPA) sharing one Redis for metadata and an S3 bucket for archives; clients need a token.
# Fill secret-metadata.yaml (`openssl rand -hex 32`), secret-auth-tokens.yaml (the tokens file) and
# secret-s3.yaml (or create the three Secrets yourself; without S3 keys: IRSA / workload identity), and set
# the bucket in patch-configmap-settings.yaml.
""",
        OPT_IN_COMPONENTS
        + """\
# A micro-cache of warm metadata between the Ingress and the replicas (docs/deployment.md#a-micro-cache-in-front):
# add `- ../../components/micro-cache` under components.
""",
        base="base",
    ),
    Target(
        "components/prometheus-operator",
        MONITORING,
        """\
# Opt-in, for clusters with the Prometheus Operator (its CRDs; without them the API server rejects these
# kinds): a ServiceMonitor scraping every replica and the alert rules of deploy/monitoring/alerts.yaml as a
# PrometheusRule. If your Prometheus selects them by a label (kube-prometheus-stack: `release: NAME`), add it
# in your overlay. Add to an overlay's kustomization.yaml:
#   components:
#     - ../../components/prometheus-operator
""",
        kinds=frozenset({"ServiceMonitor", "PrometheusRule"}),
    ),
)


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, TOML) as literal blocks."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)


def render_chart(values: dict[str, Any], release: str = RELEASE) -> list[dict[str, Any]]:
    """The chart's objects for `values`, as `helm template RELEASE CHART` would make them."""
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=release, namespace="default")
    return [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith(".yaml")
        for doc in yaml.load_all(text, Loader=yaml.CSafeLoader)
        if doc
    ]


def without_helm(node: Any) -> Any:
    """`node` without Helm's labels and annotations, and every Secret's values emptied (to fill in)."""
    if isinstance(node, list):
        return [without_helm(item) for item in node]
    if not isinstance(node, dict):
        return node
    kept = {
        key: without_helm(value)
        for key, value in node.items()
        if key not in HELM_ONLY and not str(key).startswith("checksum/")
    }
    for key in ("labels", "annotations"):
        if kept.get(key) == {}:
            del kept[key]
    if kept.get("kind") == "Secret" and "data" in kept:
        kept["stringData"] = dict.fromkeys(kept.pop("data"), "")
    return kept


def patch(base: Any, target: Any) -> Any:
    """The strategic-merge patch turning `base` into `target`: maps key by key (a key gone: null), lists of
    named items (containers, env, volumes) item by item, anything else replaced whole."""
    if isinstance(base, dict) and isinstance(target, dict):
        changes = {key: patch(base.get(key), value) for key, value in target.items() if base.get(key) != value}
        return changes | {key: None for key in base if key not in target}
    if named_list(base) and named_list(target):
        before = {item["name"]: item for item in base}
        changed = [item for item in target if before.get(item["name"]) != item]
        return [{"name": item["name"], **patch(before.get(item["name"], {}), item)} for item in changed]
    return target


def named_list(node: Any) -> bool:
    """A list of named items, merged by name in a strategic-merge patch."""
    return isinstance(node, list) and bool(node) and all(isinstance(item, dict) and "name" in item for item in node)


def file_name(doc: dict[str, Any]) -> str:
    suffix = doc["metadata"]["name"].removeprefix(RELEASE).lstrip("-")
    return f"{doc['kind'].lower()}{'-' + suffix if suffix else ''}.yaml"


def dump(doc: dict[str, Any]) -> str:
    header = FILE_HEADER + (SECRET_HEADER if doc["kind"] == "Secret" else "")
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def files() -> dict[Path, str]:
    """Every file this script writes under deploy/kubernetes, by path, with its text."""
    written: dict[Path, str] = {}
    objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
    for target in TARGETS:
        docs = [without_helm(doc) for doc in render_chart(target.values)]
        if target.kinds:
            docs = [doc for doc in docs if doc["kind"] in target.kinds]
        objects[target.folder] = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
        base = objects[target.base] if target.base else {}
        missing = set(base) - set(objects[target.folder])
        if missing:
            raise SystemExit(
                f"{target.folder} lacks {sorted(missing)} of {target.base}: an overlay only adds and patches"
            )
        resources, patches = [f"../../{target.base}"] if target.base else [], []
        folder = KUSTOMIZE / target.folder
        for key, doc in objects[target.folder].items():
            if key not in base:
                resources.append(file_name(doc))
                written[folder / file_name(doc)] = dump(doc)
            elif doc != base[key]:
                name = f"patch-{file_name(doc)}"
                patches.append(name)
                head = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": {"name": key[1]}}
                written[folder / name] = dump(head | patch(base[key], doc))
        written[folder / "kustomization.yaml"] = kustomization(target, resources, patches)
    return written


def kustomization(target: Target, resources: list[str], patches: list[str]) -> str:
    document: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/" + ("v1alpha1" if target.kinds else "v1beta1"),
        "kind": "Component" if target.kinds else "Kustomization",
        "resources": resources,
    }
    if patches:
        document["patches"] = [{"path": name} for name in patches]
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=120)
    return FILE_HEADER + target.about + body + target.footer


def main() -> None:
    wanted = files()
    for target in TARGETS:
        for stale in (KUSTOMIZE / target.folder).glob("*.yaml"):
            if stale not in wanted:
                stale.unlink()
    for path, text in wanted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
