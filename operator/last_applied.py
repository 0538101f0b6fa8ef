"""How a child the operator owns is updated so it converges to the desired manifest: a three-way merge.

A JSON merge patch (RFC 7386) sets what it carries and removes only keys it sets to ``null``; a key
merely absent from it stays on the live object. So a setting taken out of a fleet (a nodeSelector
entry, affinity, imagePullSecrets, a label, an env var) would stay on the gateway Deployment for
ever. As ``kubectl apply`` does, every child records what the operator last wrote in the
``prefixfleet.io/last-applied`` annotation; the next update sends ``null`` for every key that was
written then and is not wanted now. Keys the operator never wrote (the API server's defaults,
another controller's annotations) are not in that record, so they are left alone.

Pure functions over plain dicts; ``kube.Kube.replace_spec`` sends the patch.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]

ANNOTATION_LAST_APPLIED = "prefixfleet.io/last-applied"

# What the operator owns of a child's metadata; the rest (uid, resourceVersion, managedFields,
# finalizers, ...) is the API server's or someone else's.
OWNED_METADATA = ("labels", "annotations", "ownerReferences")
# Top-level keys never written by the operator's updates.
NOT_OWNED = ("apiVersion", "kind", "metadata", "status")


def owned_fields(manifest: JSON) -> JSON:
    """What an update of ``manifest`` writes: its body (spec, data, ...) but status, and of its
    metadata the labels, annotations and owner references."""
    meta = manifest.get("metadata") or {}
    owned = {k: copy.deepcopy(v) for k, v in manifest.items() if k not in NOT_OWNED}
    owned["metadata"] = {k: copy.deepcopy(meta[k]) for k in OWNED_METADATA if k in meta}
    return owned


def _record(manifest: JSON) -> str:
    """The annotation's value for ``manifest``: its owned fields, without the record itself."""
    owned = owned_fields(manifest)
    annotations = owned["metadata"].get("annotations")
    if annotations is not None:
        annotations.pop(ANNOTATION_LAST_APPLIED, None)
        if not annotations:
            del owned["metadata"]["annotations"]
    return json.dumps(owned, sort_keys=True, separators=(",", ":"))


def with_last_applied(manifest: JSON) -> JSON:
    """A copy of ``manifest`` carrying the record of what it writes (create and update alike), so the
    next update knows what to remove. The spec-hash annotation, computed before, is unchanged."""
    recorded = copy.deepcopy(manifest)
    annotations = recorded.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[ANNOTATION_LAST_APPLIED] = _record(manifest)
    return recorded


def parse_last_applied(live: JSON | None) -> JSON | None:
    """What the operator last wrote on the live object, from its annotation; None when there is no
    record (a child created before the operator kept one) or it is not a JSON object (edited by
    hand): the update then removes nothing, as before."""
    annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_LAST_APPLIED)
    if not isinstance(text, str):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    # Only what an update writes can be removed by one: a record edited by hand (or by a tool that
    # copied the whole object into it) may name apiVersion, kind, status, metadata.name, uid or
    # finalizers, which the patch would otherwise set to null (another controller's finalizer
    # removed; a patch the API server refuses every round).
    record = {k: v for k, v in parsed.items() if k not in NOT_OWNED}
    meta = parsed.get("metadata")
    if isinstance(meta, dict):
        record["metadata"] = {k: meta[k] for k in OWNED_METADATA if k in meta}
    return record


def three_way_patch(last_applied: JSON | None, desired: JSON) -> JSON:
    """The JSON merge patch taking a live object from ``last_applied`` to ``desired``.

    ``desired`` as is, plus ``null`` for each key ``last_applied`` had and ``desired`` lacks, at any
    depth where both are objects. Lists are replaced whole (a merge patch cannot do otherwise).
    Applied to a live object holding ``last_applied`` and keys of others, the result is ``desired``
    plus those other keys that ``last_applied`` did not have. Without a record (None) the patch is
    ``desired``: it sets everything and removes nothing."""
    patch: JSON = {}
    for key, value in desired.items():
        before = (last_applied or {}).get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = three_way_patch(before, value)
        else:
            patch[key] = copy.deepcopy(value)
    for key in last_applied or {}:
        if key not in desired:
            patch[key] = None
    return patch


def child_patch(manifest: JSON, live: JSON | None) -> JSON:
    """The merge patch updating the live child to ``manifest``, recording it for the next update."""
    return three_way_patch(parse_last_applied(live), owned_fields(with_last_applied(manifest)))


# A replica pod's record holds only its labels taken from the fleet: the one part of a pod the
# operator updates in place (its spec cannot change; a new template is a new pod), so the one part a
# later update may have to remove from. The pod's spec stays out of it (it would copy the whole pod,
# a Redis URL with its password included, into an annotation).


def labels_record(labels: Mapping[str, str]) -> str:
    """The last-applied annotation's value for a replica pod carrying ``labels`` from its fleet."""
    return json.dumps({"metadata": {"labels": dict(labels)}}, sort_keys=True, separators=(",", ":"))


def recorded_labels(live: JSON | None) -> dict[str, Any] | None:
    """The labels the operator last wrote on ``live``, from its record; None when it has none."""
    record = parse_last_applied(live)
    if record is None:
        return None
    labels = (record.get("metadata") or {}).get("labels")
    return dict(labels) if isinstance(labels, dict) else {}


def labels_patch(recorded: Mapping[str, Any] | None, desired: Mapping[str, str]) -> JSON:
    """The merge patch turning a child's labels from ``recorded`` (its record; None: none) to
    ``desired``, others' labels untouched, and recording ``desired`` (a replica pod's record)."""
    return {
        "metadata": {
            "labels": three_way_patch(dict(recorded) if recorded is not None else None, dict(desired)),
            "annotations": {ANNOTATION_LAST_APPLIED: labels_record(desired)},
        }
    }
