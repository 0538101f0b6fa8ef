"""An emulated Kubernetes API server for tests: kmock's ``KubernetesEmulator`` with fidelity fixes.

kmock 0.8 serves discovery and keeps objects in memory, but real clients (kopf 1.45, the
``kubernetes`` client, kubectl 1.37) trip over twelve gaps (see /work/shared/TESTING.md). This
subclass keeps kmock's HTTP server, error rendering and discovery (with the core ``groupVersion``
fixed) and serves every resource path itself, with the semantics the clients rely on:

1. ``resourceVersion`` (one cluster-wide counter), ``uid``, ``creationTimestamp``, ``generation``
   on create; the version bumps on every effective change (a no-op patch changes nothing);
2. ``metadata.namespace`` from the URL;  3. ``/api/v1/namespaces[/NAME]`` parsed correctly;
4. the ``default`` Namespace exists;  5. ``201 Created`` on create;  6. ``generateName``;
7. ``kind``/``apiVersion`` on lists;  8. core discovery says ``groupVersion: v1``, subresources carry
   no short names;  9. watch streams are ``application/json`` lines;  10. ``sendInitialEvents`` ends
   with the ``k8s.io/initial-events-end`` BOOKMARK, ``fieldSelector``/``labelSelector`` are honoured
   (lists, watches, collection deletes), ``resourceVersion`` resumes from a bounded history
   (410 Gone when too old), ``timeoutSeconds`` ends a watch;  11. ``/scale`` speaks
   ``autoscaling/v1`` Scale (GET, PATCH, PUT) mapped through the resource's replica paths;
12. PUT replaces (with optimistic concurrency on ``resourceVersion``).

Also: merge-, JSON- (with ``test``, failing with 422 as kopf expects) and strategic-merge patches;
``status`` subresource semantics (the main endpoint ignores status, ``/status`` only takes status);
finalizers and ``deletionTimestamp``; a CustomResourceDefinition created through the API registers
its resource (so ``kubectl apply -f crds/...`` works) and its ``additionalPrinterColumns`` drive the
server-side Table that ``kubectl get`` asks for. Custom resources of a CRD created through the
API are defaulted and validated with its schema and CEL rules (``operator/crd_admission.py``), so an
invalid fleet is refused with 422 naming the field; their ``status`` (on ``/status`` and main
writes) is pruned of fields its structural schema does not declare, defaulted and validated the
same way (``validate_custom_status``). There is still no scheduler, no controllers and
no garbage collection: deleting an owner leaves its dependents (an operator must clean up).

It runs in its own thread and event loop (:class:`ApiServerThread`), listening on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import json
import re
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml

JSON = dict[str, Any]

# How many change events are kept for watches resuming from a resourceVersion.
HISTORY_LIMIT = 20_000


@dataclass(frozen=True)
class ScalePaths:
    """Where a resource keeps what its ``/scale`` subresource shows (dotted paths)."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = ".status.selector"


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    scale: ScalePaths | None = None
    printer_columns: tuple[JSON, ...] = ()
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)

    @property
    def singular(self) -> str:
        return self.kind.lower()


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=frozenset({"status"}),
    ),
    ResourceType("", "v1", "events", "Event", short_names=("ev",)),
    ResourceType(
        "", "v1", "pods", "Pod", short_names=("po",), subresources=frozenset({"status"}), categories=("all",)
    ),
    ResourceType(
        "",
        "v1",
        "services",
        "Service",
        short_names=("svc",),
        subresources=frozenset({"status"}),
        categories=("all",),
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        short_names=("deploy",),
        subresources=frozenset({"status", "scale"}),
        categories=("all",),
        scale=ScalePaths(".spec.replicas", ".status.replicas", None),
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        subresources=frozenset({"status"}),
    ),
)


class ApiError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> JSON:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _not_found(rt: ResourceType, name: str) -> ApiError:
    what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiError(404, "NotFound", f'{what} "{name}" not found', {"name": name, "kind": rt.plural})


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------
# Pure helpers: paths, selectors, patches, tables.


@dataclass(frozen=True)
class ResourcePath:
    group: str
    version: str
    namespace: str | None
    plural: str
    name: str | None
    subresource: str | None


def parse_resource_path(path: str) -> ResourcePath | None:
    """Parse ``/api/v1/...`` or ``/apis/G/V/...`` into its parts; None for discovery paths."""
    parts = [p for p in path.strip("/").split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    # /namespaces/NS/PLURAL/... is namespaced; /namespaces and /namespaces/NAME[/status] are the
    # Namespace objects themselves (kmock's parser answered 500 for the former).
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) >= 2 else None
    subresource = "/".join(rest[2:]) or None
    return ResourcePath(group, version, namespace, plural, name, subresource)


def get_path(obj: Any, dotted: str) -> Any:
    """Value at a dotted path like ``.spec.replicas`` (None when absent)."""
    cur = obj
    for part in [p for p in dotted.split(".") if p]:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def set_path(obj: JSON, dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    cur = obj
    for part in parts[:-1]:
        cur = cur.setdefault(part, {})
    cur[parts[-1]] = value


def _split_selector(text: str) -> list[str]:
    terms, depth, buf = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(buf.strip())
            buf = ""
        else:
            buf += ch
    if buf.strip():
        terms.append(buf.strip())
    return terms


def label_selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Equality-, set- and existence-based label selectors, as in ``-l``."""
    if not selector:
        return True
    for term in _split_selector(selector):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in" and labels.get(key) not in values:
                return False
            if op == "notin" and labels.get(key) in values:
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_selector_matches(selector: str | None, obj: JSON) -> bool:
    """``metadata.name=x,status.phase!=Failed`` style field selectors."""
    if not selector:
        return True
    for term in _split_selector(selector):
        negate = "!=" in term
        key, value = (s.strip() for s in re.split(r"!=|==|=", term, maxsplit=1))
        actual = get_path(obj, key)
        actual_text = "" if actual is None else str(actual)
        if (actual_text == value) == negate:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """An approximation of strategic merge patch: lists of named objects merge by ``name``.

    Directives (``$setElementOrder/...``, ``$retainKeys``, ...) are dropped; ``$patch: delete``
    on a named list item removes it. Enough for kubectl apply/patch of the built-in kinds we use.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value)
        elif (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) and "name" in v for v in value)
            and isinstance(result.get(key), list)
        ):
            merged = {item.get("name"): item for item in copy.deepcopy(result[key]) if isinstance(item, dict)}
            order = list(merged)
            for item in value:
                name = item["name"]
                if item.get("$patch") == "delete":
                    merged.pop(name, None)
                    continue
                merged[name] = strategic_merge_patch(merged.get(name), item)
                if name not in order:
                    order.append(name)
            result[key] = [merged[n] for n in order if n in merged]
        else:
            result[key] = copy.deepcopy(value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json_patch(target: JSON, ops: list[JSON]) -> JSON:
    """RFC 6902 JSON patch (add/remove/replace/test/move/copy); a failed ``test`` raises 422."""
    doc = copy.deepcopy(target)

    def walk(parts: list[str]) -> tuple[Any, str]:
        cur: Any = doc
        for part in parts[:-1]:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        return cur, parts[-1]

    def get(parts: list[str]) -> Any:
        cur: Any = doc
        for part in parts:
            cur = cur[int(part)] if isinstance(cur, list) else cur[part]
        return cur

    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        try:
            if kind == "test":
                if get(parts) != op.get("value"):
                    raise ApiError(
                        422, "Invalid", f"the server rejected our request: test failed at {op['path']}"
                    )
                continue
            if kind in ("move", "copy"):
                value = copy.deepcopy(get(_pointer(op["from"])))
                if kind == "move":
                    parent, last = walk(_pointer(op["from"]))
                    del parent[int(last) if isinstance(parent, list) else last]
                kind, op = "add", {"value": value}
            parent, last = walk(parts)
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
                else:
                    parent[last] = copy.deepcopy(op["value"])
            elif kind == "replace":
                if isinstance(parent, list):
                    parent[int(last)] = copy.deepcopy(op["value"])
                else:
                    if last not in parent:
                        raise KeyError(last)
                    parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON patch op {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(
                422, "Invalid", f"JSON patch {kind} at {op.get('path')!r} failed: {exc!r}"
            ) from exc
    return doc


def _json_path_value(obj: JSON, path: str) -> Any:
    """The subset of JSONPath that printer columns use: ``.a.b``, ``[0]``, ``[?(@.k=="v")]``."""
    cur: Any = obj
    for token in re.findall(r"\[\?\(@\.[^)]*\)\]|\[\d+\]|\.[^.\[]+", path.strip().strip("{}")):
        if cur is None:
            return None
        if token.startswith("[?"):
            m = re.match(r'\[\?\(@\.([\w.]+)\s*==\s*["\']?([^"\')]*)["\']?\)\]', token)
            if not m or not isinstance(cur, list):
                return None
            cur = next((x for x in cur if str(get_path(x, m.group(1))) == m.group(2)), None)
        elif token.startswith("["):
            idx = int(token[1:-1])
            cur = cur[idx] if isinstance(cur, list) and len(cur) > idx else None
        else:
            cur = cur.get(token[1:]) if isinstance(cur, dict) else None
    return cur


def human_age(timestamp: str | None, now: datetime.datetime | None = None) -> str:
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int(((now or datetime.datetime.now(tz=datetime.UTC)) - then).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def table_for(rt: ResourceType, objs: list[JSON], resource_version: str) -> JSON:
    """The ``meta.k8s.io/v1`` Table kubectl asks for when printing (printer columns of CRDs)."""
    columns: list[JSON] = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": 0,
            "description": "Name of the object",
        }
    ]
    specs = list(rt.printer_columns) or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    ]
    for spec in specs:
        columns.append(
            {
                "name": spec["name"],
                "type": "string" if spec.get("type") == "date" else spec.get("type", "string"),
                "format": spec.get("format", ""),
                "priority": spec.get("priority", 0),
                "description": spec.get("description", ""),
            }
        )
    rows = []
    for obj in objs:
        cells: list[Any] = [obj["metadata"]["name"]]
        for spec in specs:
            value = _json_path_value(obj, spec.get("jsonPath", ""))
            cells.append(human_age(value) if spec.get("type") == "date" else value)
        rows.append(
            {
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": copy.deepcopy(obj["metadata"]),
                },
            }
        )
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }


def resource_type_from_crd(crd: JSON) -> list[ResourceType]:
    """The served resource types a CustomResourceDefinition declares."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    result = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        sub = version.get("subresources") or {}
        scale = None
        if "scale" in sub:
            s = sub["scale"]
            scale = ScalePaths(
                s.get("specReplicasPath", ".spec.replicas"),
                s.get("statusReplicasPath", ".status.replicas"),
                s.get("labelSelectorPath"),
            )
        result.append(
            ResourceType(
                group=spec.get("group", ""),
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames", [])),
                subresources=frozenset(k for k in sub if k in ("status", "scale")),
                scale=scale,
                printer_columns=tuple(version.get("additionalPrinterColumns", [])),
                categories=tuple(names.get("categories", [])),
            )
        )
    return result


def prune_unknown(schema: JSON, value: Any) -> Any:
    """A copy of ``value`` without the fields a structural schema does not declare (API-server
    pruning): a node with ``x-kubernetes-preserve-unknown-fields`` keeps its undeclared fields, but
    its declared ones are pruned by their own schemas."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        kept = {}
        for name, item in value.items():
            if name in props:
                kept[name] = prune_unknown(props[name], item)
            elif isinstance(extra, dict):
                kept[name] = prune_unknown(extra, item)
            elif schema.get("x-kubernetes-preserve-unknown-fields") or extra is True:
                kept[name] = copy.deepcopy(item)
        return kept
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune_unknown(schema["items"], item) for item in value]
    return copy.deepcopy(value)


def list_map_errors(schema: JSON, value: Any, path: str = "") -> list[str]:
    """Duplicate keys in ``x-kubernetes-list-type: map`` lists, which JSON Schema cannot express."""
    found: list[str] = []
    if isinstance(value, dict):
        for name, item in value.items():
            sub = (schema.get("properties") or {}).get(name)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            if sub is not None:
                found += list_map_errors(sub, item, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen: set[str] = set()
        for i, item in enumerate(value):
            if schema.get("x-kubernetes-list-type") == "map" and isinstance(item, dict):
                key = json.dumps({k: item.get(k) for k in keys}, separators=(",", ":"))
                if key in seen:
                    found.append(f"{path}[{i}]: Duplicate value: {key}")
                seen.add(key)
            found += list_map_errors(schema["items"], item, f"{path}[{i}]")
    return found


def _cause_of(problem: str) -> JSON:
    """A StatusCause as kube-apiserver writes it: the field, and a reason by the kind of problem."""
    field_name, _, said = problem.partition(": ")
    reason = "FieldValueDuplicate" if said.startswith("Duplicate value") else "FieldValueInvalid"
    # kubectl prints "field: message", so the message does not repeat the field.
    return {"reason": reason, "message": said or problem, "field": field_name}


# ---------------------------------------------------------------------------------------------
# The server.


@dataclass(eq=False)  # identity-hashed: kept in a set
class _Watcher:
    key: tuple[str, str, str]
    queue: asyncio.Queue[JSON | None] = field(default_factory=asyncio.Queue)


class EmulatedApiServer(kmock.KubernetesEmulator):
    """kmock's emulator with the fidelity fixes; serves every declared resource itself."""

    def __init__(self, types: Iterable[ResourceType] = BUILTIN_TYPES) -> None:
        super().__init__()
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.store: dict[tuple[tuple[str, str, str], str, str], JSON] = {}
        self.revision = 0
        self.history: deque[tuple[int, tuple[str, str, str], JSON]] = deque(maxlen=HISTORY_LIMIT)
        self.watchers: set[_Watcher] = set()
        # Callbacks run (on the server loop) after every change: kind of event, type, object.
        self.listeners: list[Callable[[str, ResourceType, JSON], None]] = []
        self.closing = False
        # Custom resources are defaulted and validated against their CRD's schema and CEL rules
        # (operator/crd_admission.py), as kube-apiserver does; tests may switch it off to reach
        # the operator's own validation.
        self.validate_custom_resources = True
        # ... and so is their ``status`` (pruned, defaulted, validated), on ``/status`` and main writes.
        self.validate_custom_status = True
        self.crds: dict[tuple[str, str], JSON] = {}  # (group, plural) -> CRD object
        for rt in types:
            self.declare(rt)
        self._put(self.types[("", "v1", "namespaces")], {"metadata": {"name": "default"}})

    # -- declaration / discovery ---------------------------------------------------------------

    def declare(self, rt: ResourceType) -> None:
        self.types[rt.key] = rt
        key = f"{rt.group}/{rt.version}/{rt.plural}" if rt.group else f"{rt.version}/{rt.plural}"
        self.resources[key] = kmock.ResourceInfo(
            namespaced=rt.namespaced,
            kind=rt.kind,
            singular=rt.singular,
            verbs={"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"},
            shortnames=set(rt.short_names),
            categories=set(rt.categories),
            subresources=set(rt.subresources),
        )

    async def _serve_version(self, request: kmock.Request) -> Any:
        # kmock says "/v1" for the core group and copies short names onto subresources.
        assert request.resource is not None
        group, version = request.resource.group, request.resource.version
        entries = []
        for rt in self.types.values():
            if rt.group != group or rt.version != version:
                continue
            entries.append(
                {
                    "name": rt.plural,
                    "singularName": rt.singular,
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "shortNames": list(rt.short_names),
                    "categories": list(rt.categories),
                    "verbs": [
                        "create",
                        "delete",
                        "deletecollection",
                        "get",
                        "list",
                        "patch",
                        "update",
                        "watch",
                    ],
                }
            )
            for sub in sorted(rt.subresources):
                kind = "Scale" if sub == "scale" else rt.kind
                entries.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": kind,
                        "verbs": ["get", "patch", "update"],
                        **({"group": "autoscaling", "version": "v1"} if sub == "scale" else {}),
                    }
                )
        if not entries:
            raise kmock.KubernetesResourceNotFoundError()
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": entries,
        }

    # -- change bookkeeping ----------------------------------------------------------------------

    def _bump(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _emit(self, event_type: str, rt: ResourceType, obj: JSON) -> None:
        event = {"type": event_type, "object": copy.deepcopy(obj)}
        self.history.append((self.revision, rt.key, event))
        for watcher in list(self.watchers):
            if watcher.key == rt.key:
                watcher.queue.put_nowait(event)
        for listener in list(self.listeners):
            listener(event_type, rt, obj)
        if rt.plural == "customresourcedefinitions" and event_type in ("ADDED", "MODIFIED"):
            for crd_type in resource_type_from_crd(obj):
                self.declare(crd_type)
                self.crds[(crd_type.group, crd_type.plural)] = copy.deepcopy(obj)

    def _put(self, rt: ResourceType, body: JSON, namespace: str | None = None) -> JSON:
        """Create an object (the body is already validated); returns the stored copy."""
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if not meta.get("name"):
            raise ApiError(
                422, "Invalid", f"{rt.kind}: metadata.name: Required value: name or generateName is required"
            )
        key = (rt.key, meta.get("namespace", ""), meta["name"])
        if key in self.store:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{rt.plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "kind": rt.plural},
            )
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta.pop("deletionTimestamp", None)
        meta["resourceVersion"] = self._bump()
        if rt.plural == "namespaces":
            obj["status"] = {"phase": "Active"}
        self.store[key] = obj
        self._emit("ADDED", rt, obj)
        return obj

    def _replace(self, rt: ResourceType, key: tuple, old: JSON, new: JSON) -> JSON:
        """Store a changed object: bump versions, emit, finish deletion when finalizers are gone."""
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        for immutable in ("uid", "creationTimestamp", "name", "namespace", "deletionTimestamp"):
            if immutable in old["metadata"]:
                meta[immutable] = old["metadata"][immutable]
            else:
                meta.pop(immutable, None) if immutable == "deletionTimestamp" else None
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        meta["generation"] = old["metadata"].get("generation", 1)

        def body_of(o: JSON) -> JSON:
            return {k: v for k, v in o.items() if k not in ("metadata", "status", "apiVersion", "kind")}

        if new == old:
            return old  # a no-op write changes nothing, as in a real API server
        if body_of(new) != body_of(old):
            meta["generation"] = meta["generation"] + 1
        meta["resourceVersion"] = self._bump()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            del self.store[key]
            self._emit("DELETED", rt, new)
        else:
            self.store[key] = new
            self._emit("MODIFIED", rt, new)
        return new

    def _delete(self, rt: ResourceType, key: tuple) -> JSON:
        obj = self.store[key]
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                new = copy.deepcopy(obj)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["resourceVersion"] = self._bump()
                self.store[key] = new
                self._emit("MODIFIED", rt, new)
                return new
            return obj
        del self.store[key]
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self._bump()
        self._emit("DELETED", rt, obj)
        return obj

    def _matching(self, rt: ResourceType, namespace: str | None, params: dict[str, str]) -> list[JSON]:
        result = []
        for (key, ns, _), obj in sorted(self.store.items(), key=lambda kv: kv[0]):
            if key != rt.key or (namespace is not None and ns != namespace):
                continue
            if self._selected(obj, params):
                result.append(obj)
        return result

    @staticmethod
    def _selected(obj: JSON, params: dict[str, str]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return label_selector_matches(params.get("labelSelector"), labels) and field_selector_matches(
            params.get("fieldSelector"), obj
        )

    # -- HTTP ------------------------------------------------------------------------------------

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        parsed = parse_resource_path(raw.path)
        if parsed is None or (parsed.group, parsed.version, parsed.plural) not in self.types:
            return await super().__call__(raw)  # discovery, /version, unknown paths (404)
        rt = self.types[(parsed.group, parsed.version, parsed.plural)]
        try:
            return await self._serve(raw, rt, parsed)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)

    async def _serve(
        self, raw: aiohttp.web.BaseRequest, rt: ResourceType, p: ResourcePath
    ) -> aiohttp.web.StreamResponse:
        params = dict(raw.query)
        namespace = p.namespace if rt.namespaced else None
        if rt.namespaced and p.namespace is None and raw.method not in ("GET",):
            raise ApiError(
                405, "MethodNotAllowed", f"{rt.plural} is namespaced: use /namespaces/NS/{rt.plural}"
            )
        if p.name is not None and rt.namespaced and namespace is None:
            raise ApiError(404, "NotFound", "namespaced object requested without a namespace")
        wants_table = "as=Table" in raw.headers.get("Accept", "")
        if raw.method == "GET" and params.get("watch") in ("true", "1"):
            if p.name is not None:
                params["fieldSelector"] = ",".join(
                    filter(None, [params.get("fieldSelector"), f"metadata.name={p.name}"])
                )
            return await self._watch(raw, rt, namespace, params)
        if p.subresource not in (None, "status", "scale") or (
            p.subresource and p.subresource not in rt.subresources
        ):
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({p.subresource})"
            )
        key = (rt.key, namespace or "", p.name or "")
        if raw.method == "GET" and p.name is None:
            items = [copy.deepcopy(o) for o in self._matching(rt, namespace, params)]
            if wants_table:
                return aiohttp.web.json_response(table_for(rt, items, str(self.revision)))
            return aiohttp.web.json_response(
                {
                    "kind": f"{rt.kind}List",
                    "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": items,
                }
            )
        if raw.method == "POST" and p.name is None:
            body = await self._body(raw)
            if params.get("dryRun"):
                return aiohttp.web.json_response(body, status=201)
            obj = self._put(rt, self._admit(rt, body), namespace)
            return aiohttp.web.json_response(obj, status=201)
        if raw.method == "DELETE" and p.name is None:  # deletecollection
            deleted = [
                self._delete(rt, (rt.key, o["metadata"].get("namespace", ""), o["metadata"]["name"]))
                for o in list(self._matching(rt, namespace, params))
            ]
            return aiohttp.web.json_response(
                {
                    "kind": f"{rt.kind}List",
                    "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(self.revision)},
                    "items": deleted,
                }
            )
        if p.name is None:
            raise ApiError(405, "MethodNotAllowed", f"{raw.method} is not allowed on a collection")
        if key not in self.store:
            raise _not_found(rt, p.name)
        obj = self.store[key]
        if raw.method == "GET":
            if p.subresource == "scale":
                return aiohttp.web.json_response(self._scale_of(rt, obj))
            if wants_table:
                return aiohttp.web.json_response(table_for(rt, [obj], str(self.revision)))
            return aiohttp.web.json_response(obj)
        if raw.method == "DELETE":
            return aiohttp.web.json_response(self._delete(rt, key))
        if raw.method in ("PATCH", "PUT"):
            body = await self._body(raw)
            if p.subresource == "scale":
                return aiohttp.web.json_response(self._write_scale(rt, key, obj, raw, body))
            if raw.method == "PUT":
                wanted_rv = (body.get("metadata") or {}).get("resourceVersion")
                if wanted_rv and wanted_rv != obj["metadata"]["resourceVersion"]:
                    raise ApiError(
                        409,
                        "Conflict",
                        f'Operation cannot be fulfilled on {rt.plural} "{p.name}": '
                        "the object has been modified; please apply your changes to the latest version",
                    )
                new = copy.deepcopy(body)
            else:
                new = self._apply_patch(obj, raw.content_type, body)
            new = self._admit(rt, self._restrict_to_subresource(rt, p.subresource, obj, new))
            if params.get("dryRun"):
                return aiohttp.web.json_response(new)
            return aiohttp.web.json_response(self._replace(rt, key, obj, new))
        raise ApiError(405, "MethodNotAllowed", f"{raw.method} is not supported")

    def _admit(self, rt: ResourceType, obj: Any) -> Any:
        """Default and validate a custom resource like the API server (422 naming the fields).

        ``status`` goes through the same schema and CEL checks when ``validate_custom_status`` is
        on, after being pruned of fields its structural schema does not declare (as kube-apiserver
        prunes them); off, it is stored as written."""
        crd = self.crds.get((rt.group, rt.plural))
        if crd is None or not self.validate_custom_resources or not isinstance(obj, dict):
            return obj
        from prefixfleet.operator.crd_admission import apply_defaults, cel_errors, crd_schema, schema_errors

        schema = crd_schema(crd)
        checks_status = self.validate_custom_status and "status" in obj
        body = {k: v for k, v in obj.items() if k != "status"}
        if checks_status:
            body["status"] = prune_unknown((schema.get("properties") or {}).get("status", {}), obj["status"])
        defaulted = apply_defaults(schema, body)
        problems = schema_errors(schema, defaulted) or (
            list_map_errors(schema, defaulted) + cel_errors(schema, defaulted)
        )
        if problems:
            name = (obj.get("metadata") or {}).get("name", "")
            raise ApiError(
                422,
                "Invalid",
                f'{rt.kind}.{rt.group} "{name}" is invalid: ' + "; ".join(problems),
                {
                    "name": name,
                    "group": rt.group,
                    "kind": rt.kind,
                    "causes": [_cause_of(m) for m in problems],
                },
            )
        if "status" in obj and not checks_status:
            defaulted["status"] = obj["status"]
        return defaulted

    @staticmethod
    async def _body(raw: aiohttp.web.BaseRequest) -> Any:
        text = await raw.text()
        try:
            return json.loads(text) if text else {}
        except json.JSONDecodeError:
            try:
                return yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                raise ApiError(
                    400, "BadRequest", f"the request body is neither JSON nor YAML: {exc}"
                ) from exc

    @staticmethod
    def _apply_patch(obj: JSON, content_type: str, body: Any) -> JSON:
        if content_type == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            return json_patch(obj, body)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be an object")
        if content_type == "application/merge-patch+json":
            return merge_patch(obj, body)
        if content_type == "application/strategic-merge-patch+json":
            return strategic_merge_patch(obj, body)
        raise ApiError(415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported")

    @staticmethod
    def _restrict_to_subresource(rt: ResourceType, subresource: str | None, old: JSON, new: JSON) -> JSON:
        if subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            return result
        if "status" in rt.subresources:  # the main endpoint ignores status changes
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        return new

    @staticmethod
    def _scale_of(rt: ResourceType, obj: JSON) -> JSON:
        paths = rt.scale or ScalePaths()
        status: JSON = {"replicas": get_path(obj, paths.status_replicas) or 0}
        if paths.label_selector and get_path(obj, paths.label_selector) is not None:
            status["selector"] = get_path(obj, paths.label_selector)
        meta = obj["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k]
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in meta
            },
            "spec": {"replicas": get_path(obj, paths.spec_replicas) or 0},
            "status": status,
        }

    def _write_scale(
        self, rt: ResourceType, key: tuple, obj: JSON, raw: aiohttp.web.BaseRequest, body: Any
    ) -> JSON:
        scale = self._scale_of(rt, obj)
        new_scale = (
            copy.deepcopy(body) if raw.method == "PUT" else self._apply_patch(scale, raw.content_type, body)
        )
        replicas = get_path(new_scale, ".spec.replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(
                422, "Invalid", f"Scale.spec.replicas: Invalid value: {replicas!r}: must be an integer >= 0"
            )
        new = copy.deepcopy(obj)
        set_path(new, (rt.scale or ScalePaths()).spec_replicas, replicas)
        stored = self._replace(rt, key, obj, new)
        return self._scale_of(rt, stored)

    async def _watch(
        self, raw: aiohttp.web.BaseRequest, rt: ResourceType, namespace: str | None, params: dict[str, str]
    ) -> aiohttp.web.StreamResponse:
        watcher = _Watcher(rt.key)
        since = params.get("resourceVersion")
        initial: list[JSON] = []
        # Snapshot and subscription happen with no await in between: nothing can slip through.
        if params.get("sendInitialEvents") == "true" or since in (None, "", "0"):
            initial = [
                {"type": "ADDED", "object": copy.deepcopy(o)} for o in self._matching(rt, namespace, params)
            ]
            if params.get("sendInitialEvents") == "true":
                initial.append(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": rt.kind,
                            "apiVersion": rt.api_version,
                            "metadata": {
                                "resourceVersion": str(self.revision),
                                "annotations": {"k8s.io/initial-events-end": "true"},
                            },
                        },
                    }
                )
        else:
            try:
                since_rv = int(since)
            except ValueError as exc:
                raise ApiError(400, "BadRequest", f"invalid resourceVersion {since!r}") from exc
            oldest = self.history[0][0] if self.history else self.revision + 1
            if since_rv < oldest - 1 and since_rv < self.revision:
                initial = [
                    {
                        "type": "ERROR",
                        "object": ApiError(410, "Expired", f"too old resource version: {since_rv}").status(),
                    }
                ]
            else:
                initial = [copy.deepcopy(ev) for rv, k, ev in self.history if rv > since_rv and k == rt.key]
        self.watchers.add(watcher)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        timeout = float(params.get("timeoutSeconds") or 1800)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            await response.prepare(raw)

            def wanted(event: JSON) -> bool:
                if event["type"] in ("BOOKMARK", "ERROR"):
                    return True
                o = event["object"]
                if namespace is not None and o.get("metadata", {}).get("namespace") != namespace:
                    return False
                return self._selected(o, params)

            for event in initial:
                if wanted(event):
                    await response.write(json.dumps(event).encode() + b"\n")
            if initial and initial[0]["type"] == "ERROR":
                return response
            while not self.closing:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except TimeoutError:
                    break
                if event is None:
                    break
                if wanted(event):
                    await response.write(json.dumps(event).encode() + b"\n")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.watchers.discard(watcher)
        return response

    def close_watches(self) -> None:
        self.closing = True
        for watcher in list(self.watchers):
            watcher.queue.put_nowait(None)


class ApiServerThread:
    """Runs an :class:`EmulatedApiServer` on 127.0.0.1 in its own thread and event loop."""

    def __init__(self, server: EmulatedApiServer | None = None) -> None:
        self.server = server if server is not None else EmulatedApiServer()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="emulated-apiserver", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServerThread:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the emulated API server did not start within 15 s")
        if self._error is not None:
            raise RuntimeError("the emulated API server failed to start") from self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); the thread must not die silently
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.server, kmock.Server(self.server, host="127.0.0.1") as http:
            self.port = http.port
            self._ready.set()
            await self._stop.wait()
            self.server.close_watches()
            await asyncio.sleep(0.05)

    def call(self, fn: Callable[[], Any], timeout: float = 10) -> Any:
        """Run ``fn`` on the server's loop (the store is only touched from there)."""
        assert self.loop is not None

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def objects(
        self, plural: str, group: str = "", version: str = "v1", namespace: str | None = None
    ) -> list[JSON]:
        """A snapshot of the stored objects of one resource (for assertions)."""

        def snapshot() -> list[JSON]:
            return [
                copy.deepcopy(o)
                for (key, ns, _), o in self.server.store.items()
                if key == (group, version, plural) and (namespace is None or ns == namespace)
            ]

        return self.call(snapshot)

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "emulated",
            "clusters": [{"name": "emulated", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulated"}}],
            "contexts": [
                {
                    "name": "emulated",
                    "context": {"cluster": "emulated", "user": "tester", "namespace": namespace},
                }
            ],
        }
        path.write_text(yaml.safe_dump(config))
        return path
