"""The chart's RBAC against the API calls the operator really makes.

tests/test_chart.py compares the rendered roles with a hand-kept table; nothing checked that table
against the operator. Here the needed rules come from two sources, and every one must be granted by
what the chart renders (defaults: one ClusterRole; ``rbac.scope=namespace``: a Role per watched
namespace plus the small ClusterRole), and every granted rule must be needed:

* a recorded run: `prefixfleet operator run` (kopf and all) against the emulated API server, under
  its own bearer token, through a fleet's life (create with its Redis URL in a Secret, a spec change
  that patches the children with their last-applied record, a Service and ConfigMap edited by hand
  and repaired, a pod deleted by hand, the fleet deleted). Every request the operator sent is
  mapped to (apiGroup, resource[/subresource], verb, namespace); an ownerReference with
  ``blockOwnerDeletion: true`` in a body also needs ``update`` on the owner's ``finalizers``
  subresource (the OwnerReferencesPermissionEnforcement admission plugin, on in OpenShift and many
  hardened clusters, refuses the write otherwise);
* the operator's source: every ``Kube`` call with a literal kind (``kube.annotate("Pod", ...)``,
  the autoscaler's ``/scale`` PATCH, ...), so a path the run does not reach (a scale decision, a
  drain) is covered too.
"""

from __future__ import annotations

import ast
import contextlib
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp.web
import helm_python
import pytest
import yaml
from fleet_fixtures import free_port

from prefixfleet.operator.kube import KIND_PATHS
from prefixfleet.operator.planner import ANNOTATION_SPEC_HASH as SPEC_HASH
from tests.k8s.apiserver import ApiServerThread, EmulatedApiServer, parse_resource_path
from tests.k8s.cluster import EmulatedCluster, OperatorProcess, running_redis, wait_for
from tests.test_chart import bound_to_operator

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "prefixfleet"
OPERATOR_SOURCES = sorted((REPO / "operator").glob("*.py"))
OPERATOR_TOKEN = "prefixfleet-operator"
NAMESPACE = "default"
FLEET = "rbac"
FLEET_WRITES_KEPT = 12
WRITE_CHARS = 300  # of a recorded write's body


@dataclass(frozen=True, order=True)
class Need:
    """One permission a request needs; ``namespace`` None: cluster-wide (any namespace, or a
    cluster-scoped resource)."""

    group: str
    resource: str
    verb: str
    namespace: str | None

    def __str__(self) -> str:
        where = f"in namespace {self.namespace}" if self.namespace else "cluster-wide"
        return f"{self.verb} {self.group or 'core'}/{self.resource} {where}"


# ------------------------------------------------------------------ requests -> needed rules


def verb_of(method: str, named: bool, query: dict[str, str]) -> str:
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PATCH": "patch", "PUT": "update"}[method]


def needs_of_request(method: str, path: str, query: dict[str, str], body: Any) -> list[Need]:
    """What RBAC asks of one request (nothing for discovery: system:discovery grants it to all)."""
    parsed = parse_resource_path(path)
    if parsed is None:
        return []
    resource = parsed.plural + (f"/{parsed.subresource}" if parsed.subresource else "")
    out = [Need(parsed.group, resource, verb_of(method, parsed.name is not None, query), parsed.namespace)]
    meta = body.get("metadata") if isinstance(body, dict) else None
    for ref in (meta or {}).get("ownerReferences") or []:
        if ref.get("blockOwnerDeletion"):
            group = ref["apiVersion"].rpartition("/")[0]
            out.append(Need(group, f"{plural_of(ref['kind'])}/finalizers", "update", parsed.namespace))
    return out


def plural_of(kind: str) -> str:
    return KIND_PATHS[kind][1]


def group_of(kind: str) -> str:
    prefix = KIND_PATHS[kind][0]  # /api/v1 or /apis/GROUP/VERSION
    return "" if prefix.startswith("/api/") else prefix.split("/")[2]


class RecordingApiServer(EmulatedApiServer):
    """The emulated API server, noting every request sent with the operator's token."""

    def __init__(self) -> None:
        super().__init__()
        self.operator_requests: list[tuple[str, str, dict[str, str], Any]] = []
        # The last writes to fleets and the answers, for a wait on a fleet that times out to show:
        # at INFO the operator's log says nothing of a refused finalizer removal (kopf logs a 422
        # to its JSON patch at debug level) nor of one it has not sent yet.
        self.fleet_writes: deque[str] = deque(maxlen=FLEET_WRITES_KEPT)

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        body: Any = None
        if raw.can_read_body:
            with contextlib.suppress(ValueError):
                body = json.loads(await raw.read() or b"null")  # aiohttp keeps it for _serve
        if raw.headers.get("Authorization") == f"Bearer {OPERATOR_TOKEN}":
            self.operator_requests.append((raw.method, raw.path, dict(raw.query), body))
        response = await super().__call__(raw)
        parsed = parse_resource_path(raw.path)
        if raw.method != "GET" and parsed is not None and parsed.plural == "prefixcachefleets":
            said = response.text if isinstance(response, aiohttp.web.Response) else None
            answer = said if response.status >= 400 else f"resourceVersion {_version_in(said)}"
            self.fleet_writes.append(
                f"{raw.method} {raw.path} ({raw.content_type}) {json.dumps(body)[:WRITE_CHARS]}"
                f" -> {response.status}: {answer}"
            )
        return response


def _version_in(text: str | None) -> str | None:
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return json.loads(text or "")["metadata"]["resourceVersion"]
    return None


# ------------------------------------------------------------------ the operator's source -> rules

# Kube method -> (verb, subresource) for the calls whose kind is written in the call.
KUBE_METHODS: dict[str, tuple[str, str | None]] = {
    "get": ("get", None),
    "list": ("list", None),
    "delete": ("delete", None),
    "annotate": ("patch", None),
    "merge_patch": ("patch", None),
    "patch_status": ("patch", "status"),
}
# Kinds come from the planner's manifests: the recorded run covers them.
MANIFEST_METHODS = frozenset({"create", "replace_spec"})


def _is_kube(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "kube") or (
        isinstance(node, ast.Attribute) and node.attr == "kube"
    )


def _strings(node: ast.expr, loops: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """The literal string(s) an argument can be: a constant, or a loop variable over literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.Name) and node.id in loops:
        return loops[node.id]
    return None


class KubeCallScanner(ast.NodeVisitor):
    """Collects (verb, kind, subresource) of every Kube call in a module; calls whose kind cannot be
    read from the source (other than the manifest-driven ones) are listed in ``unresolved``."""

    def __init__(self, filename: str) -> None:
        self.filename = filename
        self.loops: dict[str, tuple[str, ...]] = {}
        self.found: set[tuple[str, str, str | None]] = set()
        self.unresolved: list[str] = []

    def visit_For(self, node: ast.For) -> None:
        values = None
        if isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple | ast.List):
            items = [_strings(e, {}) for e in node.iter.elts]
            if all(items):
                values = tuple(v for item in items for v in item or ())
        if values is None:
            self.generic_visit(node)
            return
        assert isinstance(node.target, ast.Name)
        previous = self.loops.get(node.target.id)
        self.loops[node.target.id] = values
        self.generic_visit(node)
        if previous is None:
            self.loops.pop(node.target.id)
        else:
            self.loops[node.target.id] = previous

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, list(node.args)
        # asyncio.to_thread(ctx.kube.annotate, "Pod", ...) calls the first argument with the rest
        if isinstance(func, ast.Attribute) and func.attr == "to_thread" and args:
            func, args = args[0], args[1:]
        if isinstance(func, ast.Attribute) and _is_kube(func.value):
            self._kube_call(func.attr, args, node.lineno)
        self.generic_visit(node)

    def _kube_call(self, method: str, args: list[ast.expr], line: int) -> None:
        where = f"{self.filename}:{line} kube.{method}"
        if method in MANIFEST_METHODS or method in ("path",):
            return
        if method == "read_secret_key":
            self.found.add(("get", "Secret", None))
            return
        if method == "request":
            verb_method = _strings(args[0], self.loops) if args else None
            path = args[1] if len(args) > 1 else None
            if not (verb_method and isinstance(path, ast.Call) and isinstance(path.func, ast.Attribute)):
                self.unresolved.append(where)
                return
            kinds = _strings(path.args[0], self.loops) if path.args else None
            named = len(path.args) > 2
            sub = _strings(path.args[3], self.loops) if len(path.args) > 3 else (None,)
            if not kinds or sub is None:
                self.unresolved.append(where)
                return
            for m in verb_method:
                for kind in kinds:
                    self.found.add((verb_of(m, named, {}), kind, sub[0]))
            return
        if method not in KUBE_METHODS:
            self.unresolved.append(where)
            return
        kinds = _strings(args[0], self.loops) if args else None
        if not kinds:
            self.unresolved.append(where)
            return
        verb, sub = KUBE_METHODS[method]
        for kind in kinds:
            self.found.add((verb, kind, sub))


def source_needs() -> tuple[set[tuple[str, str, str]], list[str]]:
    """(group, resource, verb) of every Kube call in operator/, and the calls that could not be read."""
    found: set[tuple[str, str, str | None]] = set()
    unresolved: list[str] = []
    for path in OPERATOR_SOURCES:
        if path.name == "kube.py":  # the wrapper itself, not a caller
            continue
        scanner = KubeCallScanner(path.name)
        scanner.visit(ast.parse(path.read_text(), filename=str(path)))
        found |= scanner.found
        unresolved += scanner.unresolved
    needs = {
        (group_of(kind), plural_of(kind) + (f"/{sub}" if sub else ""), verb) for verb, kind, sub in found
    }
    return needs, unresolved


# ------------------------------------------------------------------ rendered chart -> granted rules


def rendered_roles(values: dict[str, Any]) -> list[dict[str, Any]]:
    """The roles the chart binds to the operator (not the ones it aggregates into admin/edit/view)."""
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name="prefixfleet", namespace="prefixfleet")
    docs = [yaml.safe_load_all(text) for path, text in manifests.items() if not path.endswith("NOTES.txt")]
    return bound_to_operator([d for stream in docs for d in stream if d])


def granted(roles: list[dict[str, Any]]) -> set[Need]:
    """Every (group, resource, verb, namespace) the roles grant; a ClusterRole's namespace is None."""
    out = set()
    for role in roles:
        namespace = role["metadata"].get("namespace") if role["kind"] == "Role" else None
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add(Need(group, resource, verb, namespace))
    return out


def is_granted(need: Need, grants: set[Need]) -> bool:
    """A ClusterRole's rule (bound by a ClusterRoleBinding) covers every namespace; a Role's only its own."""
    return any(
        (g.group, g.resource, g.verb) == (need.group, need.resource, need.verb)
        and (g.namespace is None or g.namespace == need.namespace)
        for g in grants
    )


def missing(needs: set[Need], grants: set[Need]) -> list[str]:
    return sorted(str(n) for n in needs if not is_granted(n, grants))


def unused(needs: set[Need], grants: set[Need]) -> list[str]:
    used = {(n.group, n.resource, n.verb) for n in needs}
    return sorted(str(g) for g in grants if (g.group, g.resource, g.verb) not in used)


# ------------------------------------------------------------------ unit checks of the mapping


def test_requests_map_to_the_rbac_verbs_the_api_server_checks() -> None:
    watch = needs_of_request("GET", "/api/v1/pods", {"watch": "true"}, None)
    assert watch == [Need("", "pods", "watch", None)]
    assert needs_of_request("GET", "/api/v1/namespaces/a/pods", {}, None) == [Need("", "pods", "list", "a")]
    assert needs_of_request("GET", "/api/v1/namespaces/a/secrets/s", {}, None) == [
        Need("", "secrets", "get", "a")
    ]
    scale = "/apis/prefixfleet.io/v1alpha1/namespaces/a/prefixcachefleets/f/scale"
    assert needs_of_request("PATCH", scale, {}, {}) == [
        Need("prefixfleet.io", "prefixcachefleets/scale", "patch", "a")
    ]
    assert needs_of_request("GET", "/api/v1/namespaces", {}, None) == [Need("", "namespaces", "list", None)]
    assert needs_of_request("GET", "/apis", {}, None) == []  # discovery
    owner = {"apiVersion": "prefixfleet.io/v1alpha1", "kind": "PrefixCacheFleet", "blockOwnerDeletion": True}
    adopted = {"metadata": {"ownerReferences": [owner]}}
    assert needs_of_request("POST", "/api/v1/namespaces/a/pods", {}, adopted) == [
        Need("", "pods", "create", "a"),
        Need("prefixfleet.io", "prefixcachefleets/finalizers", "update", "a"),
    ]


def test_a_role_covers_its_own_namespace_only() -> None:
    grants = {Need("", "pods", "get", "team-a"), Need("", "namespaces", "list", None)}
    assert missing({Need("", "pods", "get", "team-a"), Need("", "namespaces", "list", None)}, grants) == []
    assert missing({Need("", "pods", "get", "team-b")}, grants) == ["get core/pods in namespace team-b"]
    assert missing({Need("", "pods", "get", None)}, grants) == ["get core/pods cluster-wide"]


def test_the_source_scan_reads_every_kube_call_of_the_operator() -> None:
    needs, unresolved = source_needs()
    assert unresolved == [], "Kube calls whose kind the scan cannot read (write the kind, or extend the scan)"
    # the autoscaler's scale decision and the drain marks: paths a short run does not reach
    assert ("prefixfleet.io", "prefixcachefleets/scale", "patch") in needs
    assert ("", "pods", "patch") in needs
    assert ("", "secrets", "get") in needs


# ------------------------------------------------------------------ the recorded run


def operator_kubeconfig(cluster: EmulatedCluster) -> Path:
    """The cluster's kubeconfig with the operator's own token (its requests are told apart by it)."""
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"][0]["user"]["token"] = OPERATOR_TOKEN
    path = cluster.workdir / "operator-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def fleet_manifest(redis_secret: str) -> str:
    fleet = yaml.safe_load((REPO / "examples" / "emulator-fleet.yaml").read_text())
    fleet["metadata"] = {"name": FLEET, "namespace": NAMESPACE}
    fleet["spec"].update(
        replicas=1,
        autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 1},
        router={
            "replicas": 1,
            "policy": "queue_aware",
            "podTemplate": {"metadata": {"labels": {"team": "a"}}},
        },
        redis={"secretRef": {"name": redis_secret, "key": "url"}},
    )
    fleet["spec"]["engine"]["args"] = ["--time-scale", "50", "--cache-tokens", "2000"]
    return yaml.safe_dump(fleet)


def router_children(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    """The fleet's router Service, ConfigMap and Deployment as stored."""
    kinds = (("services", "", "v1"), ("configmaps", "", "v1"), ("deployments", "apps", "v1"))
    named = f"{FLEET}-router"
    return [o for k in kinds for o in cluster.api.objects(*k) if o["metadata"]["name"] == named]


def fleet_report(api: ApiServerThread) -> str:
    """The fleets as stored (finalizers, deletionTimestamp, status; annotations by name only) and
    the last writes to them with the server's answers: what a wait on the fleet that timed out shows
    (the operator's log is at INFO: a refused patch, or one never sent, leaves no line there)."""
    shown = []
    for stored in api.objects("prefixcachefleets", "prefixfleet.io", "v1alpha1"):
        meta = dict(stored["metadata"], annotations=sorted(stored["metadata"].get("annotations") or {}))
        shown.append({"metadata": meta, "status": stored.get("status")})
    server = api.server
    writes = list(server.fleet_writes) if isinstance(server, RecordingApiServer) else ["(not recorded)"]
    return f"fleets as stored: {json.dumps(shown, indent=1)}\nthe last writes to fleets:\n" + "\n".join(
        writes
    )


def live_fleet(cluster: EmulatedCluster, redis_url: str) -> None:
    """A fleet's life through kubectl, each step waited for: the operator's calls along the way."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fleet-redis"}}
    cluster.apply(json.dumps({**secret, "stringData": {"url": redis_url}}))
    cluster.apply(fleet_manifest("fleet-redis"))
    wait_for(lambda: len(router_children(cluster)) == 3, 60, what="the router Service, ConfigMap, Deployment")

    def running() -> list[dict[str, Any]]:
        return [p for p in cluster.api.objects("pods") if p.get("status", {}).get("phase") == "Running"]

    wait_for(running, 60, what="the replica pod to run")

    def label_dropped() -> bool:
        deployments = [c for c in router_children(cluster) if c["kind"] == "Deployment"]
        return all("team" not in (d["spec"]["template"]["metadata"].get("labels") or {}) for d in deployments)

    # a field dropped from the fleet: the router Deployment is patched against its last-applied record
    assert not label_dropped(), "the router Deployment never had spec.router.podTemplate's label"
    drop = '[{"op": "remove", "path": "/spec/router/podTemplate"}]'
    cluster.kubectl("patch", "pcf", FLEET, "--type=json", "-p", drop)

    wait_for(label_dropped, 60, what="the dropped pod label to leave the router Deployment")
    # the Service and ConfigMap edited by hand are repaired (patched back to the spec)
    for kind in ("service", "configmap"):
        cluster.kubectl("annotate", "--overwrite", kind, f"{FLEET}-router", f"{SPEC_HASH}=edited")

    def repaired() -> bool:
        return all(c["metadata"]["annotations"][SPEC_HASH] != "edited" for c in router_children(cluster))

    wait_for(repaired, 60, what="the operator to repair the hand-edited Service and ConfigMap")
    # a replica deleted by hand is recreated
    (pod,) = cluster.api.objects("pods")
    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "--wait=false")

    def recreated() -> bool:
        return any(p["metadata"]["uid"] != pod["metadata"]["uid"] for p in cluster.api.objects("pods"))

    wait_for(recreated, 60, what="the deleted replica to be recreated")
    # the fleet deleted: its finalizer goes once every child is removed and its timers have exited
    # (kopf checks a timer that was mid-run again every handlers.TIMER_EXIT_POLL_S)
    cluster.kubectl("delete", "pcf", FLEET, "--wait=false")
    fleets = ("prefixcachefleets", "prefixfleet.io", "v1alpha1")
    try:
        wait_for(lambda: not cluster.api.objects(*fleets), 60, what="the fleet's finalizer to be removed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet_report(cluster.api)}") from exc
    assert router_children(cluster) == []


def recording_cluster(server: RecordingApiServer, workdir: Path) -> EmulatedCluster:
    """An EmulatedCluster (no kubelet yet) served by ``server``."""
    cluster = EmulatedCluster.__new__(EmulatedCluster)
    cluster.workdir = workdir
    cluster.workdir.mkdir(parents=True)
    cluster.api = ApiServerThread(server).start()
    cluster.kubeconfig = cluster.api.write_kubeconfig(cluster.workdir / "kubeconfig")
    cluster.kubelet = None
    return cluster


@contextlib.contextmanager
def recorded_operator_run(tmp_path: Path, extra_args: list[str]) -> Iterator[set[Need]]:
    """Run the operator through a fleet's life; yields the permissions its requests needed."""
    server = RecordingApiServer()
    cluster = recording_cluster(server, tmp_path / "cluster")
    operator: OperatorProcess | None = None
    try:
        with running_redis(tmp_path) as redis_url:
            cluster.install_crd()
            cluster.start_kubelet()
            # OperatorProcess reads only .kubeconfig and .workdir of its cluster
            as_operator = SimpleNamespace(kubeconfig=operator_kubeconfig(cluster), workdir=cluster.workdir)
            operator = OperatorProcess(as_operator, "")  # type: ignore[arg-type]
            # the chart's metrics server on, on a free port (another test may hold the default 8081)
            operator.extra_args = [*extra_args, f"--metrics-port={free_port()}"]
            operator.start()
            live_fleet(cluster, redis_url)
            operator.stop()
            yield {n for request in server.operator_requests for n in needs_of_request(*request)}
    finally:
        if operator is not None:
            operator.stop()
            print("--- operator log (tail) ---\n" + operator.log_tail(60))
        cluster.close()


SCOPES = {
    # the chart's defaults: cluster-wide operator, one ClusterRole
    "cluster": ([], {}),
    # a namespaced install: `--namespace default`, a Role in it, the ClusterRole of kopf's reads
    "namespace": (
        ["--namespace", NAMESPACE],
        {"rbac": {"scope": "namespace"}, "operator": {"watchNamespaces": [NAMESPACE]}},
    ),
}


@pytest.mark.parametrize("scope", SCOPES)
def test_the_chart_grants_every_call_the_operator_makes_and_nothing_else(tmp_path: Path, scope: str) -> None:
    extra_args, values = SCOPES[scope]
    grants = granted(rendered_roles(values))
    source, _ = source_needs()
    with recorded_operator_run(tmp_path, extra_args) as recorded:
        assert {n.resource for n in recorded} >= {"prefixcachefleets", "pods", "events", "secrets"}, recorded
        # the source scan's calls happen in the fleet's namespace
        needs = recorded | {Need(g, r, v, NAMESPACE) for g, r, v in source}
        assert missing(needs, grants) == [], "API calls the chart's RBAC does not allow"
        assert unused(needs, grants) == [], "rules the chart grants that no call of the operator needs"


def test_recording_notices_a_call_the_chart_does_not_allow() -> None:
    """The check is not vacuous: the chart's own grants minus one needed rule is reported."""
    grants = granted(rendered_roles({}))
    scale = Need("prefixfleet.io", "prefixcachefleets/scale", "patch", NAMESPACE)
    assert missing({scale}, grants) == []
    without = {g for g in grants if g.resource != "prefixcachefleets/scale"}
    assert missing({scale}, without) == [str(scale)]


def test_a_fleet_wait_that_times_out_shows_the_fleet_and_the_answers_to_its_writes(tmp_path: Path) -> None:
    """What live_fleet adds to its timeout: the finalizers, deletionTimestamp and status as stored,
    and the last writes to the fleet with the server's answers (a refusal with its message)."""
    cluster = recording_cluster(RecordingApiServer(), tmp_path / "cluster")
    try:
        cluster.install_crd()
        fleet = yaml.safe_load(fleet_manifest("fleet-redis"))
        fleet["metadata"]["finalizers"] = ["prefixfleet.io/cleanup"]
        cluster.apply(json.dumps(fleet))
        cluster.kubectl("delete", "pcf", FLEET, "--wait=false")
        refused = cluster.kubectl(
            "patch", "pcf", FLEET, "--type=merge", "-p", '{"spec":{"replicas":-1}}', check=False
        )
        assert refused.returncode != 0
        report = fleet_report(cluster.api)
    finally:
        cluster.close()
    assert '"prefixfleet.io/cleanup"' in report and '"deletionTimestamp"' in report
    assert f"DELETE /apis/prefixfleet.io/v1alpha1/namespaces/{NAMESPACE}/prefixcachefleets/{FLEET}" in report
    (answer,) = [line for line in report.splitlines() if line.startswith("PATCH ")]
    assert '"replicas": -1' in answer and "-> 422: " in answer and "spec.replicas" in answer
