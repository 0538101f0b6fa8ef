"""The Helm chart: renders and lints with Helm 4, every object is valid Kubernetes, RBAC is the
justified minimum, every container is locked down, and bad values are refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
from chart_fixtures import CHART, NAMESPACE, RELEASE, render

ROOT = Path(__file__).resolve().parents[1]
K8S_VERSION = "1.33.0"

EVERYTHING_ON: dict[str, Any] = {
    "redis": {"enabled": True},
    "serviceMonitor": {"enabled": True},
    "podMonitor": {"enabled": True},
    "prometheusRule": {
        "enabled": True,
        # not "prefixfleet": the shipped alerts' group (Prometheus refuses two groups of one name)
        "groups": [{"name": "mine", "rules": [{"alert": "Example", "expr": "vector(0) > 0"}]}],
    },
    "grafanaDashboards": {"enabled": True, "namespace": "monitoring"},
    "operator": {
        "watchNamespaces": ["team-a", "team-b"],
        "logLevel": "verbose",
        "defaultPrometheusUrl": "http://p:9090",
    },
    "rbac": {"scope": "namespace"},
    "imagePullSecrets": [{"name": "ghcr"}],
}
VALUE_SETS = {
    "defaults": {},
    "everything-on": EVERYTHING_ON,
    "cluster-scope-with-redis": {"redis": {"enabled": True}},
}

# Custom kinds kubernetes-validate has no schema for (checked by hand below).
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def bound_to_operator(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Roles and ClusterRoles a binding gives the operator's ServiceAccount: what it may do (the
    chart's other ClusterRoles, aggregated into admin/edit/view, are for people)."""
    (sa,) = by_kind(objects, "ServiceAccount")
    subject = {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in objects
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in b["subjects"]
    }
    return [
        r
        for r in objects
        if r["kind"] in ("ClusterRole", "Role")
        and (r["kind"], r["metadata"]["name"], r["metadata"].get("namespace")) in bound
    ]


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objects if o["kind"] == "Deployment"
    ]


# ------------------------------------------------------------------ render, lint, validate


def test_chart_metadata_and_crd(chart: helm_python.Chart) -> None:
    assert chart.metadata["apiVersion"] == "v2"
    assert chart.name == "prefixfleet"
    (crd,) = chart.crds
    assert (ROOT / "crds" / crd["filename"].split("/")[-1]).read_text() == crd["data"]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_chart_lints_clean(values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_object_is_valid_kubernetes(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    objects = render(chart, values)
    assert by_kind(objects, "Deployment"), "no operator Deployment rendered"
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1", name
            assert isinstance(obj["spec"], dict), name
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name}: {exc.message}")


def test_optional_parts_are_off_by_default(chart: helm_python.Chart) -> None:
    kinds = {o["kind"] for o in render(chart, {})}
    assert kinds == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "ConfigMap"}
    assert len(by_kind(render(chart, {}), "Deployment")) == 1  # the operator only, no Redis


def test_everything_on_renders_every_part(chart: helm_python.Chart) -> None:
    objects = render(chart, EVERYTHING_ON)
    kinds = {o["kind"] for o in objects}
    assert kinds >= PROMETHEUS_OPERATOR_KINDS
    assert {"Service", "Role", "RoleBinding", "NetworkPolicy"} <= kinds
    assert {d["metadata"]["name"] for d in by_kind(objects, "Deployment")} == {
        "prefixfleet-operator",
        "prefixfleet-redis",
    }
    (rule,) = by_kind(objects, "PrometheusRule")
    assert rule["spec"]["groups"][0]["rules"][0]["alert"] == "Example"


def test_prometheus_rule_with_no_rules_is_allowed(chart: helm_python.Chart) -> None:
    values = {"prometheusRule": {"enabled": True, "defaultAlerts": False}}
    (rule,) = by_kind(render(chart, values), "PrometheusRule")
    assert rule["spec"]["groups"] == []


# ------------------------------------------------------------------ operator Deployment


def test_operator_runs_kopf_with_a_liveness_endpoint_the_probe_uses(chart: helm_python.Chart) -> None:
    (deployment,) = [
        d for d in by_kind(render(chart, {}), "Deployment") if d["metadata"]["name"].endswith("operator")
    ]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["prefixfleet"]
    assert container["args"][:2] == ["operator", "run"]
    assert not any(a.startswith("--namespace") for a in container["args"]), "cluster-wide by default"
    liveness = next(a for a in container["args"] if a.startswith("--liveness="))
    port = next(p for p in container["ports"] if p["name"] == container["livenessProbe"]["httpGet"]["port"])
    assert liveness == f"--liveness=http://0.0.0.0:{port['containerPort']}/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def operator_args(chart: helm_python.Chart, values: dict[str, Any]) -> list[str]:
    (deployment,) = [
        d for d in by_kind(render(chart, values), "Deployment") if d["metadata"]["name"].endswith("operator")
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


@pytest.mark.parametrize(
    ("family", "liveness_host", "metrics_addr"), [("IPv4", "0.0.0.0", None), ("IPv6", "[::]", "::")]
)
def test_the_operator_listens_on_the_chosen_address_family(
    chart: helm_python.Chart, family: str, liveness_host: str, metrics_addr: str | None
) -> None:
    # An IPv6-only cluster's kubelet probes the pod's IPv6 address: 0.0.0.0 would fail that probe.
    # On IPv4 no --metrics-addr is passed, so PREFIXFLEET_METRICS_ADDR (operator.extraEnv) still applies.
    args = operator_args(chart, {"operator": {"ipFamily": family, "livenessPort": 9000}})
    assert f"--liveness=http://{liveness_host}:9000/healthz" in args
    given = [a.removeprefix("--metrics-addr=") for a in args if a.startswith("--metrics-addr")]
    assert given == ([metrics_addr] if metrics_addr else [])


def test_an_unknown_address_family_is_refused_by_name(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.render({"operator": {"ipFamily": "ipv6"}}, name=RELEASE, namespace=NAMESPACE)
    assert "ipFamily" in str(err.value)


def test_watched_namespaces_and_default_redis_reach_the_operator(chart: helm_python.Chart) -> None:
    objects = render(chart, EVERYTHING_ON)
    (container,) = next(
        d for d in by_kind(objects, "Deployment") if d["metadata"]["name"].endswith("operator")
    )["spec"]["template"]["spec"]["containers"]
    assert "--namespace=team-a" in container["args"] and "--namespace=team-b" in container["args"]
    assert "--verbose" in container["args"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PREFIXFLEET_REDIS_URL"] == "redis://prefixfleet-redis.prefixfleet.svc:6379/0"
    assert env["PREFIXFLEET_PROMETHEUS_URL"] == "http://p:9090"
    (service,) = by_kind(objects, "Service")
    assert service["metadata"]["name"] == "prefixfleet-redis" and service["spec"]["ports"][0]["port"] == 6379
    (policy,) = by_kind(objects, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prefixfleet"}


# ------------------------------------------------------------------ security


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_container_is_non_root_read_only_and_capability_free(
    chart: helm_python.Chart, values: dict[str, Any]
) -> None:
    for name, spec in pod_specs(render(chart, values)):
        pod_sc = spec.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True and pod_sc.get("runAsUser", 0) != 0, name
        assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        for container in spec["containers"] + spec.get("initContainers", []):
            where = f"{name}/{container['name']}"
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], where
            assert sc["seccompProfile"]["type"] == "RuntimeDefault", where
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), f"{where}: no requests"
            assert "memory" in container["resources"].get("limits", {}), f"{where}: no memory limit"


# ------------------------------------------------------------------ RBAC: every grant, justified

# (apiGroup, resource) -> {verb: why the operator needs it}. The chart must grant exactly this.
NAMESPACED_GRANTS: dict[tuple[str, str], dict[str, str]] = {
    ("prefixfleet.io", "prefixcachefleets"): {
        "get": "read a fleet by name when reconciling",
        "list": "kopf lists fleets on start-up",
        "watch": "kopf watches fleets for changes",
        "patch": "kopf's finalizer and last-handled-configuration annotation",
    },
    ("prefixfleet.io", "prefixcachefleets/status"): {
        "patch": "write observedGeneration, replicas, conditions, hot prefixes",
    },
    ("prefixfleet.io", "prefixcachefleets/scale"): {
        "patch": "the autoscaler sets the replica count",
    },
    ("prefixfleet.io", "prefixcachefleets/finalizers"): {
        "update": "children's ownerReferences with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
    },
    ("", "pods"): {
        "create": "replica pods are owned directly",
        "delete": "remove the scale-down victim, failed and outdated pods",
        "list": "observe the fleet's replicas",
        "watch": "readiness and membership changes",
        "patch": "warming/draining labels and annotations",
    },
    **{
        ("", kind): {
            "create": "create-if-absent child of the fleet",
            "delete": "replace on an immutable-field change",
            "get": "read the child by its explicit name",
            "patch": "follow spec changes, repair hand edits",
        }
        for kind in ("services", "configmaps")
    },
    ("apps", "deployments"): {
        "create": "the fleet's gateway Deployment",
        "delete": "replace on a selector change",
        "get": "read the child by its explicit name",
        "list": "kopf lists router Deployments (its readiness is the fleet's)",
        "watch": "kopf watches router Deployments",
        "patch": "follow spec changes (image, replicas, policy)",
    },
    ("", "events"): {"create": "kopf posts Events on fleets (it never patches one)"},
    ("", "secrets"): {"get": "the Redis URL/password Secret a fleet names (never list/watch)"},
}
CLUSTER_GRANTS: dict[tuple[str, str], dict[str, str]] = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {
        "list": "kopf resolves the served version of its resource",
        "watch": "kopf notices the CRD being (re)installed",
    },
}
# Only with operator.watchNamespaces: kopf run with --namespace follows namespaces (cluster-wide it does not).
NAMESPACE_GRANTS: dict[tuple[str, str], dict[str, str]] = {
    ("", "namespaces"): {"list": "kopf follows namespaces", "watch": "kopf follows new namespaces"},
}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    out = set()
    for rule in role["rules"]:
        assert "resourceNames" not in rule or rule["resources"] == ["secrets"]
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb))
    return out


def expected(table: dict[tuple[str, str], dict[str, str]]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for (group, resource), verbs in table.items() for verb in verbs}


def test_cluster_scope_grants_exactly_the_justified_table(chart: helm_python.Chart) -> None:
    objects = render(chart, {})
    (role,) = bound_to_operator(objects)
    assert grants(role) == expected(NAMESPACED_GRANTS) | expected(CLUSTER_GRANTS)
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    (sa,) = by_kind(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_namespace_scope_grants_namespaced_rights_only_in_watched_namespaces(
    chart: helm_python.Chart,
) -> None:
    objects = render(chart, EVERYTHING_ON)
    (cluster_role,) = by_kind(bound_to_operator(objects), "ClusterRole")
    assert grants(cluster_role) == expected(CLUSTER_GRANTS) | expected(NAMESPACE_GRANTS)
    roles = by_kind(bound_to_operator(objects), "Role")
    assert roles == by_kind(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert grants(role) == expected(NAMESPACED_GRANTS)
    assert sorted(b["metadata"]["namespace"] for b in by_kind(objects, "RoleBinding")) == ["team-a", "team-b"]


def test_a_cluster_scoped_operator_watching_some_namespaces_may_follow_namespaces(
    chart: helm_python.Chart,
) -> None:
    """rbac.scope=cluster with operator.watchNamespaces: `operator run --namespace` lists namespaces."""
    (role,) = bound_to_operator(render(chart, {"operator": {"watchNamespaces": ["team-a"]}}))
    assert grants(role) == expected(NAMESPACED_GRANTS) | expected(CLUSTER_GRANTS) | expected(NAMESPACE_GRANTS)


def test_secret_reads_can_be_turned_off(chart: helm_python.Chart) -> None:
    (role,) = bound_to_operator(render(chart, {"rbac": {"readSecrets": False}}))
    assert not any(resource == "secrets" for _, resource, _ in grants(role))


# ------------------------------------------------------------------ RBAC for people: admin, edit, view

# Kubernetes' built-in admin/edit/view ClusterRoles aggregate ClusterRoles labelled
# rbac.authorization.k8s.io/aggregate-to-<role>: "true". Each must grant exactly this on fleets.
FLEET_EDIT: dict[tuple[str, str], dict[str, str]] = {
    ("prefixfleet.io", "prefixcachefleets"): {
        **{
            verb: "users own fleets: kubectl apply/edit/delete/get pcf"
            for verb in ("create", "update", "patch", "delete", "get", "list", "watch")
        },
        "deletecollection": "delete a namespace's fleets in one call, as edit may for deployments",
    },
    ("prefixfleet.io", "prefixcachefleets/status"): {"get": "read what the operator writes (never write it)"},
    ("prefixfleet.io", "prefixcachefleets/scale"): {
        "get": "kubectl scale pcf reads the scale subresource",
        "patch": "kubectl scale pcf sets spec.replicas through it",
        "update": "kubectl scale --current-replicas / --resource-version",
    },
}
FLEET_VIEW: dict[tuple[str, str], dict[str, str]] = {
    **{
        ("prefixfleet.io", resource): {verb: "kubectl get/describe pcf" for verb in ("get", "list", "watch")}
        for resource in ("prefixcachefleets", "prefixcachefleets/status")
    },
    ("prefixfleet.io", "prefixcachefleets/scale"): {"get": "read the replica count (view: deployments too)"},
}
AGGREGATED = {"admin": FLEET_EDIT, "edit": FLEET_EDIT, "view": FLEET_VIEW}
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"
NAMESPACED_AS_PF = {
    "fullnameOverride": "pf",
    "rbac": {"scope": "namespace"},
    "operator": {"watchNamespaces": ["a"]},
}


def aggregated_roles(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ClusterRoles carrying an aggregate-to-* label, by the built-in role they extend."""
    out = {}
    for role in by_kind(objects, "ClusterRole"):
        labels = role["metadata"].get("labels", {})
        targets = [k.removeprefix(AGGREGATE_TO) for k in labels if k.startswith(AGGREGATE_TO)]
        assert len(targets) <= 1, f"{role['metadata']['name']} extends {targets}: one role each"
        for target in targets:
            assert labels[AGGREGATE_TO + target] == "true"
            out[target] = role
    return out


@pytest.mark.parametrize(
    ("values", "prefix"),
    [({}, "prefixfleet"), (NAMESPACED_AS_PF, "pf")],
    ids=["defaults", "fullnameOverride-namespace-scope"],
)
def test_admin_edit_and_view_may_use_fleets_by_default(
    chart: helm_python.Chart, values: dict[str, Any], prefix: str
) -> None:
    objects = render(chart, values)
    roles = aggregated_roles(objects)
    assert set(roles) == set(AGGREGATED)
    for target, table in AGGREGATED.items():
        role = roles[target]
        assert role["metadata"]["name"] == f"{prefix}-{target}"
        assert role["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert grants(role) == expected(table), target
        try:
            kubernetes_validate.validate(role, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"ClusterRole/{role['metadata']['name']}: {exc.message}")
    # for people only: nothing gives them to the operator
    referenced = {b["roleRef"]["name"] for b in objects if b["kind"].endswith("Binding")}
    assert not referenced & {r["metadata"]["name"] for r in roles.values()}


@pytest.mark.parametrize(
    "rbac", [{"aggregateToDefaultRoles": False}, {"create": False}], ids=["turned-off", "no-rbac"]
)
def test_the_aggregated_roles_can_be_turned_off(chart: helm_python.Chart, rbac: dict[str, Any]) -> None:
    objects = render(chart, {"rbac": rbac})
    assert aggregated_roles(objects) == {}
    assert by_kind(objects, "ClusterRole") == by_kind(bound_to_operator(objects), "ClusterRole")


def test_namespace_scope_without_namespaces_is_refused(chart: helm_python.Chart) -> None:
    with pytest.raises(helm_python.HelmError, match="watchNamespaces"):
        chart.render({"rbac": {"scope": "namespace"}}, name=RELEASE, namespace=NAMESPACE)


# ------------------------------------------------------------------ values.schema.json

BAD_VALUES = [
    ({"rbac": {"scope": "everything"}}, "scope"),
    ({"rbac": {"aggregateToDefaultRoles": "yes"}}, "aggregateToDefaultRoles"),
    ({"operator": {"logLevel": "debug"}}, "logLevel"),
    ({"redis": {"port": "six"}}, "port"),
    ({"redis": {"port": 70000}}, "port"),
    ({"operater": {}}, "operater"),
    ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ({"serviceMonitor": {"interval": "soon"}}, "interval"),
    ({"operator": {"resources": {"requests": {"memory": "lots"}}}}, "memory"),
    ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "watchNamespaces"),
    ({"operator": {"defaultRedisUrl": "localhost:6379"}}, "defaultRedisUrl"),
    ({"prometheusRule": {"groups": [{"rules": []}]}}, "name"),
]


@pytest.mark.parametrize(("values", "key"), BAD_VALUES, ids=[k for _, k in BAD_VALUES])
def test_values_schema_refuses_bad_values_naming_the_key(
    chart: helm_python.Chart, values: dict[str, Any], key: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.validate_schema(values)
    assert key in str(err.value)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_values_schema_accepts_good_values(chart: helm_python.Chart, values: dict[str, Any]) -> None:
    chart.validate_schema(values)


# Values that render a chart Helm accepts but that does nothing useful (or harm): each refused when
# Helm renders (`helm template`/`install` check values.schema.json), naming the key.
USELESS_VALUES = {
    "a PodMonitor scraping no port": ({"podMonitor": {"enabled": True, "ports": []}}, "ports"),
    "a PodMonitor whose ports were removed": ({"podMonitor": {"enabled": True, "ports": None}}, "ports"),
    "a PodMonitor scraping one port twice": (
        {"podMonitor": {"enabled": True, "ports": ["http"] * 2}},
        "ports",
    ),
    "a PodMonitor selecting every pod": ({"podMonitor": {"enabled": True, "selector": None}}, "selector"),
    "a ServiceMonitor selecting every Service": (
        {"serviceMonitor": {"enabled": True, "selector": None}},
        "selector",
    ),
    "a ServiceMonitor without a port": ({"serviceMonitor": {"enabled": True, "port": None}}, "port"),
    "Redis without a memory limit": ({"redis": {"enabled": True, "maxMemory": "0mb"}}, "maxMemory"),
    "a namespace watched twice": (
        {"operator": {"watchNamespaces": ["a", "a"]}, "rbac": {"scope": "namespace"}},
        "watchNamespaces",
    ),
}


@pytest.mark.parametrize(("values", "key"), USELESS_VALUES.values(), ids=USELESS_VALUES.keys())
def test_rendering_refuses_values_that_make_a_useless_object(
    chart: helm_python.Chart, values: dict[str, Any], key: str
) -> None:
    with pytest.raises(helm_python.HelmValuesError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert key in str(err.value)


def test_a_pod_monitor_with_its_defaults_scrapes_the_sidecar_port(chart: helm_python.Chart) -> None:
    (monitor,) = [
        m
        for m in by_kind(render(chart, {"podMonitor": {"enabled": True}}), "PodMonitor")
        if m["metadata"]["name"].endswith("replicas")
    ]
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["http"]
    assert monitor["spec"]["selector"]["matchLabels"]


def test_every_default_value_is_described_by_the_schema(chart: helm_python.Chart) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        for key, value in values.items():
            props = node.get("properties", {})
            assert key in props, f"{path}{key} is not in values.schema.json"
            if isinstance(value, dict) and props[key].get("properties"):
                walk(value, props[key], f"{path}{key}.")

    walk(chart.values, schema, "")


# ------------------------------------------------------------------ Grafana dashboards


def test_dashboards_ship_as_labelled_config_maps(chart: helm_python.Chart) -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert files
    maps = [
        m for m in by_kind(render(chart, EVERYTHING_ON), "ConfigMap") if "dashboard" in m["metadata"]["name"]
    ]
    assert len(maps) == len(files)
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring"
        for key, text in config_map["data"].items():
            assert json.loads(text) == json.loads((CHART / "dashboards" / key).read_text())


@pytest.mark.parametrize("path", sorted((CHART / "dashboards").glob("*.json")), ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
