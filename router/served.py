"""Which workers a request naming a model may go to, and the gateway's merged ``/v1/models``: pure
functions over the model names each worker's sidecar says its engine serves (its member record's
``served_models``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from .engine_api import vllm_model_ids


class Serving(Protocol):
    @property
    def served_models(self) -> tuple[str, ...]: ...


W = TypeVar("W", bound=Serving)


def workers_for_model(model: str | None, workers: Sequence[W]) -> list[W]:
    """The workers a request naming ``model`` may go to, in their order.

    When some worker lists ``model`` among its served names, the workers that list other names only
    are left out: a vLLM engine answers 404 for a name it does not serve, an SGLang engine answers
    with its own model. Workers that list nothing stay in: nothing says they do not serve it, and
    leaving them out would, during an upgrade of the sidecars, send every request naming the model
    to the first upgraded replica. A request naming no model, or one no worker lists (SGLang ignores
    the field; clients send "default"), may go to any worker, as before."""
    if not model or not any(model in w.served_models for w in workers):
        return list(workers)
    return [w for w in workers if not w.served_models or model in w.served_models]


def model_list_ids(body: bytes) -> list[str] | None:
    """The ``id`` of each entry of an OpenAI model list (``GET /v1/models``); None if ``body`` is
    not one (then it is passed on as it came)."""
    parsed = _model_list(body)
    return None if parsed is None else [name for name in vllm_model_ids(parsed) if isinstance(name, str)]


def _model_list(body: bytes) -> dict[str, Any] | None:
    """``body`` parsed, if it is an OpenAI model list (an object whose ``data`` is a list of objects)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list) or not all(isinstance(card, dict) for card in data):
        return None  # stricter than vllm_model_ids, which skips entries that are not objects
    return obj


def workers_to_ask(listed: Sequence[str], workers: Sequence[W]) -> list[W]:
    """Workers to ask for their model list so that every name some worker serves, and ``listed``
    does not hold, is asked of one of them (the fewest asks in the workers' order)."""
    covered = set(listed)
    ask = []
    for w in workers:
        if not covered.issuperset(w.served_models):
            ask.append(w)
            covered.update(w.served_models)
    return ask


def merge_model_lists(first: bytes, others: Sequence[bytes]) -> bytes:
    """``first`` (an OpenAI model list) with the entries of ``others`` whose ``id`` it lacks, each id
    once, first's entries first; an answer that is not a model list adds nothing."""
    merged = _model_list(first)
    if merged is None:
        return first
    seen = {card.get("id") for card in merged["data"]}
    added = False
    for body in others:  # each parsed once
        other = _model_list(body)
        if other is None:
            continue
        for card in other["data"]:
            if isinstance(card.get("id"), str) and card["id"] not in seen:
                seen.add(card["id"])
                merged["data"].append(card)
                added = True
    return json.dumps(merged, separators=(",", ":")).encode() if added else first
