"""Model-aware routing, as pure functions over plain data.

Specification:
* a sidecar's member record carries the model names its engine serves (vLLM: every ``/v1/models``
  id; SGLang: ``served_model_name``, else ``model_path``; never the ``--model`` cache identity);
  a record without the field (an older sidecar's) still decodes, with no names; a malformed field is
  refused naming it; names a record could not carry are left out by the sidecar;
* a request naming a model some routable worker lists goes only to those workers and the ones that
  list nothing; a request naming none, or a name no worker lists, may go to any worker;
* ``/v1/models`` through the gateway lists each model some worker serves once, asking one worker
  per missing name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.router.engine_api import vllm_model_ids
from prefixfleet.router.records import (
    MAX_MODEL_NAME,
    MAX_SERVED_MODELS,
    MemberRecord,
    decode_member,
    encode_record,
    servable_names,
)
from prefixfleet.router.served import merge_model_lists, model_list_ids, workers_for_model, workers_to_ask
from prefixfleet.router.sidecar import sglang_facts
from prefixfleet.router.summary import SummaryError
from prefixfleet.router.view import WorkerView


@dataclass(frozen=True)
class W:
    name: str
    served_models: tuple[str, ...]


# -- member records ----------------------------------------------------------------------------------


def test_served_models_round_trip_through_a_member_record() -> None:
    record = MemberRecord(url="http://10.0.0.1:8080", model="cache-id", served_models=("a", "a-lora"))
    decoded = decode_member(encode_record(record))
    assert decoded.served_models == ("a", "a-lora")
    assert decoded.model == "cache-id"  # the cache identity is its own field, unchanged


def test_an_older_sidecars_record_without_the_field_decodes_with_no_names() -> None:
    old = '{"url":"http://10.0.0.1:8080","state":"ready","model":"m","revision":"","adapter":"",'
    old += '"block_tokens":16,"registered_at":1.5,"v":1}'
    decoded = decode_member(old)
    assert (decoded.model, decoded.served_models) == ("m", ())
    assert WorkerView("w0", decoded.url, member=decoded).served_models == ()


@pytest.mark.parametrize(
    "value",
    ["a", [1], [""], ["x" * (MAX_MODEL_NAME + 1)], ["m"] * (MAX_SERVED_MODELS + 1), {"a": 1}, None],
)
def test_a_malformed_served_models_field_is_refused_naming_it(value: object) -> None:
    raw = json.dumps({"url": "http://h:1", "served_models": value, "v": 1})
    with pytest.raises(SummaryError, match="served_models"):
        decode_member(raw)


def test_the_sidecar_keeps_only_names_a_record_can_carry() -> None:
    stated: list[object] = ["a", None, "", 7, "a", "x" * (MAX_MODEL_NAME + 1), "b"]
    assert servable_names(stated) == ("a", "b")
    many = servable_names(f"m{i}" for i in range(MAX_SERVED_MODELS + 5))
    assert len(many) == MAX_SERVED_MODELS
    # whatever it keeps, a gateway accepts
    record = MemberRecord(url="http://h:1", served_models=many)
    assert decode_member(encode_record(record)).served_models == many


def test_vllm_serves_every_id_of_its_model_list_and_sglang_its_served_name() -> None:
    body = {"object": "list", "data": [{"id": "base"}, {"id": "sql-lora", "parent": "base"}, "junk"]}
    assert servable_names(vllm_model_ids(body)) == ("base", "sql-lora")
    assert vllm_model_ids({"data": "nope"}) == [] and vllm_model_ids(None) == []
    info = {"served_model_name": "chat", "model_path": "/models/llama"}
    facts = sglang_facts(info, model="cache-override", revision=None)
    assert (facts.model, facts.served_models) == ("cache-override", ("chat",))
    assert sglang_facts({"model_path": "/models/llama"}, None, None).served_models == ("/models/llama",)
    assert sglang_facts({}, None, None).served_models == ()


# -- which workers a request may go to ---------------------------------------------------------------

names = st.sampled_from(["a", "b", "c", "default"])
workers_st = st.lists(
    st.tuples(st.integers(0, 10**6), st.lists(names, max_size=3, unique=True)), max_size=8
).map(lambda rows: [W(f"w{i}-{n}", tuple(served)) for i, (n, served) in enumerate(rows)])


def test_a_named_model_goes_to_its_workers_and_the_unknown_ones() -> None:
    a, b, old = W("a", ("model-a",)), W("b", ("model-b", "b-lora")), W("old", ())
    fleet = [a, b, old]
    assert workers_for_model("model-a", fleet) == [a, old]
    assert workers_for_model("b-lora", fleet) == [b, old]
    assert workers_for_model("default", fleet) == fleet  # no worker lists it: any
    assert workers_for_model(None, fleet) == fleet
    assert workers_for_model("model-a", []) == []


@given(st.one_of(st.none(), names), workers_st)
def test_the_rule_over_any_fleet(model: str | None, workers: list[W]) -> None:
    picked = workers_for_model(model, workers)
    assert picked == [w for w in workers if w in picked]  # a subset, in the fleet's order
    if model is not None and any(model in w.served_models for w in workers):
        assert picked == [w for w in workers if model in w.served_models or not w.served_models]
    else:
        assert picked == workers


# -- the merged model list -----------------------------------------------------------------------------


def model_list(*ids: str) -> bytes:
    return json.dumps({"object": "list", "data": [{"id": i, "object": "model"} for i in ids]}).encode()


def test_one_worker_is_asked_per_model_the_first_answer_lacks() -> None:
    a1, a2, b, ab, old = W("a1", ("a",)), W("a2", ("a",)), W("b", ("b",)), W("ab", ("a", "b")), W("old", ())
    assert workers_to_ask(["a"], [a2, old]) == []
    assert workers_to_ask(["a"], [a1, b, a2, ab]) == [b]
    assert workers_to_ask([], [ab, b]) == [ab]


def test_model_lists_merge_by_id_first_answer_first() -> None:
    merged = merge_model_lists(model_list("a"), [model_list("b", "a"), b"not json", model_list("b", "c")])
    assert model_list_ids(merged) == ["a", "b", "c"]
    assert merge_model_lists(model_list("a"), [model_list("a")]) == model_list("a")  # as it came
    assert merge_model_lists(b'{"error": "x"}', [model_list("b")]) == b'{"error": "x"}'
    assert model_list_ids(b'{"data": [1]}') is None and model_list_ids(b"[[[") is None
