"""SGLang's ``/generate`` names a LoRA adapter by ``lora_path`` alone: a ``model`` field there is not
read by the engine, so ``"base:adapter"`` in it names no adapter.

Specification: SGLang resolves ``"base:adapter"`` in ``model`` (``serving_base._resolve_lora_path``)
on its OpenAI routes only; its native ``/generate`` takes a ``GenerateReqInput``, which has no
``model`` field (an extra field is dropped), and uses the request's ``lora_path``. A client that
sends ``model`` on ``/generate`` (for the gateway's model routing, or by habit) is served by the base
model, or by its ``lora_path`` adapter. Before, the gateway and the sidecar's mirror both took
``"base:A"`` there for adapter A: the prompt was hashed and mirrored under A while the engine cached
it under the base model (or under another adapter), so a later base-model request was predicted no
hit on the blocks it would find, and A's requests a hit on blocks they would not. Now both read the
``model`` field for the adapter on the OpenAI routes only (``InferenceRequest.adapter_model``);
``/v1/completions`` and ``/v1/chat/completions`` keep the ``"base:adapter"`` rule.
"""

from __future__ import annotations

import json
import time

import pytest

from prefixfleet.router.blockhash import CacheIdentity
from prefixfleet.router.mirror import AdapterNamespace, CacheMirror
from prefixfleet.router.records import MemberRecord
from prefixfleet.router.requests import parse_inference_request
from prefixfleet.router.view import FleetView, WorkerView

IDENTITY = CacheIdentity("base", "r", "")
ADAPTERS = ("A", "B")


def parsed(path: str, **fields: object):
    prompt = {"text": "hello world"} if path == "/generate" else {"prompt": "hello world"}
    if path == "/v1/chat/completions":
        prompt = {"messages": [{"role": "user", "content": "hello world"}]}
    return parse_inference_request(path, json.dumps({**prompt, **fields}).encode())


def mirror_namespace(request) -> object:
    mirror = CacheMirror(10_000, IDENTITY, clock=time.time)
    return mirror.request_namespace(None, ADAPTERS, "sglang", request.adapter_model, request.lora_path)


def gateway_key(request) -> tuple[tuple[int, int], tuple[int, int]]:
    """(the key the gateway hashes ``request`` under at an SGLang worker with A and B, its own key)."""
    view = FleetView()
    member = MemberRecord(url="http://w", model="base", revision="r", adapters=ADAPTERS, engine_api="sglang")
    w = WorkerView(worker_id="w", url="http://w", member=member)
    return view.request_key(w, request.adapter_model, request.lora_path), view.cache_key(w)


@pytest.mark.parametrize(
    ("fields", "adapter"),
    [
        ({"model": "base:A"}, None),  # not read by /generate: the base model
        ({"model": "base:A", "lora_path": "B"}, "B"),  # its lora_path alone
        ({"lora_path": "A"}, "A"),
        ({"model": "base"}, None),
    ],
)
def test_generate_names_an_adapter_by_lora_path_alone(fields: dict, adapter: str | None) -> None:
    request = parsed("/generate", **fields)
    assert request.model == fields.get("model")  # still there for model routing
    namespace = mirror_namespace(request)
    key, own = gateway_key(request)
    if adapter is None:
        assert namespace is None
        assert key == own
    else:
        assert namespace == AdapterNamespace(adapter)
        assert key != own
        assert key == gateway_key(parsed("/generate", lora_path=adapter))[0]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_the_openai_routes_keep_the_base_colon_adapter_rule(path: str) -> None:
    request = parsed(path, model="base:A", lora_path="B")  # the model field wins there
    assert mirror_namespace(request) == AdapterNamespace("A")
    key, own = gateway_key(request)
    assert key != own
    assert key == gateway_key(parsed(path, lora_path="A"))[0]
