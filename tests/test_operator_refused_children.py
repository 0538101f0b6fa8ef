"""A replica pod the API server refuses (422) is reported, not retried with a traceback.

The emulated API server here validates Pods the way kube-apiserver does for one common mistake a
spec.engine.podTemplate can carry past admission: a volumeMount naming no volume of the pod
(``spec.containers[0].volumeMounts[0].name: Not found: "models"``), answered as the same 422
``Status`` (reason ``Invalid``, the field in ``details.causes``).

The operator's Kubernetes calls turn such an answer into ``kube.ChildRefused``: one line naming the
child and the API server's reason. Escaping a kopf handler, it is logged as that line without a
traceback and retried later; fixing the spec lets the replica be created. The fleet shows it too:
Degraded=ChildRefused naming the pod and the reason, and one Warning Event (``operator/refusals.py``).
A refused replica pod ends that round's pod creates: the rest share its template. Unless an
admission webhook refused it: a webhook may judge each pod by itself (by name), so the round tries
the next missing replica, and ends at a second refusal (a webhook refusing every pod costs two
calls a round, not one per missing replica).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kubernetes.client.rest import ApiException

from prefixfleet.operator.kube import ChildRefused, Kube
from prefixfleet.operator.planner import PlannedEvent
from prefixfleet.operator.refusals import refusal_events, try_next_create, with_refusals
from tests.k8s.apiserver import ApiError, ApiServerThread, EmulatedApiServer, ResourceType
from tests.k8s.cluster import EmulatedCluster, OperatorProcess, running_redis, wait_for

pytestmark = pytest.mark.slow

FLEET = "refused"
NAMESPACE = "default"


class PodValidatingApiServer(EmulatedApiServer):
    """The emulator, plus kube-apiserver's check that every volumeMount names one of the pod's
    volumes (and that every container has an image), with its 422 answer."""

    def _admit(self, rt: ResourceType, obj: Any) -> Any:
        if rt.kind == "Pod" and isinstance(obj, dict):
            causes = pod_problems(obj.get("spec") or {})
            if causes:
                name = (obj.get("metadata") or {}).get("name", "")
                text = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
                raise ApiError(
                    422,
                    "Invalid",
                    f'Pod "{name}" is invalid: {text}',
                    {"name": name, "kind": "Pod", "causes": causes},
                )
        return super()._admit(rt, obj)


def pod_problems(spec: dict[str, Any]) -> list[dict[str, str]]:
    volumes = {v.get("name") for v in spec.get("volumes") or []}
    causes = []
    for i, container in enumerate(spec.get("containers") or []):
        if not container.get("image"):
            causes.append(
                {
                    "reason": "FieldValueRequired",
                    "message": "Required value",
                    "field": f"spec.containers[{i}].image",
                }
            )
        for j, mount in enumerate(container.get("volumeMounts") or []):
            if mount.get("name") not in volumes:
                causes.append(
                    {
                        "reason": "FieldValueNotFound",
                        "message": f'Not found: "{mount.get("name")}"',
                        "field": f"spec.containers[{i}].volumeMounts[{j}].name",
                    }
                )
    return causes


class CountingApiServer(PodValidatingApiServer):
    """... that also notes the name of every Pod it refused."""

    def __init__(self) -> None:
        super().__init__()
        self.refused_pods: set[str] = set()

    def _admit(self, rt: ResourceType, obj: Any) -> Any:
        try:
            return super()._admit(rt, obj)
        except ApiError:
            if rt.kind == "Pod":
                self.refused_pods.add((obj.get("metadata") or {}).get("name", ""))
            raise


class WebhookApiServer(CountingApiServer):
    """... behind a validating admission webhook that denies the Pods named in ``reserved`` (every
    Pod when it is None), answered as kube-apiserver words a webhook's denial."""

    def __init__(self, reserved: set[str] | None) -> None:
        super().__init__()
        self.reserved = reserved

    def _admit(self, rt: ResourceType, obj: Any) -> Any:
        name = (obj.get("metadata") or {}).get("name", "") if isinstance(obj, dict) else ""
        if rt.kind == "Pod" and (self.reserved is None or name in self.reserved):
            self.refused_pods.add(name)
            raise ApiError(
                403,
                "Forbidden",
                f'admission webhook "names.example.com" denied the request: pod name {name} is reserved',
            )
        return super()._admit(rt, obj)


class RefusingCluster(EmulatedCluster):
    """The emulated cluster with :class:`PodValidatingApiServer` (or ``server``) as its API server."""

    def __init__(self, workdir: Path, server: CountingApiServer | None = None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.server = CountingApiServer() if server is None else server
        self.api = ApiServerThread(self.server)
        self.api.start()
        self.kubeconfig = self.api.write_kubeconfig(workdir / "kubeconfig")
        self.kubelet = None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RefusingCluster]:
    cluster = RefusingCluster(tmp_path / "cluster")
    try:
        yield cluster
    finally:
        cluster.close()


def bad_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {"name": "engine", "image": "e", "volumeMounts": [{"name": "models", "mountPath": "/m"}]}
            ]
        },
    }


# ------------------------------------------------------------------ the Kubernetes calls


def test_a_refused_create_names_the_child_and_the_api_servers_reason(cluster: RefusingCluster) -> None:
    kube = Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    with pytest.raises(ChildRefused) as err:
        kube.create(bad_pod("chat-replica-0"))
    refused = err.value
    assert str(refused) == (
        'the API server refused Pod default/chat-replica-0 (422 Invalid): Pod "chat-replica-0" is invalid:'
        ' spec.containers[0].volumeMounts[0].name: Not found: "models"'
    )
    assert "\n" not in str(refused)
    # still what callers catching the client's error see
    assert isinstance(refused, ApiException) and refused.status == 422
    assert (refused.kind, refused.name, refused.api_reason) == ("Pod", "chat-replica-0", "Invalid")


def test_a_refused_patch_names_the_child_too(cluster: RefusingCluster) -> None:
    kube = Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    good = bad_pod("chat-replica-1")
    good["spec"]["volumes"] = [{"name": "models", "emptyDir": {}}]
    assert kube.create(good) is True
    changed = bad_pod("chat-replica-1")
    changed["spec"]["containers"][0]["volumeMounts"][0]["name"] = "cache"  # a volume it lacks
    with pytest.raises(ChildRefused, match=r"refused Pod default/chat-replica-1 \(422 Invalid\)"):
        kube.replace_spec(changed)


def test_other_errors_stay_as_they_were(cluster: RefusingCluster) -> None:
    kube = Kube(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    good = bad_pod("chat-replica-2")
    good["spec"]["volumes"] = [{"name": "models", "emptyDir": {}}]
    assert kube.create(good) is True
    assert kube.create(good) is False  # 409: already there
    assert kube.get("Pod", NAMESPACE, "missing") is None  # 404


# ------------------------------------------------------------------ the operator


def fleet_manifest(volume: bool, replicas: int = 1) -> str:
    template: dict[str, Any] = {
        "spec": {
            "containers": [{"name": "engine", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}]
        }
    }
    if volume:
        template["spec"]["volumes"] = [{"name": "models", "emptyDir": {}}]
    fleet = {
        "apiVersion": "prefixfleet.io/v1alpha1",
        "kind": "PrefixCacheFleet",
        "metadata": {"name": FLEET, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "emulated-model"},
            "engine": {"kind": "emulator", "podTemplate": template},
            "replicas": replicas,
            "router": {"replicas": 0},
        },
    }
    return yaml.safe_dump(fleet)


def child_refused(cluster: RefusingCluster) -> dict[str, Any] | None:
    """The fleet's Degraded condition when its reason is ChildRefused, else None."""
    status = cluster.kubectl_json("get", "pcf", FLEET).get("status") or {}
    cond = next((c for c in status.get("conditions", []) if c["type"] == "Degraded"), None)
    return cond if cond and cond["reason"] == "ChildRefused" else None


def test_the_operator_reports_a_refused_replica_pod_and_creates_it_once_fixed(
    tmp_path: Path, cluster: RefusingCluster
) -> None:
    with running_redis(tmp_path) as redis_url:
        operator = OperatorProcess(cluster, redis_url)
        try:
            cluster.install_crd()
            operator.start()
            cluster.apply(fleet_manifest(volume=False))

            refusal = (
                f'refused Pod {NAMESPACE}/{FLEET}-replica-0 (422 Invalid): Pod "{FLEET}-replica-0" is invalid'
            )

            cond = wait_for(lambda: child_refused(cluster), 40, what="Degraded=ChildRefused on the fleet")
            log = operator.log_path.read_text(errors="replace")
            assert "Traceback" not in log, operator.log_tail(60)
            assert cond["status"] == "True" and refusal in cond["message"], cond
            assert 'volumeMounts[0].name: Not found: "models"' in cond["message"], cond
            events = wait_for(
                lambda: cluster.kubectl_json("get", "events", "--field-selector", "reason=ChildRefused")[
                    "items"
                ],
                20,
                what="the ChildRefused Event",
            )
            assert [e["involvedObject"]["name"] for e in events] == [FLEET], events
            assert refusal in events[0]["message"] and events[0]["type"] == "Warning", events
            assert cluster.api.objects("pods", namespace=NAMESPACE) == []

            # the same fleet with the volume it mounts: the replica pod is created
            cluster.apply(fleet_manifest(volume=True))
            pods = wait_for(
                lambda: cluster.api.objects("pods", namespace=NAMESPACE), 40, what="the replica pod"
            )
            assert [p["metadata"]["name"] for p in pods] == [f"{FLEET}-replica-0"]
            wait_for(lambda: child_refused(cluster) is None, 40, what="the fleet to stop showing the refusal")
        finally:
            print("--- operator log (tail) ---\n" + operator.log_tail(60))
            operator.stop()


def test_a_refused_replica_stops_the_rounds_creates_instead_of_trying_every_replica(
    tmp_path: Path, cluster: RefusingCluster
) -> None:
    # five replicas of one refused template: the first refusal ends the round's creates (the others
    # would be refused the same way), so in every round the API server sees the first one only
    with running_redis(tmp_path) as redis_url:
        operator = OperatorProcess(cluster, redis_url)
        try:
            cluster.install_crd()
            operator.start()
            cluster.apply(fleet_manifest(volume=False, replicas=5))

            cond = wait_for(lambda: child_refused(cluster), 40, what="Degraded=ChildRefused on the fleet")
            # however many rounds ran by now (before: replica-0 to replica-4 in each)
            assert cluster.server.refused_pods == {f"{FLEET}-replica-0"}
            assert f"{FLEET}-replica-0" in cond["message"] and "more refused" not in cond["message"]
        finally:
            print("--- operator log (tail) ---\n" + operator.log_tail(60))
            operator.stop()


def test_a_webhook_refusal_lets_the_round_try_the_next_replica_and_a_second_refusal_ends_it() -> None:
    # told apart by the API server's wording, not the status code: a webhook picks its own (400
    # unless it sets one; 403 and 422 are common), and quotas and Pod Security answer 403 too
    webhook = 'admission webhook "names.example.com" denied the request: pod name x-replica-1 is reserved'
    quota = (
        'pods "x-replica-0" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2'
    )
    invalid = 'Pod "x-replica-0" is invalid: spec.containers[0].volumeMounts[0].name: Not found: "models"'
    security = 'pods "x-replica-0" is forbidden: violates PodSecurity "restricted:latest": privileged'
    assert try_next_create([webhook]) is True
    assert try_next_create([webhook, webhook]) is False
    for shared in (quota, invalid, security):
        assert try_next_create([shared]) is False
        assert try_next_create([webhook, shared]) is False
    assert try_next_create([]) is False


def test_a_webhook_refusing_one_replica_by_name_does_not_hold_back_the_others(tmp_path: Path) -> None:
    reserved = f"{FLEET}-replica-1"
    cluster = RefusingCluster(tmp_path / "cluster", WebhookApiServer({reserved}))
    try:
        with running_redis(tmp_path) as redis_url:
            operator = OperatorProcess(cluster, redis_url)
            try:
                cluster.install_crd()
                operator.start()
                cluster.apply(fleet_manifest(volume=True, replicas=4))
                cond = wait_for(lambda: child_refused(cluster), 40, what="Degraded=ChildRefused on the fleet")
                assert (
                    f"refused Pod {NAMESPACE}/{reserved} (403 Forbidden): admission webhook"
                    in cond["message"]
                )
                # before: replica-1 refused ended every round's creates, so 2 and 3 never came
                want = [f"{FLEET}-replica-{k}" for k in (0, 2, 3)]
                names = wait_for(
                    lambda: (
                        (
                            n := sorted(
                                p["metadata"]["name"]
                                for p in cluster.api.objects("pods", namespace=NAMESPACE)
                            )
                        )
                        == want
                        and n
                    ),
                    40,
                    what="the three replicas the webhook allows",
                )
                assert names == want and cluster.server.refused_pods == {reserved}
                assert "Traceback" not in operator.log_path.read_text(errors="replace")
            finally:
                print("--- operator log (tail) ---\n" + operator.log_tail(60))
                operator.stop()
    finally:
        cluster.close()


def test_a_webhook_refusing_every_replica_costs_two_calls_a_round_not_one_per_replica(tmp_path: Path) -> None:
    cluster = RefusingCluster(tmp_path / "cluster", WebhookApiServer(None))
    try:
        with running_redis(tmp_path) as redis_url:
            operator = OperatorProcess(cluster, redis_url)
            try:
                cluster.install_crd()
                operator.start()
                cluster.apply(fleet_manifest(volume=True, replicas=5))
                cond = wait_for(lambda: child_refused(cluster), 40, what="Degraded=ChildRefused on the fleet")
                assert cond["message"].endswith("is reserved (and 1 more refused)"), cond
                # however many rounds ran by now: replica-0 and replica-1 only, never 2 to 4
                assert cluster.server.refused_pods == {f"{FLEET}-replica-0", f"{FLEET}-replica-1"}
                assert cluster.api.objects("pods", namespace=NAMESPACE) == []
            finally:
                print("--- operator log (tail) ---\n" + operator.log_tail(60))
                operator.stop()
    finally:
        cluster.close()


def test_the_validating_api_server_accepts_the_operators_own_pods() -> None:
    from prefixfleet.operator import models, planner

    spec = models.validate_spec(json.loads(json.dumps(yaml.safe_load(fleet_manifest(volume=True))["spec"])))
    ref = planner.FleetRef(name=FLEET, namespace=NAMESPACE, uid="uid")
    template, template_hash = planner.replica_template(ref, spec, "redis://r:6379/0")
    assert pod_problems(planner.replica_pod(ref, template, template_hash, 0)["spec"]) == []


# ------------------------------------------------------------------ what the fleet shows (pure)

REFUSAL = (
    'the API server refused Pod default/chat-replica-0 (422 Invalid): Pod "chat-replica-0" is invalid:'
    ' spec.containers[0].volumeMounts[0].name: Not found: "models"'
)
PLANNED = {
    "replicas": 0,
    "conditions": [
        {"type": "Ready", "status": "False", "reason": "ReplicasNotReady", "lastTransitionTime": "T0"},
        {
            "type": "Degraded",
            "status": "False",
            "reason": "AsExpected",
            "message": "no failures observed",
            "lastTransitionTime": "T1",
            "observedGeneration": 3,
        },
    ],
}


def test_a_refusal_makes_the_fleet_degraded_naming_the_pod_and_the_reason() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status = with_refusals(PLANNED, [REFUSAL, REFUSAL.replace("-0", "-1")], PLANNED["conditions"], now)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded == {
        "type": "Degraded",
        "status": "True",
        "reason": "ChildRefused",
        "message": REFUSAL + " (and 1 more refused)",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": 3,
    }
    assert status["conditions"][0] == PLANNED["conditions"][0]  # Ready untouched
    assert PLANNED["conditions"][1]["reason"] == "AsExpected"  # the input is not changed


def test_a_refusal_repeated_every_round_changes_nothing_on_the_fleet() -> None:
    first = with_refusals(PLANNED, [REFUSAL], PLANNED["conditions"], datetime(2026, 1, 1, tzinfo=UTC))
    again = with_refusals(PLANNED, [REFUSAL], first["conditions"], datetime(2026, 1, 2, tzinfo=UTC))
    assert again == first  # same transition time: no status patch
    assert refusal_events([REFUSAL], PLANNED["conditions"]) == [
        PlannedEvent("Warning", "ChildRefused", REFUSAL)
    ]
    assert refusal_events([REFUSAL], first["conditions"]) == []  # one Event, not one per round
    other = REFUSAL.replace("models", "cache")
    assert [e.message for e in refusal_events([other], first["conditions"])] == [other]


def test_nothing_refused_leaves_the_planned_status_alone() -> None:
    assert with_refusals(PLANNED, [], PLANNED["conditions"]) == PLANNED
    assert refusal_events([], PLANNED["conditions"]) == []
