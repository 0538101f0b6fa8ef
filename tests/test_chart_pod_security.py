"""The chart's pods' uid, gid and fsGroup: fixed by default, left to the platform on request.

OpenShift's restricted-v2 SCC assigns each pod a uid (and fsGroup) from its namespace's range and
refuses a pod that asks for a fixed one outside it, such as the chart's 10001 (operator) or 999
(Redis). ``operator.podSecurityContext`` and ``redis.podSecurityContext`` hold those ids.

Specification: the defaults render as before; an id set to null (or the whole value set to null) is
left out of the pod's securityContext while runAsNonRoot, the seccomp profile and the containers'
lockdown stay; a root uid, or a key that would weaken the pod (runAsNonRoot), is refused by name.
"""

from __future__ import annotations

from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_fixtures import render

from tests.test_chart import K8S_VERSION, by_kind

IDS = ("runAsUser", "runAsGroup", "fsGroup")
LOCKED_CONTAINER = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def deployments(chart: helm_python.Chart, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """component (operator, redis) -> its Deployment."""
    objects = render(chart, {"redis": {"enabled": True}} | values)
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in by_kind(objects, "Deployment")}


def test_the_defaults_pin_the_images_users(chart: helm_python.Chart) -> None:
    pods = {c: d["spec"]["template"]["spec"]["securityContext"] for c, d in deployments(chart, {}).items()}
    seccomp = {"type": "RuntimeDefault"}
    assert pods == {
        "operator": {"runAsNonRoot": True, "seccompProfile": seccomp} | dict.fromkeys(IDS, 10001),
        "redis": {"runAsNonRoot": True, "seccompProfile": seccomp} | dict.fromkeys(IDS, 999),
    }


UNSET = {
    "each id null": {
        "operator": {"podSecurityContext": dict.fromkeys(IDS)},
        "redis": {"enabled": True, "podSecurityContext": dict.fromkeys(IDS)},
    },
    "the whole value null": {
        "operator": {"podSecurityContext": None},
        "redis": {"enabled": True, "podSecurityContext": None},
    },
    # what docs/operator.md's OpenShift install passes, through Helm's own --set parser
    "--set ...=null": helm_python.parse_set_string(
        "redis.enabled=true,operator.podSecurityContext=null,redis.podSecurityContext=null"
    ),
}


@pytest.mark.parametrize("values", UNSET.values(), ids=UNSET.keys())
def test_null_ids_are_left_to_the_platform_and_the_pod_stays_locked(
    chart: helm_python.Chart, values: dict[str, Any]
) -> None:
    for component, deployment in deployments(chart, values).items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        (container,) = pod["containers"]
        assert container["securityContext"] == LOCKED_CONTAINER, component
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_one_id_null_keeps_the_others(chart: helm_python.Chart) -> None:
    values = {"operator": {"podSecurityContext": {"runAsUser": None, "runAsGroup": 5000}}}
    pod = deployments(chart, values)["operator"]["spec"]["template"]["spec"]["securityContext"]
    assert "runAsUser" not in pod and pod["runAsGroup"] == 5000 and pod["fsGroup"] == 10001


REFUSED = {
    "a root uid": (
        {"operator": {"podSecurityContext": {"runAsUser": 0}}},
        "/operator/podSecurityContext/runAsUser",
    ),
    "a uid as a word": (
        {"redis": {"podSecurityContext": {"runAsUser": "999"}}},
        "/redis/podSecurityContext/runAsUser",
    ),
    "runAsNonRoot turned off": (
        {"operator": {"podSecurityContext": {"runAsNonRoot": False}}},
        "runAsNonRoot",
    ),
}


@pytest.mark.parametrize(("values", "key"), REFUSED.values(), ids=REFUSED.keys())
def test_a_weakening_or_mistyped_id_is_refused_by_name(
    chart: helm_python.Chart, values: dict[str, Any], key: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        deployments(chart, values)
    assert key in str(err.value)
