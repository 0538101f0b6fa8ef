"""operator.podLabels / podAnnotations add to the operator pod's own, never replace them.

The template wrote the pod's selector labels and then the user's: ``operator.podLabels`` with
``app.kubernetes.io/name`` (or ``instance``, ``component``) rendered one mapping key twice, which
Kubernetes' YAML decoding (kubectl's, Helm's) reads last-one-wins: a pod template the Deployment's
selector does not match, which the API server refuses ("selector does not match template labels").
``podAnnotations`` with ``checksum/crd`` silently replaced the chart's restart-on-CRD-change checksum.
The chart now refuses such keys by name; other labels and annotations reach the pod.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml
from test_chart_notes import CHART

OWN = {
    "podLabels": ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component"],
    "podAnnotations": ["checksum/crd"],
}


def deployment_text(values: dict[str, Any]) -> str:
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name="prefixfleet", namespace="prefixfleet")
    (text,) = [t for path, t in rendered.items() if path.endswith("/deployment.yaml")]
    return text


@pytest.mark.parametrize(("value", "key"), [(v, k) for v, keys in OWN.items() for k in keys])
def test_a_key_of_the_pods_own_is_refused_by_name(value: str, key: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        deployment_text({"operator": {value: {key: "mine"}}})
    assert f"operator.{value}" in str(err.value) and key in str(err.value)


def test_other_labels_and_annotations_reach_the_pod_next_to_its_own() -> None:
    values = {"operator": {"podLabels": {"team": "ml"}, "podAnnotations": {"owner": "ops"}}}
    text = deployment_text(values)
    (deployment,) = [d for d in yaml.safe_load_all(text) if d]
    metadata = deployment["spec"]["template"]["metadata"]
    assert metadata["labels"]["team"] == "ml" and metadata["annotations"]["owner"] == "ops"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= metadata["labels"].items()
    labels_block = text[text.index("template:") :].split("annotations:")[0]
    assert labels_block.count("app.kubernetes.io/name:") == 1
