"""Write the Prometheus Operator's PrometheusRule from the alert rules file, so both carry the same rules.

deploy/monitoring/alerts.yaml is the one place the alerts are written; run this after changing it
(`.venv/bin/python scripts/prometheus_rule.py`). tests/deploy/test_monitoring.py fails while the two differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "monitoring" / "alerts.yaml"
TARGET = ROOT / "deploy" / "kubernetes" / "components" / "prometheus-operator" / "prometheusrule.yaml"
HEADER = """\
# The alert rules of deploy/monitoring/alerts.yaml for the Prometheus Operator. Written by
# scripts/prometheus_rule.py: edit alerts.yaml, then run the script. If your Prometheus selects rules by a
# label (kube-prometheus-stack: `release: <its release name>`), add that label here or in your overlay.
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks, as they are written in alerts.yaml."""


def _string(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _string)


def prometheus_rule(rules: dict) -> dict:
    """The PrometheusRule resource holding `rules` (a parsed Prometheus rule file)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "registry-proxy", "labels": {"app.kubernetes.io/name": "registry-proxy"}},
        "spec": {"groups": rules["groups"]},
    }


def render(rules_text: str) -> str:
    document = prometheus_rule(yaml.safe_load(rules_text))
    return HEADER + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=120, allow_unicode=True)


def main() -> None:
    TARGET.write_text(render(RULES.read_text()))
    print(f"wrote {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
