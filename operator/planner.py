"""The level-based reconcile plan of a PrefixCacheFleet: desired children from spec + observed state.

``plan_reconcile(fleet, observed) -> ReconcilePlan`` is a pure function over plain data: the kopf
handlers observe (list pods and children), call it, and execute the plan; executing it and
re-planning yields an empty plan (idempotent), so the operator can be killed at any point and
simply re-runs it.

Why the operator owns replica Pods directly (not a Deployment/StatefulSet): it must choose exactly
which replica to remove (the autoscaler's least valuable cache, ``victims``) and which to pre-warm.

Naming is deterministic: replica ``k`` is ``{fleet}-replica-{k}`` with ``k`` the smallest index no
existing pod uses, so a crash between "create" and "record it" can never produce a duplicate — the
next plan sees the pod and the create of the same name answers 409.

Rolling update (template hash changed): Deployment-style with surge 1 and max unavailable 0 — at
most ``replicas + 1`` pods exist, an outdated pod is deleted only when the ready count stays at or
above ``replicas`` without it; outdated pods that are not ready go at once (they serve nothing).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs, urlsplit

from prefixfleet.router.addresses import base_url

from .last_applied import ANNOTATION_LAST_APPLIED, labels_patch, labels_record, recorded_labels
from .models import (
    API_VERSION,
    KIND,
    MERGED_BY_NAME,
    PROJECT_IMAGE,
    ROUTER_SETTINGS_VOLUME,
    EngineKind,
    FleetSpec,
    last_flag_value,
)

JSON = dict[str, Any]

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_FLEET = "prefixfleet.io/fleet"
LABEL_ROLE = "prefixfleet.io/role"
LABEL_TEMPLATE_HASH = "prefixfleet.io/template-hash"
ANNOTATION_TEMPLATE_HASH = "prefixfleet.io/template-hash"
ANNOTATION_SPEC_HASH = "prefixfleet.io/spec-hash"
# Set by whatever maps container ports to other reachable ports (the test kubelet, hostPort setups):
# JSON {"containerPort": port}. Addresses published for a pod honour it.
ANNOTATION_PORT_MAP = "prefixfleet.io/port-map"
# The replica's routing state as the autoscaler sets it (ready | warming | draining).
ANNOTATION_STATE = "prefixfleet.io/state"
# Set by the operator when it starts draining a replica it is about to remove (RFC 3339 time).
ANNOTATION_DRAINING_SINCE = "prefixfleet.io/draining-since"
# Set by the operator the first time it sees a replica Ready (RFC 3339 time): a pod that is unready
# later with this mark served and then stopped (a hung engine), rather than never having come up.
ANNOTATION_FIRST_READY = "prefixfleet.io/first-ready"
# Set by the operator the first time it sees a replica in an unready stretch that a replacement
# knob applies to, or that it reports as unavailable (it served, and nothing replaces it): JSON
# {"at": <the operator's time>, "readyChanged": <the Ready condition's lastTransitionTime>}. The
# allowance (and an unavailable replica's "since") is counted from "at", on the operator's own clock:
# the kubelet's lastTransitionTime is the node's clock, and a node running behind or ahead would get
# its pods replaced early or late. "readyChanged" ties the mark to one stretch: a later stretch (another
# transition time) is marked afresh, so no mark has to be removed when the pod is Ready again.
ANNOTATION_UNREADY_SEEN = "prefixfleet.io/unready-seen"
# A pod without the first-ready mark (created, or Ready and unready again, before this operator
# version marked pods) served if its Ready condition changed this long after the pod started
# (status.startTime; the node's clock for both): the kubelet writes the condition, False, when it
# starts the pod, and moves its lastTransitionTime only when its status changes, so a later time means
# it turned True and then False again. The margin errs towards "never Ready", which never replaces a
# pod that may be loading its model on a guess.
READY_BEFORE_MARGIN_S = 10.0
ENGINE_CONTAINER = "engine"
SIDECAR_CONTAINER = "sidecar"
# A drain lasts at least this long even when the sidecar reports no request in flight, so every
# gateway has refreshed its membership view (they poll every 0.2 s by default) before deletion.
MIN_DRAIN_S = 2.0
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MANAGER = "prefixfleet-operator"
# Degraded reason (and Event reason) of a fleet whose Redis cannot be used (ObservedState.redis_problem).
REDIS_UNUSABLE = "RedisUnusable"
# Degraded reason (and Event reason) of a fleet whose Redis refuses the credentials the operator
# dials it with (ObservedState.redis_auth_problem): a different fix than RedisUnusable (the password or
# user, not the Secret's presence or URL), found by Redis itself rather than by reading Secrets.
REDIS_AUTH_FAILED = "RedisAuthFailed"
# Degraded reason (and Event reason) of a fleet whose Redis accepts those credentials but denies the
# ACL user a command, key or channel the fleet runs (ObservedState.redis_permission_problem): the fix is
# the user's ACL rules, and PING alone does not show it.
REDIS_PERMISSION_DENIED = "RedisPermissionDenied"
# Degraded reason (and Event reason) of a fleet whose Redis answers commands the fleet runs with an
# error about neither the credentials nor the ACL (ObservedState.redis_refused): a read-only replica,
# out of memory, a dataset loading, a script running, writes stopped after a failed snapshot, a proxy
# without MULTI. Not a verdict on the credentials: the fix is the server (or the URL naming it).
REDIS_COMMANDS_REFUSED = "RedisCommandsRefused"
# Condition type (present, True, only while it holds) and Warning Event reason of a fleet whose Redis
# URL is written out with its password (ObservedState.redis_password_warning): the fleet works, so it
# is not Degraded, but the password is in plain text in its pods' and gateway Deployment's env.
REDIS_PASSWORD_EXPOSED = "RedisPasswordExposed"
REDIS_PASSWORD_IN_SPEC = "RedisPasswordInSpec"
# Condition type (present, True, only while it holds) keeping the verdict RedisCommandsRefused, reason
# and message the same as Degraded has for it: as for RedisAccessDenied (below), another cause
# (ChildRefused, RedisUnusable, InvalidSpec) may take Degraded while Redis does not answer, and the
# verdict, and whether its Warning Event was posted, must outlast that (refused_verdict).
REDIS_REFUSING = REDIS_COMMANDS_REFUSED
# Condition type (present, True, only while it holds) keeping the fleet's Redis verdict: reason
# RedisAuthFailed or RedisPermissionDenied, the same message as Degraded had for it. Degraded shows one
# cause at a time, and another (RedisUnusable, ChildRefused, InvalidSpec) may take it while Redis does
# not answer; the verdict, and whether its Warning Event was posted, must outlast that (redis_verdict).
REDIS_ACCESS_DENIED = "RedisAccessDenied"
MAX_SURGE = 1
ROUTER_CONFIG_PATH = "/etc/prefixfleet"

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True, slots=True)
class FleetRef:
    """Identity of the PrefixCacheFleet being reconciled."""

    name: str
    namespace: str
    uid: str = ""
    generation: int = 1

    @property
    def redis_fleet(self) -> str:
        """The Redis key namespace (``pf:{this}:``): unique across Kubernetes namespaces."""
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class ObservedLabels:
    """A child's labels as they are, and those its ``prefixfleet.io/last-applied`` record says the
    operator wrote (None: no record, a child made by an operator that kept none)."""

    live: Mapping[str, str] = field(default_factory=dict)
    recorded: Mapping[str, Any] | None = None
    # a Deployment's pod template's labels (None: not observed, or not a Deployment): the gateway
    # pods carry the fleet's labels through it, so it can lack them while the Deployment's own labels
    # are right (a Deployment written by an operator that kept them off its pods)
    pod_template: Mapping[str, str] | None = None


def observe_labels(body: Mapping[str, Any]) -> ObservedLabels:
    meta = body.get("metadata") or {}
    spec = body.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None  # a Deployment's
    pod_template = None
    if isinstance(template, Mapping):
        pod_template = dict((template.get("metadata") or {}).get("labels") or {})
    return ObservedLabels(dict(meta.get("labels") or {}), recorded_labels(dict(body)), pod_template)


@dataclass(frozen=True, slots=True)
class ObservedPod:
    name: str
    template_hash: str = ""
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    created: str = ""  # creationTimestamp (RFC 3339 sorts chronologically)
    pod_ip: str | None = None
    port_map: Mapping[int, int] = field(default_factory=dict)
    # the port its own sidecar container declares (its "http" port): during a rolling update that
    # changes spec.sidecar.port, a pod on the old template still listens on the old one
    sidecar_port: int | None = None
    deletion_cost: int = 0
    state: str = "ready"
    draining_since: str = ""  # set by the operator when it drains the pod before removing it
    in_flight: int | None = None  # requests in flight at its sidecar (load record), if known
    ready_changed: str = ""  # lastTransitionTime of the Ready condition
    first_ready: str = ""  # the operator's first-ready mark (see ANNOTATION_FIRST_READY)
    started: str = ""  # status.startTime: when the kubelet started the pod (the node's clock)
    # when the operator first saw the current unready stretch (ANNOTATION_UNREADY_SEEN); "" when it
    # has not marked this stretch
    unready_seen: str = ""
    engine_started: str = ""  # when the engine container's current process started, if running
    # the engine container is listed but not running (waiting in a crash back-off, or exited): the
    # kubelet restarts it, so it is not hung
    engine_down: bool = False
    # the scheduler found no node for it (PodScheduled False, Unschedulable): waiting for capacity
    unschedulable: bool = False
    # its labels and the fleet labels its record says the operator put on it (fleet_labels_of)
    labels: ObservedLabels = field(default_factory=ObservedLabels)

    @property
    def draining(self) -> bool:
        return bool(self.draining_since)

    @property
    def serving(self) -> bool:
        """Ready and taking new requests."""
        return self.ready and not self.draining and self.alive

    @property
    def failed(self) -> bool:
        return self.phase in ("Failed", "Succeeded")

    @property
    def alive(self) -> bool:
        return not self.terminating and not self.failed

    @property
    def was_ready(self) -> bool:
        """It has been Ready: the operator's mark, or the kubelet's Ready condition having changed well
        after the pod started (READY_BEFORE_MARGIN_S). Without either (no startTime): never Ready."""
        if self.first_ready:
            return True
        started, changed = _parse_time(self.started), _parse_time(self.ready_changed)
        return (
            started is not None
            and changed is not None
            and (changed - started).total_seconds() > READY_BEFORE_MARGIN_S
        )

    @property
    def lapsed(self) -> bool:
        """It served, and is not Ready now (a hung or restarted engine): it serves nothing and its
        cache is out of reach."""
        return self.alive and self.was_ready and not self.ready and not self.draining


@dataclass(frozen=True, slots=True)
class ObservedState:
    pods: Sequence[ObservedPod] = ()
    # spec-hash annotation of each existing child by "Kind/name" (Deployment, Service, ConfigMap).
    children: Mapping[str, str] = field(default_factory=dict)
    # the labels of each existing child by "Kind/name", where observed (a child missing here has its
    # labels left as they are, only its spec hash decides)
    child_labels: Mapping[str, ObservedLabels] = field(default_factory=dict)
    # the fleet's own metadata.labels: every child carries them, besides its own (fleet_labels_of)
    fleet_labels: Mapping[str, str] = field(default_factory=dict)
    router_ready_replicas: int = 0
    conditions: Sequence[JSON] = ()  # the current status.conditions (to keep transition times)
    victims: Sequence[str] = ()  # the autoscaler's removal preference, most preferred first
    redis_url: str = ""  # the operator's default Redis when the spec names none
    # Why the fleet's Redis cannot be used (a Secret missing, or holding a URL the sidecar refuses),
    # naming the field; empty when it can.
    redis_problem: str = ""
    # Why the fleet's Redis refuses the credentials the spec gives (wrong password, unknown or
    # disabled user, none sent), naming the field and Secret to fix; empty when it accepts them. A
    # round that could not ask (an outage) passes the last verdict on (redis_verdict).
    redis_auth_problem: str = ""
    # Which commands the fleet runs (operator, sidecars, gateways) Redis denies the ACL user it
    # accepted, naming them and the user; empty when none are; in an outage, as for the login.
    redis_permission_problem: str = ""
    # Which commands the fleet runs Redis answered with an error about neither the credentials nor
    # the ACL this round, with Redis's error (READONLY, OOM, LOADING, BUSY, MISCONF...); empty when none.
    redis_refused: str = ""
    # Why the fleet's Redis password is in plain text in its pods and gateway Deployment
    # (redis_password_warning); empty when it is not. A warning: the fleet is not Degraded for it.
    redis_password_warning: str = ""
    # The image the operator was deployed with (chart: PREFIXFLEET_IMAGE); it replaces the models'
    # default project image so sidecars, gateways and emulators run the same release as the operator.
    project_image: str = ""
    # A ready replica is drained (membership state "draining": gateways send it nothing new) before
    # it is deleted: until its sidecar reports nothing in flight, at most this long.
    drain_seconds: float = 15.0
    now: datetime = field(default_factory=lambda: datetime.now(tz=UTC))


@dataclass(frozen=True, slots=True)
class PodDeletion:
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class PlannedEvent:
    type: EventType
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ChildChange:
    """Create a child that is missing, or replace one whose spec hash or labels differ."""

    action: Literal["create", "replace"]
    manifest: JSON
    # a replace whose spec hash is the same: only its labels (the fleet's) are written
    labels_only: bool = False

    @property
    def key(self) -> str:
        return f"{self.manifest['kind']}/{self.manifest['metadata']['name']}"


@dataclass(frozen=True, slots=True)
class ReconcilePlan:
    create_pods: tuple[JSON, ...] = ()
    delete_pods: tuple[PodDeletion, ...] = ()
    children: tuple[ChildChange, ...] = ()
    status: JSON = field(default_factory=dict)
    events: tuple[PlannedEvent, ...] = ()
    drain_pods: tuple[str, ...] = ()  # annotate state=draining + draining-since=now
    undrain_pods: tuple[str, ...] = ()  # drained by us but wanted again: remove both annotations
    mark_ready: tuple[str, ...] = ()  # Ready for the first time: annotate first-ready=now
    # (pod, value): unready, first seen so by the operator: annotate unready-seen=value
    mark_unready: tuple[tuple[str, str], ...] = ()
    # every label write the fleet's labels cause (pods and router children): the LabelsChanged Event
    # says them, and after execution only those carried out (events_carried_out); the pods' are
    # relabel_pods
    label_writes: tuple[LabelWrite, ...] = ()
    replaced: tuple[UnhealthyReplica, ...] = ()  # in delete_pods because they are unhealthy
    recheck_after_s: float | None = None  # reconcile again this soon (UnhealthyPlan.recheck_after_s)
    # served, unready, nothing replaces them (UnhealthyPlan.unavailable): Degraded/ReplicaUnavailable
    unavailable: tuple[UnavailableReplica, ...] = ()

    @property
    def relabel_pods(self) -> tuple[tuple[str, JSON], ...]:
        """(pod, merge patch) of each replica pod in ``label_writes``: the fleet's labels changed; set
        in place on the pod's metadata (a pod is not replaced for a label: its engine keeps its cache
        and its GPU). Derived, so the pods relabelled and those the Event says are one list."""
        return tuple(
            (w.what, labels_patch(w.seen.recorded, w.desired)) for w in self.label_writes if w.part == "pod"
        )

    @property
    def is_noop(self) -> bool:
        """Nothing to change in the cluster (status and events aside)."""
        return not (
            self.create_pods
            or self.delete_pods
            or self.children
            or self.drain_pods
            or self.undrain_pods
            or self.mark_ready
            or self.mark_unready
            or self.relabel_pods
        )


# ---------------------------------------------------------------------------------------------
# Observation: API bodies -> plain records.


def observe_pod(body: Mapping[str, Any]) -> ObservedPod:
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    annotations = meta.get("annotations") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    unschedulable = any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in status.get("conditions") or []
    )
    ready_changed = next(
        (
            c.get("lastTransitionTime") or ""
            for c in status.get("conditions") or []
            if c.get("type") == "Ready"
        ),
        "",
    )
    engine_status = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == ENGINE_CONTAINER), {}
    )
    try:
        port_map = {int(k): int(v) for k, v in json.loads(annotations.get(ANNOTATION_PORT_MAP, "{}")).items()}
    except (ValueError, TypeError, AttributeError):
        port_map = {}
    try:
        cost = int(annotations.get(DELETION_COST, 0))
    except (TypeError, ValueError):
        cost = 0
    ready = conditions.get("Ready") == "True"
    return ObservedPod(
        name=meta.get("name", ""),
        template_hash=annotations.get(ANNOTATION_TEMPLATE_HASH, ""),
        phase=status.get("phase") or "Pending",
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        created=meta.get("creationTimestamp") or "",
        pod_ip=status.get("podIP"),
        port_map=port_map,
        sidecar_port=_sidecar_port(body),
        deletion_cost=cost,
        state=annotations.get(ANNOTATION_STATE, "ready"),
        draining_since=annotations.get(ANNOTATION_DRAINING_SINCE, ""),
        ready_changed=ready_changed,
        first_ready=annotations.get(ANNOTATION_FIRST_READY, ""),
        started=status.get("startTime") or "",
        unready_seen=_unready_seen(annotations.get(ANNOTATION_UNREADY_SEEN, ""), ready_changed, ready),
        engine_started=((engine_status.get("state") or {}).get("running") or {}).get("startedAt") or "",
        engine_down=bool(engine_status) and "running" not in (engine_status.get("state") or {}),
        unschedulable=unschedulable,
        labels=observe_labels(body),
    )


def _sidecar_port(body: Mapping[str, Any]) -> int | None:
    """The containerPort named "http" of the pod's sidecar container, if its spec has one."""
    containers = (body.get("spec") or {}).get("containers") or []
    sidecar = next(
        (c for c in containers if isinstance(c, Mapping) and c.get("name") == SIDECAR_CONTAINER), {}
    )
    for port in sidecar.get("ports") or []:
        if (
            isinstance(port, Mapping)
            and port.get("name") == "http"
            and isinstance(port.get("containerPort"), int)
        ):
            return int(port["containerPort"])
    return None


def _unready_seen(mark: str, ready_changed: str, ready: bool) -> str:
    """The operator's time in an unready-seen mark, if the mark is of the current unready stretch."""
    try:
        value = json.loads(mark) if mark and not ready else {}
    except (ValueError, RecursionError):  # a user-edited mark, however broken, is no mark
        return ""
    if not isinstance(value, dict) or not ready_changed or value.get("readyChanged") != ready_changed:
        return ""
    return str(value.get("at") or "")


def unready_mark(now: datetime, ready_changed: str) -> str:
    """The value of ANNOTATION_UNREADY_SEEN for a stretch the operator sees for the first time now."""
    return json.dumps({"at": _format_time(now), "readyChanged": ready_changed})


def replica_selector(fleet: FleetRef) -> str:
    return f"{LABEL_FLEET}={fleet.name},{LABEL_ROLE}=replica"


def pod_url(pod: ObservedPod, port: int) -> str | None:
    """Where a pod's sidecar is reachable: at the port its own pod spec declares, else ``port``
    (spec.sidecar.port); honours the port-map annotation."""
    if not pod.pod_ip:
        return None
    port = pod.sidecar_port or port
    return base_url(pod.pod_ip, pod.port_map.get(port, port))


# ---------------------------------------------------------------------------------------------
# Desired children.


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:10]


def _labels(fleet: FleetRef, role: str) -> JSON:
    return {
        LABEL_NAME: "prefixfleet",
        LABEL_INSTANCE: fleet.name,
        LABEL_COMPONENT: role,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_FLEET: fleet.name,
        LABEL_ROLE: role,
    }


def fleet_labels_of(fleet_labels: Mapping[str, str], own: Collection[str]) -> JSON:
    """The fleet's metadata.labels a child carries besides ``own`` (its own label keys, which win: the
    operator's, a podTemplate's), as ``kopf.adopt`` gave them before. They are added after the
    child's hashes are taken, so a label change updates children in place and rolls nothing."""
    return {k: v for k, v in fleet_labels.items() if k not in own}


def labels_stale(desired: Mapping[str, str], observed: ObservedLabels) -> bool:
    """Whether a child's labels must be written: one of ``desired`` is missing or differs, or its
    record differs from ``desired`` (a label the operator wrote and no longer wants, which the
    three-way patch removes). Without a record only missing or different labels count, so an
    operator upgrade writes nothing to children whose labels are already right."""
    if any(observed.live.get(k) != v for k, v in desired.items()):
        return True
    return observed.recorded is not None and dict(observed.recorded) != dict(desired)


def owner_reference(fleet: FleetRef) -> JSON:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": fleet.name,
        "uid": fleet.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _resources(req: Any) -> JSON:
    out: JSON = {}
    if req.requests:
        out["requests"] = dict(req.requests)
    if req.limits:
        out["limits"] = dict(req.limits)
    return out


def _redis_env(spec: FleetSpec, default_url: str) -> JSON:
    redis = spec.redis
    if redis.secret_ref is not None:
        return {
            "name": "REDIS_URL",
            "valueFrom": {"secretKeyRef": {"name": redis.secret_ref.name, "key": redis.secret_ref.key}},
        }
    return {"name": "REDIS_URL", "value": redis.url or default_url}


def _redis_auth_env(spec: FleetSpec) -> list[JSON]:
    """The Redis password from its Secret (never in args or the URL) and the TLS switch; see
    ``prefixfleet.router.redis_conn`` for the variables the sidecar and gateway read."""
    redis = spec.redis
    env: list[JSON] = []
    if redis.password_secret_ref is not None:
        ref = redis.password_secret_ref
        env.append(
            {
                "name": "PREFIXFLEET_REDIS_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    if redis.tls:
        env.append({"name": "PREFIXFLEET_REDIS_TLS", "value": "1"})
    return env


ENGINE_API_KEY_ENV = "PREFIXFLEET_ENGINE_API_KEY"  # router/sidecar.py reads it


def _engine_key_env(spec: FleetSpec, name: str = ENGINE_API_KEY_ENV) -> list[JSON]:
    """The engine's API key from its Secret as the variable ``name`` (none without
    spec.engine.apiKeySecretRef); the kubelet resolves the reference, the operator never reads it."""
    ref = spec.engine.api_key_secret_ref
    if ref is None:
        return []
    return [{"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def _engine_key_wiring(spec: FleetSpec) -> tuple[list[JSON], list[str]]:
    """The engine container's env and extra args that key it: vLLM reads VLLM_API_KEY; SGLang takes
    only --api-key, given as $(VAR), which Kubernetes expands from the container's env (the pod spec
    names the variable, not the key). The emulator is given nothing: it has --api-key (both faces)
    since 9b84c0f, but the operator does not pass it, so an emulator fleet's engine takes any request."""
    kind = spec.engine.kind
    if spec.engine.api_key_secret_ref is None or kind == "emulator":
        return [], []
    if kind == "vllm":
        return _engine_key_env(spec, "VLLM_API_KEY"), []
    return _engine_key_env(spec), ["--api-key", f"$({ENGINE_API_KEY_ENV})"]


def _pod_env() -> list[JSON]:
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def engine_command(spec: FleetSpec) -> tuple[list[str], list[str]]:
    """Command and args of the engine container. The engine only listens on the pod's loopback:
    nothing but the sidecar talks to it."""
    engine, model = spec.engine, spec.model
    port = str(engine.port)
    if engine.kind == "emulator":
        command = ["prefixfleet", "emulator"]
        args = [
            "--host",
            "127.0.0.1",
            "--port",
            port,
            "--model",
            model.name,
            "--model-revision",
            model.revision,
        ]
        # Like SGLang (below), the emulator reports OpenAI usage.prompt_tokens_details only when asked;
        # in vLLM mode (--api vllm) by vLLM's flag, as its vLLM face refuses SGLang's (exit 2)
        if emulator_api(engine.args) == "vllm":
            args += _unless_given(engine.args, "--enable-prompt-tokens-details")
        else:
            args += _unless_given(engine.args, "--enable-cache-report")
    elif engine.kind == "sglang":
        command = ["python3", "-m", "sglang.launch_server"]
        args = [
            "--model-path",
            model.name,
            "--revision",
            model.revision,
            "--host",
            "127.0.0.1",
            "--port",
            port,
        ]
        if model.adapter:
            args += ["--lora-paths", model.adapter]
        # --enable-metrics: SGLang serves no /metrics without it: the sglang:* series the sidecar
        # re-exposes, the autoscaler, the dashboard and the alerts read would all be missing.
        # --enable-cache-report: without it SGLang's /v1/completions and /v1/chat/completions answers
        # carry no usage.prompt_tokens_details.cached_tokens, and the sidecar could correct its cache
        # mirror from /generate traffic only.
        args += _unless_given(engine.args, "--enable-metrics")
        args += _unless_given(engine.args, "--enable-cache-report")
    else:  # vllm
        command = ["vllm", "serve"]
        args = [model.name, "--revision", model.revision, "--host", "127.0.0.1", "--port", port]
        if model.adapter:
            # vLLM's --lora-modules takes name=path or a JSON object, never a bare name (its
            # LoRAParserAction refuses one: "Invalid JSON format for --lora-modules"). The adapter is
            # both the name requests ask for (and the sidecar's --adapter) and where vLLM loads it
            # from, as SGLang's --lora-paths reads a bare path; JSON, so no '=' or ',' in it can split it.
            lora = json.dumps({"name": model.adapter, "path": model.adapter})
            args += ["--enable-lora", "--lora-modules", lora]
        # vLLM's counterpart of --enable-cache-report (its OpenAI usage has no cached_tokens without
        # it); a spec's --no-enable-prompt-tokens-details opts out.
        args += _unless_given(
            engine.args, "--enable-prompt-tokens-details", "--no-enable-prompt-tokens-details"
        )
    return command, args + list(engine.args)


def sidecar_engine_api(kind: EngineKind, args: Sequence[str] = ()) -> str:
    """The sidecar's ``--engine-api`` for an engine kind and its ``args``: which HTTP API it speaks
    to its engine (identity and capacity, pre-warm, flush). Named, not left to the sidecar's
    ``auto`` probe: the operator knows the kind, and a probe of an engine still loading its model
    decides nothing. The emulator speaks SGLang's API unless its args say ``--api vllm``."""
    vllm = kind == "vllm" or (kind == "emulator" and emulator_api(args) == "vllm")
    return "vllm" if vllm else "sglang"


def emulator_api(args: Sequence[str]) -> str:
    """The API an emulator's args select, as its parser reads ``--api`` (``--api X`` or
    ``--api=X``; the last one given wins); ``sglang``, its default, without one."""
    given = last_flag_value(args, "--api")
    return "sglang" if given is None else given[1]


# VLLM_SERVER_DEV_MODE is deliberately not set on vLLM engines, so the sidecar's flush (POST
# /flush_cache, which it sends to vLLM as POST /reset_prefix_cache) answers 501 naming the variable.
# Dev mode adds, besides /reset_prefix_cache, /collective_rpc (calls any worker method by name;
# vLLM's docs/usage/security.md: "extremely dangerous"), /sleep (a denial of service), /server_info
# (the whole engine config) and, in newer releases, /pause, /abort_requests and weight-update
# routes, none behind --api-key (it guards /v1 paths only); vLLM logs "SECURITY WARNING:
# Development endpoints are enabled! This should NOT be used in production!". The engine listens on
# the pod's loopback, but the sidecar listens on the pod IP and forwards every path but its own to
# the engine (docs/gateway.md), so anything in the cluster reaching the sidecar port would reach
# them. Nothing the operator runs flushes a cache; a spec that wants the flush sets the variable in
# spec.engine.env (docs/operator.md, "Engine args and podTemplate").


def _unless_given(given: list[str], flag: str, *instead: str) -> list[str]:
    """``[flag]`` unless spec.engine.args already holds it (or one of ``instead``): the pod gets it
    once. Each is a store_true flag, which argparse would take twice anyway; once reads better."""
    return [] if any(a in given for a in (flag, *instead)) else [flag]


def _probe(port: str, initial_delay: int = 0) -> JSON:
    return {
        "httpGet": {"path": "/health", "port": port},
        "initialDelaySeconds": initial_delay,
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "failureThreshold": 3,
    }


# What the restricted Pod Security Standard asks of a container (runAsNonRoot is set where the image
# allows it: not for the root-only SGLang/vLLM images).
_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _merge_template(base: JSON, override: Mapping[str, Any]) -> JSON:
    """Merge a user pod-template override: dicts recursively, containers, initContainers and volumes by
    name (the generated gateway pod has a volume of its own), and inside a container its env, ports and
    volumeMounts by key (CONTAINER_LIST_KEYS); other lists replaced."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge_template(out[key], value)
        elif key in MERGED_BY_NAME and isinstance(value, list):
            merge = _merge_template if key == "volumes" else _merge_container
            by_name = {c.get("name"): c for c in out.get(key, [])}
            for item in value:
                name = item.get("name") if isinstance(item, Mapping) else None
                by_name[name] = merge(by_name.get(name, {}), item)
            out[key] = list(by_name.values())
        else:
            out[key] = copy.deepcopy(value)
    return out


# The lists inside a container that merge by a key, as a strategic merge patch (kubectl patch) merges
# them; replacing them would drop the operator's own entries.
CONTAINER_LIST_KEYS: dict[str, str] = {"env": "name", "ports": "containerPort", "volumeMounts": "mountPath"}


def _merge_container(base: JSON, override: Mapping[str, Any]) -> JSON:
    """A container of a pod-template override merged into the generated one of its name. Its env,
    ports and volumeMounts merge by key (CONTAINER_LIST_KEYS); an entry of an existing key replaces
    it whole (an env var's value and valueFrom exclude each other). Replacing the lists would drop
    the operator's own: env REDIS_URL and the Redis password (the sidecar or gateway, started with
    '--redis $(REDIS_URL)', would exit at once), POD_NAME/POD_IP, or the 'http' port its readiness
    probe and the gateway Service target."""
    # a value that is not a list is replaced, as any other (the API server names what is wrong)
    keyed = {k: v for k, v in override.items() if k in CONTAINER_LIST_KEYS and isinstance(v, list)}
    merged = _merge_template(base, {k: v for k, v in override.items() if k not in keyed})
    for list_name, items in keyed.items():
        key = CONTAINER_LIST_KEYS[list_name]
        by_key = {e[key]: e for e in base.get(list_name) or [] if _merge_key(e, key) is not None}
        keyless = []  # no usable key (the API server refuses these): kept so that it names them
        for item in items:
            if (found := _merge_key(item, key)) is not None:
                by_key[found] = copy.deepcopy(item)
            else:
                keyless.append(copy.deepcopy(item))
        merged[list_name] = [*by_key.values(), *keyless]
    return merged


def _merge_key(item: Any, key: str) -> str | int | None:
    """An entry's merge key (a name, a port number, a path); None when it has none a dict can hold."""
    value = item.get(key) if isinstance(item, Mapping) else None
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _with_pod_template(template: JSON, override: Mapping[str, Any] | None) -> JSON:
    """A generated pod template (metadata + spec) with a user's podTemplate merged in
    (spec.engine.podTemplate for replica pods, spec.router.podTemplate for gateway pods)."""
    override = override or {}
    return {part: _merge_template(template[part], override.get(part) or {}) for part in ("metadata", "spec")}


def replica_template(fleet: FleetRef, spec: FleetSpec, default_redis_url: str) -> tuple[JSON, str]:
    """The replica pod template (metadata labels/annotations + spec) and its hash."""
    engine, sidecar, model = spec.engine, spec.sidecar, spec.model
    command, args = engine_command(spec)
    assert engine.port is not None  # filled by the model's kind defaults
    sidecar_args = [
        "--engine", f"http://127.0.0.1:{engine.port}",
        "--engine-api", sidecar_engine_api(engine.kind, engine.args),
        "--redis", "$(REDIS_URL)",
        "--host", "",  # every interface: IPv4 and IPv6 pod IPs alike
        "--port", str(sidecar.port),
        "--worker-id", "$(POD_NAME)",
        "--advertise-url", f"http://$(POD_IP):{sidecar.port}",
        "--fleet", fleet.redis_fleet,
        "--block-tokens", str(spec.router.block_tokens),
        "--model", model.name,
        "--revision", model.revision,
        "--no-self-register",  # the operator publishes membership from pod readiness
    ]  # fmt: skip
    if model.adapter:
        sidecar_args += ["--adapter", model.adapter]
    key_env, key_args = _engine_key_wiring(spec)
    args = [*args, *key_args]
    # the key first: a spec's own engine env comes after it, as it would without the key
    engine_env = [*key_env, *({k: v for k, v in e.to_wire().items()} for e in engine.env)]
    pod_spec: JSON = {
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": engine.kind == "emulator"},
        "containers": [
            {
                "name": "engine",
                "image": engine.image,
                "command": command,
                "args": args,
                "env": engine_env,
                "ports": [{"name": "engine", "containerPort": engine.port}],
                # No probe of its own: the kubelet probes the pod IP and the engine listens on loopback
                # only. The sidecar's probe (GET /health, proxied to the engine) stands for both.
                "resources": _resources(engine.resources),
                **(
                    {"securityContext": {**_SECURITY, "readOnlyRootFilesystem": True, "runAsNonRoot": True}}
                    if engine.kind == "emulator"
                    else {}
                ),
            },
            {
                "name": SIDECAR_CONTAINER,
                "image": sidecar.image,
                "command": ["prefixfleet", "router", "sidecar"],
                "args": sidecar_args,
                "env": [
                    *_pod_env(),
                    _redis_env(spec, default_redis_url),
                    *_redis_auth_env(spec),
                    *_engine_key_env(spec),
                ],
                "ports": [{"name": "http", "containerPort": sidecar.port}],
                "readinessProbe": _probe("http"),
                "resources": _resources(sidecar.resources),
                "securityContext": {**_SECURITY, "readOnlyRootFilesystem": True, "runAsNonRoot": True},
            },
        ],
    }
    metadata: JSON = {"labels": _labels(fleet, "replica"), "annotations": {}}
    template = _with_pod_template({"metadata": metadata, "spec": pod_spec}, engine.pod_template)
    return template, _hash(template)


def replica_pod(
    fleet: FleetRef,
    template: JSON,
    template_hash: str,
    index: int,
    fleet_labels: Mapping[str, str] | None = None,
) -> JSON:
    """Replica ``index`` of ``template``, with the fleet's labels (``fleet_labels``: the fleet's
    metadata.labels) and the record of them, which a later label update compares against."""
    pod = copy.deepcopy(template)
    meta = pod["metadata"]
    meta["name"] = replica_name(fleet, index)
    meta["namespace"] = fleet.namespace
    meta["labels"][LABEL_TEMPLATE_HASH] = template_hash
    extra = fleet_labels_of(fleet_labels or {}, replica_own_labels(template))
    meta["labels"].update(extra)
    meta["annotations"][ANNOTATION_LAST_APPLIED] = labels_record(extra)
    meta["annotations"][ANNOTATION_TEMPLATE_HASH] = template_hash
    meta["ownerReferences"] = [owner_reference(fleet)]
    return {"apiVersion": "v1", "kind": "Pod", **pod}


def replica_own_labels(template: JSON) -> set[str]:
    """The label keys a replica pod of ``template`` has of its own (the operator's, its podTemplate's)."""
    return {*template["metadata"]["labels"], LABEL_TEMPLATE_HASH}


def replica_name(fleet: FleetRef, index: int) -> str:
    suffix = f"-replica-{index}"
    return fleet.name[: 63 - len(suffix)].rstrip("-.") + suffix


def router_name(fleet: FleetRef) -> str:
    return fleet.name[: 63 - len("-router")].rstrip("-.") + "-router"


def router_endpoint(fleet: FleetRef, spec: FleetSpec) -> str:
    return f"http://{router_name(fleet)}.{fleet.namespace}.svc:{spec.router.port}"


def router_settings(fleet: FleetRef, spec: FleetSpec) -> JSON:
    """What the gateways run with (the ConfigMap's ``router.json``)."""
    return {
        "fleet": fleet.redis_fleet,
        "policy": spec.router.policy,
        "policyParams": dict(spec.router.policy_params),
        "blockTokens": spec.router.block_tokens,
        "model": spec.model.name,
        "revision": spec.model.revision,
        "cacheIdentity": spec.cache_identity.to_wire(),
    }


def _with_hash(manifest: JSON) -> JSON:
    manifest["metadata"].setdefault("annotations", {})[ANNOTATION_SPEC_HASH] = _hash(manifest)
    return manifest


def desired_children(fleet: FleetRef, spec: FleetSpec, default_redis_url: str) -> list[JSON]:
    """Router ConfigMap, Deployment and Service, each carrying the hash of its own content."""
    name = router_name(fleet)
    labels = _labels(fleet, "router")
    meta = {
        "name": name,
        "namespace": fleet.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(fleet)],
    }
    settings = router_settings(fleet, spec)
    config = _with_hash(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": copy.deepcopy(meta),
            "data": {"router.json": json.dumps(settings, sort_keys=True, indent=2)},
        }
    )
    router = spec.router
    gateway_args = [
        "--redis", "$(REDIS_URL)",
        "--host", "",  # every interface: IPv4 and IPv6 pod IPs alike
        "--port", str(router.port),
        "--fleet", fleet.redis_fleet,
        "--policy", router.policy,
        "--block-tokens", str(router.block_tokens),
    ]  # fmt: skip
    for key, value in sorted(router.policy_params.items()):
        gateway_args += ["--policy-param", f"{key}={value:g}"]
    if spec.cache_identity.tenant_isolation:
        # the tenant (cache_salt) comes only from this header, set by the proxy that authenticates
        gateway_args += ["--tenant-header", "X-Prefixfleet-Tenant"]
    selector = {LABEL_FLEET: fleet.name, LABEL_ROLE: "router"}
    gateway_pod: JSON = {
        "metadata": {
            "labels": dict(labels),
            # a settings change rolls the gateways
            "annotations": {ANNOTATION_SPEC_HASH: config["metadata"]["annotations"][ANNOTATION_SPEC_HASH]},
        },
        "spec": {
            "enableServiceLinks": False,
            "securityContext": {"runAsNonRoot": True},
            "containers": [
                {
                    "name": "gateway",
                    "image": router.image,
                    "command": ["prefixfleet", "router", "gateway"],
                    "args": gateway_args,
                    "env": [_redis_env(spec, default_redis_url), *_redis_auth_env(spec)],
                    "ports": [{"name": "http", "containerPort": router.port}],
                    "readinessProbe": _probe("http"),
                    "resources": _resources(router.resources),
                    "volumeMounts": [{"name": ROUTER_SETTINGS_VOLUME, "mountPath": ROUTER_CONFIG_PATH}],
                    "securityContext": {**_SECURITY, "readOnlyRootFilesystem": True},
                }
            ],
            "volumes": [{"name": ROUTER_SETTINGS_VOLUME, "configMap": {"name": name}}],
        },
    }
    deployment = _with_hash(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": copy.deepcopy(meta),
            "spec": {
                "replicas": router.replicas,
                "selector": {"matchLabels": selector},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": _with_pod_template(gateway_pod, router.pod_template),
            },
        }
    )
    service = _with_hash(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": copy.deepcopy(meta),
            "spec": {
                "selector": selector,
                "ports": [{"name": "http", "port": router.port, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )
    return [config, deployment, service]


# ---------------------------------------------------------------------------------------------
# The plan.


def _removal_order(pods: Sequence[ObservedPod], victims: Sequence[str]) -> list[ObservedPod]:
    """Which pods to remove first: those already draining, not ready, then the autoscaler's victims
    in its order, then the lowest ``pod-deletion-cost``, then the newest (least warmed cache)."""
    rank = {name: i for i, name in enumerate(victims)}
    return sorted(
        pods,
        key=lambda p: (
            not p.draining,
            p.ready,
            rank.get(p.name, len(rank)),
            p.deletion_cost,
            _neg(p.created),
            p.name,
        ),
    )


def _parse_time(text: str) -> datetime | None:
    """An RFC 3339 time as the API writes it (fractions and offsets accepted); None if unreadable."""
    try:
        parsed = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _format_time(moment: datetime) -> str:
    """A time as the operator writes it on objects (RFC 3339, whole seconds, UTC)."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def drained(pod: ObservedPod, now: datetime, drain_seconds: float) -> bool:
    """A draining pod may go: nothing in flight after the minimum drain, or the drain timed out."""
    since = _parse_time(pod.draining_since)
    if since is None:
        return True  # an unreadable marker must not keep a pod forever
    waited = (now - since).total_seconds()
    return waited >= drain_seconds or (waited >= MIN_DRAIN_S and pod.in_flight == 0)


@dataclass
class PodPlan:
    create: list[int] = field(default_factory=list)
    delete: list[PodDeletion] = field(default_factory=list)
    drain: list[str] = field(default_factory=list)
    undrain: list[str] = field(default_factory=list)


def _neg(text: str) -> tuple[int, ...]:
    return tuple(-ord(ch) for ch in text)  # newest first when sorted ascending


def _free_indices(pods: Sequence[ObservedPod], fleet: FleetRef, count: int) -> list[int]:
    used = {p.name for p in pods}
    out, k = [], 0
    while len(out) < count:
        if replica_name(fleet, k) not in used:
            out.append(k)
        k += 1
    return out


def plan_pods(fleet: FleetRef, replicas: int, template_hash: str, observed: ObservedState) -> PodPlan:
    """Replica pods to create, drain, undrain and delete (see the module docstring)."""
    out = PodPlan()
    out.delete = [
        PodDeletion(p.name, f"pod {p.phase.lower()}") for p in observed.pods if p.failed and not p.terminating
    ]
    retiring: set[str] = set()

    def retire(pod: ObservedPod, reason: str) -> bool:
        """Remove a pod, draining it first if it serves; True when it is deleted now."""
        retiring.add(pod.name)
        if (
            not pod.ready
            or observed.drain_seconds <= 0
            or (pod.draining and drained(pod, observed.now, observed.drain_seconds))
        ):
            out.delete.append(PodDeletion(pod.name, reason))
            return True
        if not pod.draining:
            out.drain.append(pod.name)
        return False

    alive = [p for p in observed.pods if p.alive]
    current = [p for p in alive if p.template_hash == template_hash]
    outdated = [p for p in alive if p.template_hash != template_hash]
    creates = 0
    if not outdated:
        creates = max(0, replicas - len(current))
        for pod in _removal_order(current, observed.victims)[: max(0, len(current) - replicas)]:
            retire(pod, "scale down")
    else:
        serving_total = sum(p.serving for p in alive)
        remaining_outdated = len(outdated)
        for pod in outdated:
            if not pod.ready or pod.draining:
                remaining_outdated -= retire(pod, "rolling update")
        for pod in sorted((p for p in outdated if p.serving), key=lambda p: (p.created, p.name)):
            # max unavailable 0: keep `replicas` serving pods; more than replicas + surge never exist
            if serving_total - 1 >= replicas or len(current) + remaining_outdated > replicas + MAX_SURGE:
                serving_total -= 1
                remaining_outdated -= retire(pod, "rolling update")
        budget = replicas + MAX_SURGE - len(current) - remaining_outdated
        creates = max(0, min(replicas - len(current), budget))
        if len(current) > replicas:
            for pod in _removal_order(current, observed.victims)[: len(current) - replicas]:
                retire(pod, "scale down")
    out.undrain = [p.name for p in alive if p.draining and p.name not in retiring]
    out.create = _free_indices(observed.pods, fleet, creates)
    return out


# ---------------------------------------------------------------------------------------------
# Unhealthy replicas: the engine listens on the pod's loopback, so no kubelet probe can see (and
# restart) a hung one; the sidecar's readiness (GET /health, proxied to the engine) turns the pod
# unready and gateways stop routing to it, but only deleting the pod brings the replica back.

UnhealthyReason = Literal["unready", "never_ready"]


@dataclass(frozen=True, slots=True)
class UnhealthyReplica:
    """A replica pod that has been unready longer than its allowance."""

    name: str
    reason: UnhealthyReason  # unready: it served, then stopped; never_ready: it has not come up
    since: str  # when the operator first saw this unready stretch (its own clock)
    seconds: float  # how long it has been unready
    allowance_s: int
    knob: str  # the spec field that set the allowance

    @property
    def message(self) -> str:
        """For the Event: how long, and which knob it exceeded."""
        if self.reason == "unready":
            what = f"was Ready, then unready for {self.seconds:.0f}s (since {self.since})"
        else:
            what = f"has not been Ready for {self.seconds:.0f}s (since {self.since})"
        return f"pod {self.name} {what}, over {self.knob}={self.allowance_s}"

    @property
    def summary(self) -> str:
        """For the Degraded condition: no running count, so status is not rewritten every reconcile."""
        what = "unready after serving" if self.reason == "unready" else "never Ready"
        return f"{self.name} {what} since {self.since} (over {self.knob}={self.allowance_s})"


@dataclass(frozen=True, slots=True)
class UnhealthyPlan:
    # every replica over its allowance: never-ready ones first, then longest first
    overdue: tuple[UnhealthyReplica, ...] = ()
    replace: UnhealthyReplica | None = None  # the one to delete now (at most one)
    held_back_by: str = ""  # why none is deleted now although some are overdue
    # when the next unready replica runs out of its allowance: reconcile again then (not only at the
    # next timer tick or pod event: nothing else changes while a replica hangs)
    recheck_after_s: float | None = None
    # unready replicas the operator sees for the first time in this stretch: their allowance counts
    # from now (ReconcilePlan.mark_unready records it)
    first_seen: tuple[ObservedPod, ...] = ()
    # replicas that served, are unready, and that nothing replaces (stays_unavailable)
    unavailable: tuple[UnavailableReplica, ...] = ()


@dataclass(frozen=True, slots=True)
class UnavailableReplica:
    """A replica that served, is unready now, and that no knob replaces: the fleet is one short
    until its engine answers again or someone deletes the pod."""

    name: str
    since: str  # when the operator first saw this unready stretch (its own clock); "" if unknowable
    why: str  # why no replacement is coming
    first_seen: bool  # seen unready for the first time in this stretch, by this reconcile

    @property
    def summary(self) -> str:
        """For the Degraded condition: a time, not a running count (no status rewrite per reconcile)."""
        since = f"since {self.since}" if self.since else "since an unknown time"
        return f"{self.name} unready after serving {since} ({self.why})"

    @property
    def message(self) -> str:
        """For the Event, posted once per unready stretch."""
        since = f" since {self.since}" if self.since else ""
        return (
            f"pod {self.name} was Ready, is unready{since} and will not be replaced: {self.why}; "
            "it serves nothing until its engine answers again or the pod is deleted"
        )


def _allowance(
    pod: ObservedPod, unready_after_s: int, never_ready_after_s: int
) -> tuple[UnhealthyReason, int, str] | None:
    """(reason, allowance, knob) of a Running pod that is not Ready; None when it has none (Ready,
    not Running, draining, no readable transition time, the knob at 0).

    A pod that served (``ObservedPod.was_ready``) and whose engine process has not started
    again since it turned unready is hung: ``replaceUnreadyAfterSeconds``. A pod that never served,
    or whose engine was restarted by the kubelet since (a crash: it is loading its model again), is
    starting: ``replaceNeverReadyAfterSeconds``. Pending pods wait for a node or an image: no
    replacement fixes that. An unreadable transition time (what ties the operator's own sighting
    to this unready stretch: ANNOTATION_UNREADY_SEEN) never replaces a pod."""
    if not pod.alive or pod.ready or pod.draining or pod.phase != "Running":
        return None
    if _parse_time(pod.ready_changed) is None:
        return None
    if pod.was_ready and not _engine_restarted(pod):
        reason: UnhealthyReason = "unready"
        allowance, knob = unready_after_s, "spec.engine.replaceUnreadyAfterSeconds"
    else:
        reason = "never_ready"
        allowance, knob = never_ready_after_s, "spec.engine.replaceNeverReadyAfterSeconds"
    return (reason, allowance, knob) if allowance > 0 else None


def stays_unavailable(pod: ObservedPod, unready_after_s: int, never_ready_after_s: int) -> bool:
    """It served, is unready now, and nothing brings it back: no knob replaces it and the kubelet is
    not restarting its engine. It is no capacity, none is on its way for it, and the fleet says so
    (``Degraded``, reason ``ReplicaUnavailable``)."""
    return _unavailable_given(pod, _allowance(pod, unready_after_s, never_ready_after_s))


def _unavailable_given(pod: ObservedPod, allowance: tuple[UnhealthyReason, int, str] | None) -> bool:
    """:func:`stays_unavailable` for a pod whose :func:`_allowance` is known already."""
    return allowance is None and pod.lapsed and not _engine_restarted(pod)


def unavailable_while_invalid(pods: Sequence[ObservedPod]) -> tuple[str, ...]:
    """The replicas that stay unavailable while the fleet's spec is invalid: the operator plans
    nothing then and so replaces nothing, whatever the knobs say, and every pod that served and is
    unready (its engine not being restarted by the kubelet) stays so until the spec is fixed."""
    return tuple(p.name for p in pods if stays_unavailable(p, 0, 0))


def unready_since(pod: ObservedPod, now: datetime) -> datetime | None:
    """When the operator first saw the pod's current unready stretch (its ANNOTATION_UNREADY_SEEN
    mark); None when there is no readable mark, or one later than ``now`` (a hand edit, or a writer
    whose clock ran ahead): counting from it would hold a replacement back until then, forever for a
    far one, so the stretch is seen, and marked afresh, now."""
    seen = _parse_time(pod.unready_seen)
    return seen if seen is not None and seen <= now else None


def _no_replacement_why(pod: ObservedPod, unready_after_s: int) -> str:
    """Why :func:`_allowance` gives a pod that served and is unready none (for the fleet's users)."""
    if pod.phase != "Running":
        return f"pod phase {pod.phase}"
    if _parse_time(pod.ready_changed) is None:
        return "its Ready condition has no readable transition time"
    return f"spec.engine.replaceUnreadyAfterSeconds is {unready_after_s}"


def plan_unhealthy(
    pods: Sequence[ObservedPod],
    now: datetime,
    unready_after_s: int,
    never_ready_after_s: int,
    *,
    leaving: Sequence[str] = (),
    creating: int = 0,
) -> UnhealthyPlan:
    """Which unhealthy replica to replace now: at most one, and only when no other replica is on
    its way in or out (``leaving``: pods the rest of the plan deletes or drains; ``creating``: pods
    it creates).

    One at a time, each replacement Ready before the next, because "every replica unready" is far
    more often a shared cause (Redis, the model store, the network) than many engines hanging at
    once: replacing them all would throw away every warm cache and restart every model load for
    nothing. So under such an outage exactly one replica is replaced; its replacement does not come
    up either, which holds back the rest until the outage ends (they then recover by themselves).

    A replica that never came up and is over ``replaceNeverReadyAfterSeconds`` goes before any that
    served, and while one is overdue no replica that served is replaced: it has no cache to lose,
    and a fresh pod that cannot come up points at a shared cause again. Otherwise, under an outage
    with that knob set, the replacement would stop holding back once overdue itself and every warm
    replica would be replaced in turn, one per allowance.

    A replica that served, is unready, and that nothing replaces (no knob applies and the kubelet is
    not restarting its engine) is listed as ``unavailable``: the fleet reports it instead of looking
    healthy one replica short.
    """
    overdue: list[UnhealthyReplica] = []
    remaining: list[float] = []  # seconds left of each other unready replica's allowance
    first_seen: list[ObservedPod] = []
    unavailable: list[UnavailableReplica] = []
    for p in pods:
        if p.name in leaving:
            continue
        found = _allowance(p, unready_after_s, never_ready_after_s)
        if _unavailable_given(p, found):  # stays_unavailable, without computing the allowance again
            # reported (Degraded, one Event per stretch), and marked like the others so its "since" is
            # the operator's time, stable across reconciles and restarts; a stretch it cannot tell
            # from the next (no readable transition time) is not marked
            seen = unready_since(p, now)
            new = seen is None and _parse_time(p.ready_changed) is not None
            if new:
                first_seen.append(p)
            since = _format_time(now) if new else p.unready_seen if seen is not None else ""
            why = _no_replacement_why(p, unready_after_s)
            unavailable.append(UnavailableReplica(p.name, since, why, new))
            continue
        if found is None:
            continue
        reason, allowance, knob = found
        # counted on the operator's clock from its first sighting (ANNOTATION_UNREADY_SEEN)
        since = unready_since(p, now)
        if since is None:
            first_seen.append(p)
            since = now
        waited = (now - since).total_seconds()
        if waited >= allowance:
            overdue.append(UnhealthyReplica(p.name, reason, p.unready_seen, waited, allowance, knob))
        else:
            remaining.append(allowance - waited)
    overdue.sort(key=lambda u: (u.reason != "never_ready", -u.seconds, u.name))
    names = {u.name for u in overdue}
    recheck = max(min(remaining), 0.0) if remaining else None
    if not overdue:
        return UnhealthyPlan(
            recheck_after_s=recheck, first_seen=tuple(first_seen), unavailable=tuple(unavailable)
        )
    # (a pod no node has room for is waiting for capacity, not starting: it says nothing about a
    # shared cause, and it can wait for hours while a cluster grows, or forever)
    starting = [
        p.name
        for p in pods
        if p.alive
        and not p.ready
        and not p.unschedulable
        and p.name not in names
        and p.name not in leaving
        and (not p.was_ready or _engine_restarted(p))
    ]
    held = ""
    if creating:
        held = f"{creating} replica pod(s) are being created"
    elif leaving:
        # (a pod already terminating does not count: its replacement, created meanwhile, does, and
        # one stuck terminating on a lost node must not hold back every replacement after it)
        held = f"{', '.join(sorted(set(leaving)))} is being removed"
    elif starting:
        held = f"{', '.join(sorted(starting))} is still starting"
    chosen = None if held else overdue[0]
    return UnhealthyPlan(tuple(overdue), chosen, held, recheck, tuple(first_seen), tuple(unavailable))


def _engine_restarted(pod: ObservedPod) -> bool:
    """The kubelet restarted the engine since the pod turned unready, or is about to (a crash
    back-off): without this, a crash-looping engine counted as hung whenever a reconcile fell in its
    back-off, and as loading again whenever it fell between."""
    if pod.engine_down:
        return True
    started, since = _parse_time(pod.engine_started), _parse_time(pod.ready_changed)
    return started is not None and since is not None and started > since


def condition(
    previous: Sequence[JSON],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> JSON:
    """A status condition; its lastTransitionTime moves only when its status changes."""
    text = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    changed = old is None or old.get("status") != text
    stamp = _format_time(now) if changed else old.get("lastTransitionTime")
    return {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": stamp,
        "observedGeneration": generation,
    }


def plan_status(
    fleet: FleetRef,
    spec: FleetSpec,
    observed: ObservedState,
    template_hash: str,
    creates: int,
    deletions: Sequence[PodDeletion],
    unhealthy: UnhealthyPlan | None = None,
) -> JSON:
    alive = [p for p in observed.pods if p.alive]
    ready = [p for p in alive if p.ready]
    current_ready = [p for p in ready if p.template_hash == template_hash]
    outdated = [p for p in alive if p.template_hash != template_hash]
    failed = [p for p in observed.pods if p.failed]
    want = spec.replicas
    unavailable = unhealthy.unavailable if unhealthy is not None else ()
    router_ok = spec.router.replicas == 0 or observed.router_ready_replicas >= 1
    all_ready = len([p for p in current_ready if p.serving]) >= want and not outdated
    if want == 0:
        ready_cond = (True, "ScaledToZero", "spec.replicas is 0")
    elif all_ready and router_ok:
        # with router.replicas 0 no router is run: say so rather than claim one is ready
        router_part = "router ready" if spec.router.replicas else "no router requested"
        ready_cond = (True, "AllReplicasReady", f"{len(current_ready)}/{want} replicas ready, {router_part}")
    elif not router_ok:
        ready_cond = (False, "RouterNotReady", f"{len(ready)}/{want} replicas ready, no router replica ready")
    else:
        ready_cond = (False, "ReplicasNotReady", f"{len(current_ready)}/{want} replicas ready")
    if outdated:
        progressing = (True, "RollingUpdate", f"{len(outdated)} replica(s) on an old template")
    elif len(alive) < want or creates:
        progressing = (True, "ScalingUp", f"{len(alive)} -> {want} replicas")
    elif any(p.draining for p in alive):
        progressing = (True, "Draining", "draining: " + ", ".join(p.name for p in alive if p.draining))
    elif len(alive) > want:
        progressing = (True, "ScalingDown", f"{len(alive)} -> {want} replicas")
    elif len(ready) < want and unavailable and len(ready) + len(unavailable) >= want:
        # the only replicas missing are hung ones nothing replaces: nothing is under way, so waiting
        # (kubectl wait --for=condition=Progressing=false) must end; Degraded says why
        progressing = (
            False,
            "ReplicaUnavailable",
            f"{len(ready)}/{want} replicas ready, no replacement coming",
        )
    elif len(ready) < want:
        progressing = (True, "WaitingForReplicas", f"{len(ready)}/{want} replicas ready")
    else:
        progressing = (False, "ReconcileComplete", f"{want} replicas on template {template_hash}")
    if observed.redis_problem:
        # first: sidecars exit at start without their Redis, so it is the cause of what else fails
        degraded = (True, REDIS_UNUSABLE, observed.redis_problem)
    elif observed.redis_auth_problem:
        # replicas may look ready, but no sidecar can register: the gateways route blind
        degraded = (True, REDIS_AUTH_FAILED, observed.redis_auth_problem)
    elif observed.redis_permission_problem:
        # likewise: some writes, reads or pushes of the fleet fail on every call
        degraded = (True, REDIS_PERMISSION_DENIED, observed.redis_permission_problem)
    elif observed.redis_refused:
        # likewise, whatever the ACL: the fleet's calls get the same errors
        degraded = (True, REDIS_COMMANDS_REFUSED, observed.redis_refused)
    elif failed:
        degraded = (
            True,
            "ReplicaFailed",
            "failed replica pod(s) replaced: " + ", ".join(p.name for p in failed),
        )
    elif unhealthy is not None and unhealthy.overdue:
        first = unhealthy.overdue[0]
        if unhealthy.replace is not None:
            what = f"{first.summary}: replacing it"
        else:
            what = f"{first.summary}: replacement held back while {unhealthy.held_back_by} (one at a time)"
        more = len(unhealthy.overdue) - 1
        degraded = (True, "ReplicaUnhealthy", what + (f"; {more} more unhealthy" if more else ""))
    elif unavailable:
        # served, unready, nothing replaces them: the fleet is short, and would otherwise look healthy
        degraded = (
            True,
            "ReplicaUnavailable",
            "no replacement coming: " + "; ".join(u.summary for u in unavailable),
        )
    elif not observed.redis_url:
        # without Redis the gateways learn no members: say so instead of looking healthy
        degraded = (
            True,
            "NoRedis",
            "no Redis: set spec.redis.url or .secretRef, or run the operator with --redis",
        )
    else:
        degraded = (False, "AsExpected", "no failures observed")
    g, now, prev = fleet.generation, observed.now, observed.conditions
    # only while it holds (as a Deployment's ReplicaFailure): fleets without a password in their URL
    # keep the three conditions they had
    exposed = observed.redis_password_warning
    warnings = [condition(prev, REDIS_PASSWORD_EXPOSED, True, REDIS_PASSWORD_IN_SPEC, exposed, now, g)]
    verdict = redis_verdict_condition(observed, now, g)
    verdict += refused_condition(observed.redis_refused, prev, now, g)
    return {
        "observedGeneration": fleet.generation,
        "replicas": len(alive),
        "readyReplicas": len(ready),
        "updatedReplicas": len([p for p in alive if p.template_hash == template_hash]),
        "selector": replica_selector(fleet),
        "routerEndpoint": router_endpoint(fleet, spec),
        "templateHash": template_hash,
        "conditions": [
            condition(prev, "Ready", *ready_cond, now, g),
            condition(prev, "Progressing", *progressing, now, g),
            condition(prev, "Degraded", *degraded, now, g),
            *(warnings if exposed else []),
            *verdict,
        ],
    }


def redis_verdict_condition(observed: ObservedState, now: datetime, generation: int) -> list[JSON]:
    """The RedisAccessDenied condition of the round's verdict; none while Redis takes the fleet."""
    if observed.redis_auth_problem:
        reason, message = REDIS_AUTH_FAILED, observed.redis_auth_problem
    elif observed.redis_permission_problem:
        reason, message = REDIS_PERMISSION_DENIED, observed.redis_permission_problem
    else:
        return []
    return [condition(observed.conditions, REDIS_ACCESS_DENIED, True, reason, message, now, generation)]


def refused_condition(
    refused: str, previous: Sequence[Mapping[str, Any]], now: datetime, generation: int
) -> list[JSON]:
    """The RedisCommandsRefused condition of the verdict ``refused`` (ObservedState.redis_refused);
    none while Redis refuses nothing."""
    if not refused:
        return []
    return [condition(previous, REDIS_REFUSING, True, REDIS_COMMANDS_REFUSED, refused, now, generation)]


def with_project_image(spec: FleetSpec, image: str) -> FleetSpec:
    """``spec`` with the default project image replaced by ``image`` (no change when empty)."""
    if not image or image == PROJECT_IMAGE:
        return spec

    def swap(value: str | None) -> str | None:
        return image if value == PROJECT_IMAGE else value

    return spec.model_copy(
        update={
            "engine": spec.engine.model_copy(update={"image": swap(spec.engine.image)}),
            "sidecar": spec.sidecar.model_copy(update={"image": swap(spec.sidecar.image)}),
            "router": spec.router.model_copy(update={"image": swap(spec.router.image)}),
        }
    )


def plan_reconcile(fleet: FleetRef, spec: FleetSpec, observed: ObservedState) -> ReconcilePlan:
    """Everything the operator should change now to move the cluster toward ``spec``."""
    spec = with_project_image(spec, observed.project_image)
    template, template_hash = replica_template(fleet, spec, observed.redis_url)
    pod_plan = plan_pods(fleet, spec.replicas, template_hash, observed)
    unhealthy = plan_unhealthy(
        observed.pods,
        observed.now,
        spec.engine.replace_unready_after_seconds,
        spec.engine.replace_never_ready_after_seconds,
        leaving=[d.name for d in pod_plan.delete] + pod_plan.drain,
        creating=len(pod_plan.create),
    )
    replaced = (unhealthy.replace,) if unhealthy.replace is not None else ()
    pod_plan.delete += [PodDeletion(u.name, f"unhealthy ({u.reason})") for u in replaced]
    pods = tuple(
        replica_pod(fleet, template, template_hash, k, observed.fleet_labels) for k in pod_plan.create
    )
    children = []
    relabelled: list[LabelWrite] = []  # every object whose labels change with the fleet's (the Event)
    for manifest in desired_children(fleet, spec, observed.redis_url):
        key = f"{manifest['kind']}/{manifest['metadata']['name']}"
        wanted = manifest["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        stale = with_fleet_labels(manifest, observed.fleet_labels, observed.child_labels.get(key))
        if key not in observed.children:
            children.append(ChildChange("create", manifest))
        elif observed.children[key] != wanted or stale:
            children.append(ChildChange("replace", manifest, labels_only=observed.children[key] == wanted))
            relabelled += stale
    pod_labels = stale_replica_labels(
        observed.pods, observed.fleet_labels, template_hash, replica_own_labels(template), pod_plan.delete
    )
    relabelled += pod_labels
    events: list[PlannedEvent] = []
    for pod in pods:
        events.append(PlannedEvent("Normal", "CreatingReplica", f"creating pod {pod['metadata']['name']}"))
    for name in pod_plan.drain:
        events.append(PlannedEvent("Normal", "DrainingReplica", f"draining pod {name} before removing it"))
    for d in pod_plan.delete:
        if d.reason.startswith("unhealthy"):
            continue  # said below, with how long it was unready
        kind: EventType = "Warning" if d.reason.startswith("pod ") else "Normal"
        events.append(PlannedEvent(kind, "DeletingReplica", f"deleting pod {d.name}: {d.reason}"))
    for u in replaced:
        events.append(PlannedEvent("Warning", "ReplicaUnhealthy", f"{u.message}: replacing it"))
    for lost in unhealthy.unavailable:
        if lost.first_seen:  # once per unready stretch: the mark written with it says it was seen
            events.append(PlannedEvent("Warning", "ReplicaUnavailable", lost.message))
    events += router_event(children)
    events += labels_event(relabelled)
    events += degraded_event(REDIS_UNUSABLE, observed.redis_problem, observed.conditions)
    events += verdict_event(REDIS_AUTH_FAILED, observed.redis_auth_problem, observed.conditions)
    events += verdict_event(REDIS_PERMISSION_DENIED, observed.redis_permission_problem, observed.conditions)
    events += refused_event(observed.redis_refused, observed.conditions)
    events += password_event(observed.redis_password_warning, observed.conditions, fleet.generation)
    status = plan_status(fleet, spec, observed, template_hash, len(pods), pod_plan.delete, unhealthy)
    return ReconcilePlan(
        tuple(pods),
        tuple(pod_plan.delete),
        tuple(children),
        status,
        tuple(events),
        tuple(pod_plan.drain),
        tuple(pod_plan.undrain),
        mark_ready=tuple(p.name for p in observed.pods if p.alive and p.ready and not p.first_ready),
        mark_unready=tuple(
            (p.name, unready_mark(observed.now, p.ready_changed)) for p in unhealthy.first_seen
        ),
        label_writes=tuple(relabelled),
        replaced=replaced,
        recheck_after_s=unhealthy.recheck_after_s,
        unavailable=unhealthy.unavailable,
    )


@dataclass(frozen=True, slots=True)
class LabelWrite:
    """Labels the plan writes on one object because the fleet's labels changed: ``what`` names it
    (a replica pod's name, or a router child's "Kind/name"), ``desired`` is what its labels of the
    operator's should be, ``seen`` what they are and what its record says. ``part`` is "pod" for a
    replica pod, "metadata" for a router child's own labels, "pod template" for the gateway
    Deployment's pod template (its pods' labels)."""

    what: str
    desired: Mapping[str, str]
    seen: ObservedLabels
    part: Literal["pod", "metadata", "pod template"] = "pod"


def with_fleet_labels(
    manifest: JSON, fleet_labels: Mapping[str, str], seen: ObservedLabels | None
) -> list[LabelWrite]:
    """Give a router child ``manifest`` the fleet's labels besides its own (its own win), after its
    spec hash was taken: a label change updates it in place. The gateway Deployment's pod template
    gets them too, so the gateway pods carry them as the replica pods do (``kubectl get pods -l
    team=x`` finds the whole fleet); its selector is not touched (immutable; the operator's own
    labels only). Kubernetes rolls the gateway pods to relabel them: a template change is a new
    ReplicaSet. Returns the parts whose labels ``seen`` (None: not observed) shows stale."""
    key = f"{manifest['kind']}/{manifest['metadata']['name']}"
    labels = manifest["metadata"]["labels"]
    labels.update(fleet_labels_of(fleet_labels, labels))
    stale = []
    if seen is not None and labels_stale(labels, seen):
        stale.append(LabelWrite(key, labels, seen, "metadata"))
    template = (manifest.get("spec") or {}).get("template")
    if template is not None:
        pod_labels = template["metadata"]["labels"]
        extra = fleet_labels_of(fleet_labels, pod_labels)
        pod_labels.update(extra)
        # Only the fleet's labels missing or different count: the template's own (its
        # spec.router.podTemplate's) are in the spec hash, and a label the fleet dropped is in the
        # Deployment's own labels' record too (their update removes it from the template as well).
        if seen is not None and seen.pod_template is not None:
            live = ObservedLabels(seen.pod_template)
            if labels_stale(extra, live):
                stale.append(LabelWrite(key, extra, live, "pod template"))
    return stale


def replica_fleet_labels(
    pod: ObservedPod, fleet_labels: Mapping[str, str], template_hash: str, own: Collection[str]
) -> JSON:
    """The fleet's labels replica ``pod`` should carry: all but those its own template sets.

    ``own`` are the current template's label keys. A pod on an outdated template (a rolling update
    in progress) has its own template's, which may differ (spec.engine.podTemplate's labels
    changed): it is relabelled by its own, so a label its template set is not overwritten with the
    fleet's, and a fleet label the new template sets itself is not taken off a pod whose template did
    not. Its own keys are those it carries that the operator did not put there from the fleet (its
    record); without a record every label it carries counts as its template's: it only gets the
    fleet labels it lacks."""
    if pod.template_hash == template_hash:
        return fleet_labels_of(fleet_labels, own)
    return fleet_labels_of(fleet_labels, set(pod.labels.live) - set(pod.labels.recorded or {}))


def stale_replica_labels(
    pods: Sequence[ObservedPod],
    fleet_labels: Mapping[str, str],
    template_hash: str,
    own: Collection[str],
    deleting: Sequence[PodDeletion],
) -> list[LabelWrite]:
    """The replica pods that stay and whose fleet labels are not those they should carry
    (:func:`replica_fleet_labels`): set in place, those the operator put there before and the fleet
    dropped removed (its record), others' labels untouched. Not a new template, so no pod is
    replaced: a pod on an outdated template is relabelled too (it may serve for a while yet)."""
    going = {d.name for d in deleting}
    writes = []
    for p in pods:
        if p.alive and p.name not in going:
            desired = replica_fleet_labels(p, fleet_labels, template_hash, own)
            if labels_stale(desired, p.labels):
                writes.append(LabelWrite(p.name, desired, p.labels, "pod"))
    return writes


def router_event(children: Sequence[ChildChange]) -> list[PlannedEvent]:
    """One RouterChanged Event for the round's router children created or whose spec changed (not
    one per child: a first reconcile, or a spec change, is one change of the fleet). Children
    written only for their labels are said by :func:`labels_event`."""
    created = [c.key for c in children if c.action == "create"]
    updated = [c.key for c in children if c.action == "replace" and not c.labels_only]
    groups = (("creating", created), ("updating", updated))
    said = [f"{verb} {', '.join(keys)}" for verb, keys in groups if keys]
    return [PlannedEvent("Normal", "RouterChanged", "; ".join(said))] if said else []


def labels_event(writes: Sequence[LabelWrite]) -> list[PlannedEvent]:
    """One LabelsChanged Event for a change of the fleet's labels: which labels are set (to what)
    and removed, on which children (replica pods counted), and that the gateway pods roll."""
    if not writes:
        return []
    set_to = {k: v for w in writes for k, v in w.desired.items() if w.seen.live.get(k) != v}
    removed = {k for w in writes for k in w.seen.recorded or {} if k not in w.desired}
    changes = [f"set {', '.join(f'{k}={v}' for k, v in sorted(set_to.items()))}"] if set_to else []
    changes += [f"removed {', '.join(sorted(removed))}"] if removed else []
    children = list(dict.fromkeys(w.what for w in writes if w.part != "pod"))  # a Deployment once
    pods = len([w for w in writes if w.part == "pod"])
    targets = [*children, *([f"{pods} replica pod{'s' if pods != 1 else ''}"] if pods else [])]
    # (nothing set or removed: only a record differed, e.g. one edited by hand)
    message = f"fleet labels changed ({'; '.join(changes) or 'record updated'}):"
    message += f" relabelling {', '.join(targets)} in place"
    if any(w.part == "pod template" for w in writes):
        message += "; the gateway pods roll to carry them (the Deployment's pod template)"
    return [PlannedEvent("Normal", "LabelsChanged", message)]


# The Degraded reasons whose Warning Event the plan posts when the Degraded condition turns to them
# (degraded_event, which compares with the condition the fleet shows). Not RedisCommandsRefused: its
# Event follows its own condition (refused_event), whichever cause Degraded shows.
DEGRADED_EVENTS = frozenset({REDIS_UNUSABLE})


def events_carried_out(
    plan: ReconcilePlan, written: Collection[str], degraded_taken: bool = False
) -> tuple[PlannedEvent, ...]:
    """The plan's Events once it ran, ``written`` being the replica pods and router children
    ("Kind/name") the API server took: its LabelsChanged Event says only the label writes carried
    out, its RouterChanged Event only the router children created or updated, and each goes when
    none was. A relabel or a router update refused round after round (an admission policy, a
    webhook) would otherwise post the same Event every round, saying it was being done; the refusal
    has its own, once (ChildRefused).

    ``degraded_taken``: a refused child took the fleet's Degraded condition this round
    (refusals.with_refusals), so the plan's own Degraded cause is not what the fleet shows: its
    Event (:data:`DEGRADED_EVENTS`) goes, and is posted when Degraded turns to it. Compared round
    after round with a Degraded condition showing ChildRefused, it would be posted every round."""
    events = tuple(e for e in plan.events if not (degraded_taken and e.reason in DEGRADED_EVENTS))
    done = [w for w in plan.label_writes if w.what in written]
    changed = [c for c in plan.children if c.key in written]
    if len(done) == len(plan.label_writes) and len(changed) == len(plan.children):
        return events
    out: list[PlannedEvent] = []
    for event in events:
        if event.reason == "LabelsChanged":
            out += labels_event(done)
        elif event.reason == "RouterChanged":
            out += router_event(changed)
        else:
            out.append(event)
    return tuple(out)


def redis_verdict(
    login: str | None, permissions: str | None, previous: Sequence[Mapping[str, Any]]
) -> tuple[str, str]:
    """(``redis_auth_problem``, ``redis_permission_problem``) of a round, for ObservedState.

    ``login`` is the login check's answer (a refusal's message, "" accepted or nothing to check, None:
    not asked, Redis did not answer or the URL could not be read this round), ``permissions`` the
    permission check's (a denial's message, "" none, None: not asked or no answer). A round that could
    not ask decides nothing about the credentials: the fleet's last verdict (``previous``, its
    status.conditions) is kept as it stands, so an outage neither clears RedisAuthFailed or
    RedisPermissionDenied nor, once Redis answers the same again, raises it anew with another Warning
    Event (:func:`verdict_event`). A round that reached Redis decides alone."""
    held_reason, held = held_verdict(previous)
    if login is None:  # unreachable: neither the login nor the permissions were proven this round
        return (
            held if held_reason == REDIS_AUTH_FAILED else "",
            held if held_reason == REDIS_PERMISSION_DENIED else "",
        )
    if login:
        return login, ""
    if permissions is None:  # the login was accepted (no RedisAuthFailed), then Redis stopped answering
        return "", held if held_reason == REDIS_PERMISSION_DENIED else ""
    return "", permissions


def refused_verdict(refused: str | None, previous: Sequence[Mapping[str, Any]]) -> str:
    """``redis_refused`` of a round, for ObservedState: ``refused`` when Redis answered the checks
    (which commands it refused for a reason about neither the credentials nor the ACL, "" none);
    None when it did not (an outage, a timeout, not asked): such a round decides nothing, and the
    fleet's last verdict stands, as for RedisAccessDenied (:func:`redis_verdict`), so a flaky link
    neither clears RedisCommandsRefused nor posts its Warning Event again when Redis answers the
    same. That verdict is the fleet's RedisCommandsRefused condition, which no other cause takes
    over; a fleet without one (its status written by an operator that kept the verdict only in
    Degraded) has it in a Degraded condition that is True."""
    if refused is not None:
        return refused
    for type_ in (REDIS_REFUSING, "Degraded"):
        shown = _true_condition(previous, type_)
        if shown is not None and shown.get("reason") == REDIS_COMMANDS_REFUSED:
            return str(shown.get("message") or "")
    return ""


def held_verdict(previous: Sequence[Mapping[str, Any]]) -> tuple[str | None, str]:
    """(reason, message) of the fleet's last Redis verdict: its RedisAccessDenied condition, which no
    other cause takes over. A fleet without one (its status written by an operator that kept the
    verdict only in Degraded) has it in a Degraded condition that is True; (None, "") when neither."""
    kept = _true_condition(previous, REDIS_ACCESS_DENIED) or _true_condition(previous, "Degraded")
    if kept is None or kept.get("reason") not in (REDIS_AUTH_FAILED, REDIS_PERMISSION_DENIED):
        return None, ""
    return str(kept.get("reason")), str(kept.get("message") or "")


def _true_condition(previous: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in previous if c.get("type") == type_ and c.get("status") == "True"), None)


def verdict_event(reason: str, message: str, previous: Sequence[Mapping[str, Any]]) -> list[PlannedEvent]:
    """One Warning Event when the fleet's Redis verdict starts or changes: none while its last verdict
    (:func:`held_verdict`) already says so, whichever cause Degraded shows meanwhile."""
    if not message or held_verdict(previous) == (reason, message):
        return []
    return [PlannedEvent("Warning", reason, message)]


def refused_event(refused: str, previous: Sequence[Mapping[str, Any]]) -> list[PlannedEvent]:
    """One Warning Event RedisCommandsRefused when the verdict ``refused`` starts or changes: none
    while the fleet's last one (:func:`refused_verdict`) already says so, whichever cause Degraded
    shows meanwhile (a refused child, an unusable Redis, an invalid spec)."""
    if not refused or refused_verdict(None, previous) == refused:
        return []
    return [PlannedEvent("Warning", REDIS_COMMANDS_REFUSED, refused)]


def degraded_event(reason: str, message: str, previous: Sequence[Mapping[str, Any]]) -> list[PlannedEvent]:
    """One Warning Event when the fleet turns Degraded for ``reason`` or its message changes; none
    while the Degraded condition already says so (not one per reconcile round, nor one per pod)."""
    if not message:
        return []
    old = next((c for c in previous if c.get("type") == "Degraded"), None)
    if old is not None and old.get("reason") == reason and old.get("message") == message:
        return []
    return [PlannedEvent("Warning", reason, message)]


def password_event(
    message: str, previous: Sequence[Mapping[str, Any]], generation: int
) -> list[PlannedEvent]:
    """One Warning Event ``RedisPasswordInSpec`` per fleet generation (and when its message changes):
    none while the fleet's ``RedisPasswordExposed`` condition already says it for this generation."""
    if not message:
        return []
    old = next((c for c in previous if c.get("type") == REDIS_PASSWORD_EXPOSED), None)
    if (
        old is not None
        and old.get("status") == "True"
        and old.get("message") == message
        and old.get("observedGeneration") == generation
    ):
        return []
    return [PlannedEvent("Warning", REDIS_PASSWORD_IN_SPEC, message)]


def url_has_password(url: str) -> bool:
    """Whether a Redis URL carries a password: in its userinfo (``user:pw@``, ``:pw@``; a user
    alone, ``user@``, is none) or in a ``password=`` query parameter, which redis-py's ``from_url``
    also reads (``unix:///run/redis.sock?password=pw``)."""
    try:
        parts = urlsplit(url)
        return bool(parts.password) or any(parse_qs(parts.query).get("password", ()))
    except ValueError:  # unbalanced brackets: refused elsewhere; read the userinfo as redis_url_error does
        userinfo = url.partition("://")[2].rpartition("@")[0]
        return bool(userinfo.partition(":")[2])


def redis_password_warning(redis: Mapping[str, Any], default_url: str) -> str:
    """Why a fleet's Redis password ends up in plain text in its pods and gateway Deployment, from
    its ``spec.redis`` (as written, camelCase) and the operator's default URL; "" when it does not.
    The URL goes into their env (REDIS_URL) as it is: only ``secretRef`` (a Secret key holding the
    URL) and ``passwordSecretRef`` keep a password out of them. Names the field, never the URL."""
    if redis.get("secretRef"):
        return ""  # the env refers to the Secret
    url = redis.get("url")
    if url:
        where = "spec.redis.url"
        fix = (
            "put the password in a Secret and name it in spec.redis.passwordSecretRef (the URL without"
            " it), or the whole URL in a Secret named by spec.redis.secretRef"
        )
    else:
        url, where = default_url, "the operator's default Redis URL (--redis, chart operator.defaultRedisUrl)"
        fix = (
            "give the fleet spec.redis.secretRef (a Secret key holding the whole URL), or run the operator"
            " with a URL without the password and give the fleet spec.redis.passwordSecretRef"
        )
    if not isinstance(url, str) or not url_has_password(url):
        return ""
    return (
        f"{where} holds a password: it is copied in plain text into the replica pods' and the gateway"
        " Deployment's env (REDIS_URL) and the Deployment's prefixfleet.io/last-applied annotation,"
        f" readable by anyone who may get pods or deployments in the namespace; {fix}"
    )


def plan_invalid_spec(fleet: FleetRef, problems: Sequence[str], observed: ObservedState) -> JSON:
    """Status for a spec the models refuse: nothing is changed, Degraded names the fields."""
    message = "; ".join(problems)
    g, now, prev = fleet.generation, observed.now, observed.conditions
    # Redis is not asked while the spec is invalid: its last verdict stands (redis_verdict), as it
    # was, or from Degraded where an older operator kept it (InvalidSpec takes Degraded now)
    kept = _true_condition(prev, REDIS_ACCESS_DENIED)
    reason, held = held_verdict(prev)
    if kept is not None:
        verdict = [dict(kept)]
    else:
        verdict = [condition(prev, REDIS_ACCESS_DENIED, True, reason, held, now, g)] if reason else []
    # likewise the verdict RedisCommandsRefused (kept as it is: same message, same observedGeneration)
    refusing = _true_condition(prev, REDIS_REFUSING)
    if refusing is not None:
        verdict.append(dict(refusing))
    else:
        verdict += refused_condition(refused_verdict(None, prev), prev, now, g)
    return {
        "observedGeneration": fleet.generation,
        "conditions": [
            condition(prev, "Ready", False, "InvalidSpec", message, now, g),
            condition(prev, "Progressing", False, "InvalidSpec", "fix the spec to continue", now, g),
            condition(prev, "Degraded", True, "InvalidSpec", message, now, g),
            *verdict,
        ],
    }


def status_changes(current: Mapping[str, Any], desired: Mapping[str, Any]) -> JSON:
    """The merge patch that turns ``current`` status into ``desired`` (empty when equal)."""
    return {k: v for k, v in desired.items() if current.get(k) != v}
