"""deploy/kubernetes/components/micro-cache: the fleet overlay with the nginx front opted in renders, passes
strict validation, routes the Ingress to the front and the front to the proxy, and its nginx.conf caches
exactly as deploy/nginx.conf does (the same cache directives)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_kubernetes import ROOT, by_kind, render, validate
from tests.fakes.process import REPO_ROOT

MICRO_CACHE = "components/micro-cache"
CACHE_DIRECTIVES = re.compile(r"^\s*(proxy_cache\w*|proxy_no_cache|location ~)\b(.*)$", re.MULTILINE)


def with_front(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes whose fleet overlay opts in to the micro-cache, as its comment says."""
    copy = tmp_path / "kubernetes"
    shutil.copytree(ROOT, copy)
    path = copy / "overlays" / "fleet" / "kustomization.yaml"
    text = path.read_text()
    assert "add `- ../../components/micro-cache` under components" in text
    path.write_text(text + "components:\n  - ../../components/micro-cache\n")
    return copy


@pytest.mark.process
def test_the_fleet_with_the_front_is_valid_and_routes_through_it(tmp_path) -> None:
    docs = render("overlays/fleet", with_front(tmp_path))
    for doc in docs:
        validate(doc)
    ingress = by_kind(docs, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "registry-proxy-front", "port": {"name": "http"}}
    front = by_kind(docs, "Deployment", "registry-proxy-front")
    service = by_kind(docs, "Service", "registry-proxy-front")
    labels = front["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    proxy_labels = by_kind(docs, "Deployment", "registry-proxy")["spec"]["template"]["metadata"]["labels"]
    assert not all(proxy_labels.get(k) == v for k, v in service["spec"]["selector"].items())  # only the front
    config = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("registry-proxy-front")
    )
    volume = next(v for v in front["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config["metadata"]["name"]  # the generated (hashed) name
    assert "proxy_pass http://registry-proxy:80;" in config["data"]["nginx.conf"]
    container = front["spec"]["template"]["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_components_nginx_conf_caches_as_deploy_nginx_conf_does() -> None:
    shipped = (REPO_ROOT / "deploy" / "nginx.conf").read_text()
    component = (ROOT / MICRO_CACHE / "nginx.conf").read_text()

    def directives(text: str) -> dict[str, str]:
        return {
            name: value.split("#")[0].strip()
            for name, value in CACHE_DIRECTIVES.findall(text)
            if name != "proxy_cache_key"
        }

    assert directives(component) == directives(shipped)
    assert "proxy_cache_key" in component and "$request_uri" in component
    kustomization = yaml.safe_load((ROOT / MICRO_CACHE / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
