"""Thin Kubernetes API calls for the operator: raw JSON over the `kubernetes` client's transport.

The operator thinks in plain dicts (the planner's manifests, the API's bodies), so instead of the
typed models this uses the client's authenticated transport (kubeconfig or in-cluster service
account) for a handful of REST calls. The calls are synchronous; handlers run them in a thread
(``asyncio.to_thread``) so the kopf event loop never blocks on the network.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes
import yaml
from kubernetes.client.rest import ApiException

from .last_applied import child_patch
from .models import GROUP, PLURAL, VERSION

JSON = dict[str, Any]
REQUEST_TIMEOUT_S = 15.0

# Where each kind the operator manages lives in the API.
KIND_PATHS: dict[str, tuple[str, str]] = {
    "Pod": ("/api/v1", "pods"),
    "Service": ("/api/v1", "services"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "PrefixCacheFleet": (f"/apis/{GROUP}/{VERSION}", PLURAL),
}


# Answers that say "this object, as written, will never be accepted" (malformed, invalid, or refused
# by an admission policy or quota): retrying the same manifest at once cannot help.
REFUSAL_STATUSES = frozenset({400, 403, 422})
REFUSAL_RETRY_S = 10.0  # as often as the reconcile timer: a fixed spec shows soon


class ChildRefused(ApiException, kopf.TemporaryError):
    """The API server refused a child the operator wrote (400, 403, 422), e.g. a replica pod whose
    spec.engine.podTemplate the API server finds invalid.

    Still an ``ApiException`` (``status``, ``reason``, ``body`` as the client sets them), and a
    ``kopf.TemporaryError``: a handler it escapes logs one line naming the child and the API
    server's own reason (kopf posts it as an Event on the fleet) and retries after
    ``REFUSAL_RETRY_S``, instead of a traceback. ``str()`` is that one line."""

    def __init__(self, kind: str, namespace: str, name: str, refusal: ApiException) -> None:
        ApiException.__init__(self, status=refusal.status, reason=refusal.reason, body=refusal.body)
        self.headers = refusal.headers
        self.kind, self.namespace, self.name = kind, namespace, name
        status = _status_body(refusal.body)
        self.api_reason: str = str(status.get("reason") or refusal.reason or "")
        self.api_message: str = str(status.get("message") or refusal.body or "").strip()
        self.delay = REFUSAL_RETRY_S

    def __str__(self) -> str:
        return (
            f"the API server refused {self.kind} {self.namespace}/{self.name}"
            f" ({self.status} {self.api_reason}): {self.api_message}"
        )


def _status_body(body: Any) -> JSON:
    """The Kubernetes ``Status`` object of an error answer (empty when it is not one)."""
    try:
        parsed = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def load_api_client() -> kubernetes.client.ApiClient:
    """In-cluster service account when running in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    return kubernetes.client.ApiClient()


def kube_config_problem() -> str | None:
    """Why no API client can be built here, as one line (None when one can).

    ``operator run`` asks before starting kopf: kopf's start-up would otherwise log the loader's
    traceback and retry every 60 s for ever, on a laptop without a cluster or with a broken
    kubeconfig. Only the configuration is read; whether the API server answers is kopf's business."""
    try:
        load_api_client()
    except (kubernetes.config.ConfigException, OSError, yaml.YAMLError) as exc:
        why = " ".join(str(exc).split())
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        # The kubernetes loader reads a kubeconfig's YAML without checking its shape: a file that is
        # a list or a string, or whose contexts, clusters or users are not mappings, raises these
        # from inside it (a traceback and exit 1 otherwise).
        detail = " ".join(str(exc).split())
        why = f"not a kubeconfig (its contexts, clusters and users cannot be read): {detail}"
    else:
        return None
    where = os.environ.get("KUBECONFIG") or "~/.kube/config"
    return (
        "no Kubernetes API to talk to: not in a pod with a service account, and the kubeconfig"
        f" ({where}) gives none: {why}"
    )


class Kube:
    """The few REST calls the reconcile loop needs; 404 on reads is None, 409 on create is success."""

    def __init__(self, api: kubernetes.client.ApiClient) -> None:
        self.api = api

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        serialized = self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api.call_api(*serialized, _request_timeout=REQUEST_TIMEOUT_S)
        response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response.response)
        return json.loads(response.data or b"{}")

    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        prefix, plural = KIND_PATHS[kind]
        out = f"{prefix}/namespaces/{namespace}/{plural}"
        if name:
            out += f"/{name}"
        if subresource:
            out += f"/{subresource}"
        return out

    def get(self, kind: str, namespace: str, name: str) -> JSON | None:
        try:
            return self.request("GET", self.path(kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str, label_selector: str) -> list[JSON]:
        body = self.request("GET", self.path(kind, namespace), query={"labelSelector": label_selector})
        return list(body.get("items") or [])

    def create(self, manifest: JSON) -> bool:
        """Create; False when it already exists (a retry after a crash, or a concurrent reconcile)."""
        meta = manifest["metadata"]
        try:
            self.request("POST", self.path(manifest["kind"], meta["namespace"]), body=manifest)
        except ApiException as exc:
            if exc.status == 409:
                return False
            if exc.status in REFUSAL_STATUSES:
                raise ChildRefused(manifest["kind"], meta["namespace"], meta["name"], exc) from None
            raise
        return True

    def replace_spec(self, manifest: JSON, live: JSON | None = None) -> None:
        """Overwrite what the operator owns (labels, annotations, owner refs, spec/data) with a merge
        patch; server-set fields (a Service's clusterIP, status) are left alone. Keys the live
        object's last-applied record has and ``manifest`` lacks are removed, and ``manifest`` becomes
        the record (three-way merge, operator/last_applied.py); without a record (or ``live``)
        nothing is removed."""
        meta = manifest["metadata"]
        patch = child_patch(manifest, live)
        try:
            self.request(
                "PATCH",
                self.path(manifest["kind"], meta["namespace"], meta["name"]),
                body=patch,
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status in REFUSAL_STATUSES:
                raise ChildRefused(manifest["kind"], meta["namespace"], meta["name"], exc) from None
            raise

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        try:
            self.request("DELETE", self.path(kind, namespace, name), body={"propagationPolicy": "Background"})
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def annotate(self, kind: str, namespace: str, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set (or, with None, remove) annotations; a vanished object is fine."""
        self.merge_patch(kind, namespace, name, {"metadata": {"annotations": dict(annotations)}})

    def merge_patch(self, kind: str, namespace: str, name: str, patch: JSON) -> None:
        """A JSON merge patch (``None`` removes a key); a vanished object is fine."""
        try:
            self.request(
                "PATCH",
                self.path(kind, namespace, name),
                body=patch,
                content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def patch_status(self, kind: str, namespace: str, name: str, status: JSON) -> None:
        self.request(
            "PATCH",
            self.path(kind, namespace, name, "status"),
            body={"status": status},
            content_type="application/merge-patch+json",
        )

    def read_secret_key(self, namespace: str, name: str, key: str) -> str | None:
        import base64

        secret = self.get("Secret", namespace, name)
        if secret is None or key not in (secret.get("data") or {}):
            return None
        return base64.b64decode(secret["data"][key]).decode()
