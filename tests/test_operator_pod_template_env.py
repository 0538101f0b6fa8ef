"""A container's env in a podTemplate merges by name into the operator's own container.

It replaced the generated list: `spec.router.podTemplate` adding HTTP_PROXY to the `gateway`
container dropped REDIS_URL and the Redis password, and the gateway (started with
`--redis $(REDIS_URL)`) exited at start on every pod; the same for the replica `sidecar` (POD_NAME,
POD_IP, REDIS_URL), and `spec.engine.env` vanished when the engine container's env was templated.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixfleet.operator import models
from prefixfleet.operator.planner import FleetRef, desired_children, replica_template

FLEET = FleetRef(name="chat", namespace="team-a", uid="uid-1")
REDIS = "redis://r:6379/0"
PROXY = {"name": "HTTP_PROXY", "value": "http://proxy:3128"}


def _spec(**parts: Any) -> models.FleetSpec:
    return models.validate_spec(
        {
            "model": {"name": "m"},
            "engine": {"kind": "emulator", **parts.get("engine", {})},
            "router": parts.get("router", {}),
            "redis": {"url": REDIS, "passwordSecretRef": {"name": "redis", "key": "password"}},
        }
    )


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names)), names  # one entry per name, as the API server expects
    return {e["name"]: e for e in container["env"]}


def _gateway(spec: models.FleetSpec) -> dict[str, Any]:
    (deployment,) = [c for c in desired_children(FLEET, spec, REDIS) if c["kind"] == "Deployment"]
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"]
    return container


def _replica(spec: models.FleetSpec, name: str) -> dict[str, Any]:
    template, _ = replica_template(FLEET, spec, REDIS)
    (container,) = [c for c in template["spec"]["containers"] if c["name"] == name]
    return container


def test_a_variable_added_to_the_gateway_keeps_the_operators_own() -> None:
    plain = _env(_gateway(_spec()))
    assert {"REDIS_URL", "PREFIXFLEET_REDIS_PASSWORD"} <= set(plain)
    template = {"spec": {"containers": [{"name": "gateway", "env": [PROXY]}]}}
    env = _env(_gateway(_spec(router={"podTemplate": template})))
    assert env == {**plain, "HTTP_PROXY": PROXY}


def test_a_variable_added_to_the_sidecar_keeps_the_operators_own() -> None:
    plain = _env(_replica(_spec(), "sidecar"))
    assert {"POD_NAME", "POD_IP", "REDIS_URL", "PREFIXFLEET_REDIS_PASSWORD"} <= set(plain)
    template = {"spec": {"containers": [{"name": "sidecar", "env": [PROXY]}]}}
    env = _env(_replica(_spec(engine={"podTemplate": template}), "sidecar"))
    assert env == {**plain, "HTTP_PROXY": PROXY}


def test_spec_engine_env_and_the_engine_containers_templated_env_both_reach_the_engine() -> None:
    cache = {"name": "HF_HOME", "value": "/cache"}
    template = {"spec": {"containers": [{"name": "engine", "env": [PROXY]}]}}
    env = _env(_replica(_spec(engine={"env": [cache], "podTemplate": template}), "engine"))
    assert env == {"HF_HOME": cache, "HTTP_PROXY": PROXY}


@pytest.mark.parametrize("where", ["gateway", "sidecar"])
def test_a_templated_variable_of_the_operators_name_replaces_it_whole(where: str) -> None:
    # value and valueFrom exclude each other: a deep merge would give the API server both
    mine = {"name": "PREFIXFLEET_REDIS_PASSWORD", "value": "from-the-template"}
    template = {"spec": {"containers": [{"name": where, "env": [mine]}]}}
    if where == "gateway":
        container = _gateway(_spec(router={"podTemplate": template}))
    else:
        container = _replica(_spec(engine={"podTemplate": template}), where)
    env = _env(container)
    assert env["PREFIXFLEET_REDIS_PASSWORD"] == mine
    assert "REDIS_URL" in env


@pytest.mark.parametrize(
    "volume", [{"name": "settings", "configMap": {"name": "mine"}}, {"name": "settings", "emptyDir": {}}]
)
def test_the_gateways_settings_volume_is_the_operators(volume: dict[str, Any]) -> None:
    # it was merged into the operator's: another ConfigMap mounted in its place (pods waiting for a
    # ConfigMap that may not exist), or two volume sources the API server refuses the Deployment for
    template = {"spec": {"volumes": [volume]}}
    with pytest.raises(models.InvalidFleetSpec) as exc:
        _spec(router={"podTemplate": template})
    assert (
        "spec.router.podTemplate.spec.volumes: 'settings' is the operator's own volume in every gateway pod"
        in str(exc.value)
    )
    # replica pods have no volume of the operator's: the name is free there
    spec = _spec(engine={"podTemplate": template})
    assert replica_template(FLEET, spec, REDIS)[0]["spec"]["volumes"] == [volume]


def test_a_port_and_a_mount_added_to_the_gateway_keep_the_operators_own() -> None:
    # the 'http' port is what the readiness probe and the gateway Service target: replacing the
    # ports list left the gateway never ready and the Service without endpoints
    plain = _gateway(_spec())
    port = {"name": "metrics", "containerPort": 9100}
    mount = {"name": "ca", "mountPath": "/etc/ssl/redis"}
    template = {
        "spec": {
            "containers": [{"name": "gateway", "ports": [port], "volumeMounts": [mount]}],
            "volumes": [{"name": "ca", "secret": {"secretName": "redis-ca"}}],
        }
    }
    gateway = _gateway(_spec(router={"podTemplate": template}))
    assert gateway["ports"] == [*plain["ports"], port]
    assert gateway["volumeMounts"] == [*plain["volumeMounts"], mount]
    assert gateway["readinessProbe"]["httpGet"]["port"] in {p["name"] for p in gateway["ports"]}


def test_entries_without_a_usable_key_are_passed_on_for_the_api_server_to_refuse() -> None:
    # no crash on a port whose containerPort is an object (the models do not read container fields)
    odd = {"name": "odd", "containerPort": {"x": 1}}
    template = {"spec": {"containers": [{"name": "gateway", "ports": [odd], "env": "not a list"}]}}
    gateway = _gateway(_spec(router={"podTemplate": template}))
    assert gateway["ports"][-1] == odd
    assert gateway["env"] == "not a list"
