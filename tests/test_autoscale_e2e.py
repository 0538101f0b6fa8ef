"""The prefix-aware autoscaler end to end in the emulated cluster, with the real clients: kubectl, the
operator process (kopf), the kubelet shim running engine emulators + sidecars + the gateway, Valkey.

Specification (a one-replica fleet allowed to grow to two, with short intervals set in its spec):
* a burst of requests sharing one long prefix loads the only replica beyond spec.autoscaling.targetLoad:
  the operator scales the fleet to 2 pods (status.lastScaleReason says why, an Event too);
* the new pod is pre-warmed with that prefix before it takes traffic: its first requests routed by the
  gateway with the prefix are cache hits on the whole prefix;
* after the burst the fleet scales back to 1, removing exactly the replica the planner named in its
  reason (the least valuable cache), and no request fails while it drains;
* the operator exports its metrics (scale events by action, replicas, max replicas, TTFT target);
* (in-process, the operator's pre-warm task against the emulated API server, real sidecars and Redis)
  a new pod is warmed when it arrives to a calm fleet (Event ``Prewarmed``), but skips its warm-up
  when a ready replica waits past saturation in the load records read as it arrives (Event
  ``PrewarmSkipped``, no warm request, the warming mark removed); pre-warming an existing pod never
  marks it warming (it keeps serving).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kopf
import kubernetes
import pytest
import yaml
from fleet_fixtures import free_port
from kopf._core.engines import posting  # where kopf.event queues an Event for the operator's poster
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.fleet.local import FleetSpec, LocalFleet
from prefixfleet.fleet.processes import Supervisor
from prefixfleet.operator.autoscale import ScalePolicy, SubtreeObservation
from prefixfleet.operator.autoscale_handlers import (
    AutoscaleContext,
    FleetAutoscale,
    OperatorMetrics,
    log_failed_warm_up,
    prewarm_replica,
)
from prefixfleet.operator.handlers import OperatorContext
from prefixfleet.operator.kube import Kube
from prefixfleet.operator.planner import (
    ANNOTATION_PORT_MAP,
    ANNOTATION_STATE,
    LABEL_FLEET,
    LABEL_ROLE,
    FleetRef,
)
from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS
from prefixfleet.tokenizer import tokenize
from tests.k8s.apiserver import ApiServerThread
from tests.k8s.cluster import (
    REPO,
    EmulatedCluster,
    OperatorProcess,
    operator_in_cluster,
    running_redis,
    wait_for,
)
from tests.test_fleet_autoscale import SLOW_ENGINE, saturated

pytestmark = pytest.mark.slow

FLEET = "auto"
REPLICA_SELECTOR = f"prefixfleet.io/fleet={FLEET},prefixfleet.io/role=replica"
PREFIX = "You are the support agent of the autoscaling tenant; follow the policy handbook closely. " * 60
PREFIX_TOKENS = len(tokenize(PREFIX)) // DEFAULT_BLOCK_TOKENS * DEFAULT_BLOCK_TOKENS


@pytest.fixture
def autoscaled(tmp_path: Path) -> Iterator[tuple[EmulatedCluster, OperatorProcess]]:
    with (
        running_redis(tmp_path) as redis_url,
        operator_in_cluster(
            tmp_path, redis_url, extra_args=["--metrics-port", str(free_port())], log_lines=80
        ) as env,
    ):
        yield env


def fleet_manifest() -> str:
    fleet = yaml.safe_load((REPO / "examples" / "emulator-fleet.yaml").read_text())
    fleet["metadata"]["name"] = FLEET
    fleet["spec"]["replicas"] = 1
    fleet["spec"]["router"] = {"replicas": 1}
    # a slow prefill (4k tokens/s) so a few clients load one replica; a roomy cache
    fleet["spec"]["engine"]["args"] = ["--prefill-tokens-per-s", "4000", "--cache-tokens", "60000"]
    fleet["spec"]["autoscaling"] = {
        "enabled": True, "minReplicas": 1, "maxReplicas": 2, "targetTTFTSeconds": 1.0,
        "intervalSeconds": 1, "scaleUpCooldownSeconds": 0, "scaleDownStabilizationSeconds": 4,
        "leadTimeSeconds": 0, "targetLoad": 0.5, "scaleDownLoad": 0.2, "hotRateRps": 0.2,
    }  # fmt: skip
    fleet["spec"]["prewarm"] = {"enabled": True, "topSubtrees": 2}
    return yaml.safe_dump(fleet)


def replica_pods(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    return cluster.kubectl_json("get", "pods", "-l", REPLICA_SELECTOR)["items"]


def ready_pods(cluster: EmulatedCluster) -> list[str]:
    return sorted(
        p["metadata"]["name"]
        for p in replica_pods(cluster)
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions", [])
        )
        and not p["metadata"].get("deletionTimestamp")
    )


def fleet(cluster: EmulatedCluster) -> dict[str, Any]:
    return cluster.kubectl_json("get", "pcf", FLEET)


def events(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    selector = f"involvedObject.name={FLEET}"
    return cluster.kubectl_json("get", "events", "--field-selector", selector)["items"]


def gateway_url(cluster: EmulatedCluster) -> str | None:
    deployment = cluster.kubectl_json("get", "deployment", f"{FLEET}-router")
    maps = (deployment["metadata"].get("annotations") or {}).get("prefixfleet.io/port-maps")
    return f"http://127.0.0.1:{json.loads(maps)[0]['8080']}" if maps else None


def gateway_healthy(gateway: str) -> bool:
    """The gateway answers /health with 200. Not listening yet is "not yet", not an error: the kubelet
    shim publishes the port map as it starts the process, so the address is known before it listens
    (a bare httpx.get in the wait ended the wait at once with ConnectError)."""
    try:
        return httpx.get(f"{gateway}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


class Traffic:
    """Client threads sending requests with PREFIX through the gateway; records every answer."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.answers: list[tuple[float, int, str, int]] = []  # (time, status, worker, cached tokens)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.sent = 0

    def _client(self, name: str, suffix_words: int, pause_s: float) -> None:
        with httpx.Client(timeout=60) as client:
            i = 0
            while not self.stop.is_set() and i < 10_000:
                i += 1
                tail = " ".join(f"{name}{i}w{j}" for j in range(suffix_words))
                body = {"text": PREFIX + tail, "sampling_params": {"max_new_tokens": 1}}
                try:
                    resp = client.post(f"{self.gateway}/generate", json=body)
                    status = resp.status_code
                    worker = resp.headers.get("X-Prefixfleet-Worker", "")
                    cached = resp.json()["meta_info"]["cached_tokens"] if status == 200 else -1
                except httpx.HTTPError:
                    status, worker, cached = 0, "", -1
                with self.lock:
                    self.answers.append((time.monotonic(), status, worker, cached))
                if pause_s:
                    self.stop.wait(pause_s)

    def start(self, clients: int, suffix_words: int, pause_s: float = 0.0) -> Traffic:
        for c in range(clients):
            t = threading.Thread(target=self._client, args=(f"c{c}x", suffix_words, pause_s), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def finish(self) -> list[tuple[float, int, str, int]]:
        self.stop.set()
        for t in self.threads:
            t.join(70)
        return list(self.answers)


@pytest.mark.timeout(300)
def test_burst_scales_up_prewarmed_then_down_removing_the_named_victim(
    autoscaled: tuple[EmulatedCluster, OperatorProcess],
) -> None:
    cluster, operator = autoscaled
    cluster.apply(fleet_manifest())
    first = wait_for(lambda: ready_pods(cluster) or None, 90, what="the first replica to be Ready")
    assert first == [f"{FLEET}-replica-0"]
    gateway = wait_for(lambda: gateway_url(cluster), 60, what="the gateway's address")
    wait_for(lambda: gateway_healthy(gateway), 60, what="the gateway")

    # the burst: four clients, long unique tails after the shared prefix keep the prefill busy
    burst = Traffic(gateway).start(clients=4, suffix_words=60)
    try:
        # 120 s: ~25 s alone; a clean-clone `make test` at load 5-9 once took over 60 s (stop 23)
        wait_for(lambda: fleet(cluster)["spec"]["replicas"] == 2, 120, what="the operator to scale up")
        up_reason = fleet(cluster)["status"]["lastScaleReason"]
        assert up_reason.startswith("scale up by 1")
        new_pod = wait_for(lambda: next((p for p in ready_pods(cluster) if p not in first), None), 90,
                           what="the new replica to be Ready")  # fmt: skip
        warmed = wait_for(
            lambda: next((e for e in events(cluster) if e["reason"] == "Prewarmed"), None), 90,
            what="the Prewarmed event",
        )  # fmt: skip
        assert new_pod in warmed["message"] and " 0 failed" in warmed["message"], warmed["message"]
        # let the gateway route some of the burst to the warmed replica
        wait_for(lambda: sum(1 for a in burst.answers if a[2] == new_pod) >= 3, 60,
                 what="requests routed to the new replica")  # fmt: skip
    finally:
        answers = burst.finish()
    assert all(status == 200 for _, status, _, _ in answers), {a[1] for a in answers}
    on_new = [cached for _, _, worker, cached in answers if worker == new_pod]
    # pre-warmed: its very first routed requests find the whole prefix cached
    assert on_new[:3] and all(c >= PREFIX_TOKENS for c in on_new[:3]), (on_new[:10], PREFIX_TOKENS)
    hot = fleet(cluster)["status"].get("hotPrefixes") or []
    assert hot and all(re.fullmatch(r"[0-9a-f]{16}", h["hash"]) for h in hot)

    # after the burst: light traffic only; the operator drains and removes the replica it names
    light = Traffic(gateway).start(clients=1, suffix_words=5, pause_s=0.3)
    try:
        wait_for(lambda: fleet(cluster)["spec"]["replicas"] == 1, 90, what="the operator to scale down")
        down_reason = fleet(cluster)["status"]["lastScaleReason"]
        named = re.search(r"drain (\S+)$", down_reason)
        assert named, down_reason
        victim = named.group(1)
        assert victim in (first[0], new_pod)
        survivor = first[0] if victim == new_pod else new_pod
        wait_for(lambda: ready_pods(cluster) == [survivor] and len(replica_pods(cluster)) == 1, 60,
                 what=f"{victim} to be drained and deleted")  # fmt: skip
        # requests sent right after the deletion are served by the survivor: wait for answers to
        # some (a fixed 1 s sleep might see none come back on a loaded machine)
        deleted_at = len(light.answers)
        wait_for(lambda: len(light.answers) >= deleted_at + 2, 30, what="2 answers after the deletion")
    finally:
        during_drain = light.finish()
    assert during_drain and all(status == 200 for _, status, _, _ in during_drain), [
        a for a in during_drain if a[1] != 200
    ]
    reasons = [e["reason"] for e in events(cluster)]
    assert {"ScalingUp", "ScalingDown", "Prewarmed", "DrainingReplica"} <= set(reasons), reasons

    # the operator's own metrics
    port = operator.extra_args[1]
    # a bound, not an expectation (was 5 s): the operator answers slowly on a loaded machine
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    samples = {
        (sample.name, sample.labels.get("action", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("fleet") == FLEET and sample.labels.get("namespace") == "default"
    }
    for action in ("scale_up", "scale_down", "prewarm", "drain"):
        assert samples[("prefixfleet_operator_scale_events_total", action)] == 1.0, action
    assert samples[("prefixfleet_operator_replicas", "")] == 1.0
    assert samples[("prefixfleet_operator_max_replicas", "")] == 2.0
    assert samples[("prefixfleet_operator_target_ttft_seconds", "")] == 1.0


SIDECAR_PORT = 8100  # the pods' container port; each pod's port map points it at its real sidecar


def replica_pod(name: str, sidecar_url: str) -> dict[str, Any]:
    """A Ready replica pod of FLEET as the kubelet reports it, its sidecar at ``sidecar_url``."""
    host_port = int(sidecar_url.rsplit(":", 1)[1])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {LABEL_FLEET: FLEET, LABEL_ROLE: "replica"},
            "annotations": {ANNOTATION_PORT_MAP: json.dumps({str(SIDECAR_PORT): host_port})},
        },
        "spec": {"containers": [{"name": "engine", "image": "emulator"}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip


@pytest.mark.timeout(60)
async def test_the_operator_warms_a_new_pod_only_if_the_fleet_is_not_queueing_for_it(tmp_path: Path) -> None:
    api = ApiServerThread().start()
    events: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    posting.settings_var.set(kopf.OperatorSettings())
    posting.event_queue_var.set(events)
    posting.event_queue_loop_var.set(asyncio.get_running_loop())
    policy = ScalePolicy(target_ttft_s=1.0)  # saturated: a ready replica waits more than 0.7 s
    auto = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient(timeout=5))
    try:
        async with Supervisor(tmp_path) as sup:
            # two replicas (engine + sidecar processes) publishing load records as the fleet "auto"
            ref = FleetRef(name=FLEET, namespace="default", uid="fleet-uid")
            spec = FleetSpec(replicas=2, gateways=0, engine=SLOW_ENGINE, fleet_name=ref.redis_fleet)
            local = LocalFleet(sup, spec)
            await local.start_engines()
            holder, new = local.replicas
            kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=api.url)))
            for replica in (holder, new):
                kube.create(replica_pod(replica.worker_id, replica.sidecar_url or ""))
            ctx = OperatorContext(kube=kube)
            # no round yet: the last round's view (none) would always warm; only a fresh read can skip
            state = FleetAutoscale(policy=policy, redis_url=local.redis_url)
            body = {"apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet",
                    "metadata": {"name": FLEET, "namespace": "default", "uid": ref.uid}}  # fmt: skip
            sid = "00000000c0ffee00"  # a subtree nobody holds: the warm request is made, its prefix fails

            async def prewarm(target: str, holders: set[str]) -> list[tuple[str, str]]:
                """The operator's pre-warm task for ``target``: the Events it posted (reason, message)."""
                subtrees = [SubtreeObservation(sid, tokens=64, rate_rps=1.0, holders=frozenset(holders))]
                await prewarm_replica(ctx, auto, state, body, ref, SIDECAR_PORT, target, [sid], subtrees,
                                      {holder.worker_id}, logging.getLogger("test"))  # fmt: skip
                posted = []
                while not events.empty():
                    event = events.get_nowait()
                    posted.append((event.reason, event.message))
                return posted

            def pod(name: str) -> dict[str, Any]:
                return kube.get("Pod", "default", name) or {}

            # calm: the new pod is warmed (its sidecar asked to copy the subtree from the holder)
            calm = await prewarm("new-0", {holder.worker_id})
            assert [reason for reason, _ in calm] == ["Prewarmed"], calm
            assert "1 failed" in calm[0][1] and new.worker_id in calm[0][1]

            # an existing pod keeps serving while it warms: never marked warming (nor touched at all)
            version = pod(holder.worker_id)["metadata"]["resourceVersion"]
            existing = await prewarm(holder.worker_id, {new.worker_id})
            assert [reason for reason, _ in existing] == ["Prewarmed"], existing
            assert pod(holder.worker_id)["metadata"]["resourceVersion"] == version

            # one warm-up per pod at a time: the next round planning the same one while it runs is a no-op
            state.warming_pods.add(holder.worker_id)  # a warm-up of it in flight
            assert await prewarm(holder.worker_id, {new.worker_id}) == []
            assert state.warming_pods == {holder.worker_id}  # the running one's mark is left alone
            state.warming_pods.clear()

            async with saturated(local, holder, policy):
                skipped = await prewarm("new-0", {holder.worker_id})
            assert [reason for reason, _ in skipped] == ["PrewarmSkipped"], skipped
            assert skipped[0][1].startswith(f"pod {new.worker_id}: a ready replica waits past saturation")
            assert ANNOTATION_STATE not in (pod(new.worker_id)["metadata"].get("annotations") or {})
            labels = {"namespace": "default", "fleet": FLEET, "action": "prewarm"}
            warmed = auto.metrics.registry.get_sample_value("prefixfleet_operator_scale_events_total", labels)
            assert warmed == 2  # the calm and the existing pod's warm-ups; none for the skipped one
    finally:
        await auto.http.aclose()
        api.stop()


async def test_a_warm_up_the_kubernetes_api_fails_is_logged_not_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # nobody awaits a warm-up task: without its done-callback the failure is asyncio's
    # "Task exception was never retrieved" at garbage collection, naming no pod
    dead = Kube(
        kubernetes.client.ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{free_port()}"))
    )
    ref = FleetRef(name=FLEET, namespace="default", uid="fleet-uid")
    auto = AutoscaleContext(OperatorMetrics(), httpx.AsyncClient(timeout=1))
    logger = logging.getLogger("test.prewarm")
    try:
        state = FleetAutoscale(policy=ScalePolicy())
        pod = "chat-replica-0"
        task = asyncio.create_task(
            prewarm_replica(OperatorContext(kube=dead), auto, state, {}, ref, SIDECAR_PORT, pod,
                            ["00000000c0ffee00"], [], {pod}, logger)
        )  # fmt: skip
        task.add_done_callback(functools.partial(log_failed_warm_up, logger, "chat-replica-0"))
        with caplog.at_level(logging.WARNING, logger="test.prewarm"):
            await asyncio.wait([task], timeout=60)
            await asyncio.sleep(0)  # done-callbacks run on the next loop iteration
        assert task.done() and task.exception() is not None
        assert any(r.getMessage().startswith("pre-warm of chat-replica-0 failed: ") for r in caplog.records)
    finally:
        await auto.http.aclose()
