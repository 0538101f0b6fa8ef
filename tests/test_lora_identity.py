"""Per-request LoRA adapters in the cache identity (pure: the rule, the member record's new fields,
the gateway's view and the sidecar's mirror fed by hand).

vLLM keys its KV blocks per LoRA adapter and SGLang its radix cache: a prompt cached under adapter A
(or the base model) is a miss under adapter B. Before, both the gateway and the sidecar's mirror
hashed every request under the worker's configured identity, so B's request was predicted a hit on
A's blocks and the mirror recorded B's prompt as base blocks.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixfleet.router.blockhash import CacheIdentity, adapter_seeds, request_identity, requested_adapter
from prefixfleet.router.engine_api import adapters_after, sglang_adapter_names, vllm_adapter_ids
from prefixfleet.router.exemplars import ExemplarStore
from prefixfleet.router.mirror import AdapterNamespace, CacheMirror, namespace_adapter, namespace_salt
from prefixfleet.router.policies import Decision, RouteRequest, make_policy
from prefixfleet.router.radix import as_token_bytes
from prefixfleet.router.records import MAX_SERVED_MODELS, MemberRecord, decode_member, encode_record
from prefixfleet.router.requests import parse_inference_request
from prefixfleet.router.summary import SummaryError, encode_summary
from prefixfleet.router.view import FleetView
from tests.test_view_cache_rename import load as load_record  # a ready worker's load record

B = 4
BASE = CacheIdentity("llama", "main", "")
PROMPT = as_token_bytes(list(range(40)))
names = st.text(min_size=1, max_size=12)


# -- the rule --------------------------------------------------------------------------------------


def test_vllm_names_an_adapter_by_the_model_field_and_ignores_lora_path():
    assert requested_adapter("vllm", "sql", None) == "sql"
    assert requested_adapter("vllm", None, "sql") is None  # vLLM ignores the field
    assert requested_adapter("vllm", "", None) is None


def test_sglang_names_an_adapter_as_base_colon_adapter_or_by_lora_path():
    # serving_base._parse_model_parameter: the first ':' splits, both parts stripped
    assert requested_adapter("sglang", "meta-llama/Llama-3.1-8B:sql", None) == "sql"
    assert requested_adapter("sglang", "m: a:b ", None) == "a:b"
    assert requested_adapter("sglang", "m:sql", "python") == "sql"  # the model's adapter wins
    assert requested_adapter("sglang", "m:  ", "python") == "python"  # an empty one names none
    assert requested_adapter("sglang", "m", "python") == "python"
    assert requested_adapter("sglang", "sql", None) is None  # a bare name is the base model there
    assert requested_adapter("sglang", None, None) is None


def test_an_engine_api_whose_rule_is_unknown_names_no_adapter():
    assert requested_adapter("", "sql", "sql") is None
    assert requested_adapter("tgi", "sql", "sql") is None


def test_a_request_naming_a_loaded_adapter_is_hashed_under_it():
    got = request_identity(BASE, ("sql", "py"), "vllm", "sql", None)
    assert got == CacheIdentity("llama", "main", "sql")
    assert got.seed() != BASE.seed()
    assert request_identity(BASE, ("sql",), "sglang", "llama:sql", None) == got


@pytest.mark.parametrize("model", [None, "llama", "an-alias", "not-loaded"])
def test_the_base_model_an_alias_nothing_or_an_unknown_adapter_keep_the_configured_identity(model):
    assert request_identity(BASE, ("sql",), "vllm", model, None) is BASE


@given(
    configured=st.builds(CacheIdentity, names, names, st.sampled_from(["", "A"])),
    adapters=st.lists(names, max_size=4),
    api=st.sampled_from(["vllm", "sglang", "", "other"]),
    model=st.none() | names,
    lora_path=st.none() | names,
)
def test_the_identity_is_the_configured_one_or_the_same_model_under_a_loaded_adapter(
    configured, adapters, api, model, lora_path
):
    got = request_identity(configured, tuple(adapters), api, model, lora_path)
    adapter = requested_adapter(api, model, lora_path)
    if adapter is not None and adapter in adapters:
        assert got == CacheIdentity(configured.model, configured.revision, adapter)
    else:
        assert got is configured
    # never another model or revision: only the adapter part moves
    assert (got.model, got.revision) == (configured.model, configured.revision)


@given(
    configured=st.builds(CacheIdentity, names, names, st.sampled_from(["", "A"])),
    adapters=st.lists(st.sampled_from(["A", "B", "m:B", " B"]) | names, max_size=4),
    api=st.sampled_from(["vllm", "sglang", ""]),
    model=st.none() | st.sampled_from(["A", "B", "m:B", "m: A", "m:"]) | names,
    lora_path=st.none() | st.sampled_from(["A", "B"]) | names,
)
def test_the_gateways_table_of_adapter_seeds_is_the_rule(configured, adapters, api, model, lora_path):
    """FleetView.request_key looks seeds up in adapter_seeds (built once per member record) rather
    than building an identity per request: the same answer as request_identity."""
    got = request_identity(configured, tuple(adapters), api, model, lora_path)
    adapter = requested_adapter(api, model, lora_path)
    seed = adapter_seeds(configured, adapters).get(adapter) if adapter is not None else None
    assert seed == (None if got is configured else got.seed())


def test_a_worker_that_loads_another_adapter_is_hashed_with_it_at_its_next_record():
    view = fleet(("A",))
    assert matched(view, "B") == 0 and view.request_key(view.workers["w1"], "B", None) == (BASE.seed(), B)
    member = MemberRecord(url="http://h:1", model=BASE.model, revision=BASE.revision, block_tokens=B,
                          adapters=("A", "B"), engine_api="vllm")  # fmt: skip
    view.apply_snapshot({"w1": encode_record(member)}, {"w1": load_record(2)}, 0.1)
    want = CacheIdentity(BASE.model, BASE.revision, "B").seed()
    assert view.request_key(view.workers["w1"], "B", None) == (want, B)


def test_the_engines_adapter_lists_are_read_as_each_engine_states_them():
    # vLLM's show_available_models: adapters carry a parent, served names do not
    body = {
        "object": "list",
        "data": [
            {"id": "llama", "object": "model", "parent": None, "root": "/m"},
            {"id": "alias", "object": "model", "root": "/m"},
            {"id": "sql", "object": "model", "parent": "llama", "root": "/loras/sql"},
            "junk",
        ],
    }
    assert vllm_adapter_ids(body) == ["sql"]
    assert vllm_adapter_ids({"data": "x"}) == [] and vllm_adapter_ids(None) == []
    # SGLang's lora_paths, in each form its releases state it
    assert sglang_adapter_names({"sql": "/a", "py": "/b"}) == ["sql", "py"]
    assert sglang_adapter_names(["sql=/a", "/loras/py"]) == ["sql", "/loras/py"]
    assert sglang_adapter_names([{"lora_id": "1", "lora_name": "sql", "lora_path": "/a"}]) == ["sql"]
    assert sglang_adapter_names(None) == [] and sglang_adapter_names(7) == []


def test_an_adapter_loaded_or_unloaded_through_the_sidecar_changes_what_its_record_says():
    load, unload = b'{"lora_name": "C", "lora_path": "/c"}', b'{"lora_name": "A"}'
    served, adapters = ("m", "A"), ("A",)
    # vLLM lists adapters among its /v1/models ids; SGLang's served name stays its model's
    assert adapters_after("vllm", "/v1/load_lora_adapter", 200, load, served, adapters) == (
        ("m", "A", "C"),
        ("A", "C"),
    )
    assert adapters_after("sglang", "/load_lora_adapter", 200, load, ("m",), adapters) == (("m",), ("A", "C"))
    assert adapters_after("vllm", "/v1/unload_lora_adapter", 200, unload, served, adapters) == (("m",), ())
    # nothing changes for a refusal, another route, or a body without a name
    assert adapters_after("vllm", "/v1/load_lora_adapter", 400, load, served, adapters) is None
    assert adapters_after("vllm", "/v1/completions", 200, load, served, adapters) is None
    assert adapters_after("vllm", "/v1/load_lora_adapter", 200, b"[1]", served, adapters) is None
    assert adapters_after("vllm", "/v1/load_lora_adapter", 200, b"{bad", served, adapters) is None


def test_requests_carry_their_first_prompts_lora_path():
    parse = parse_inference_request
    assert parse("/generate", b'{"text": "a b", "lora_path": "sql"}').lora_path == "sql"
    assert parse("/generate", b'{"text": ["a", "b"], "lora_path": ["sql", null]}').lora_path == "sql"
    assert parse("/v1/completions", b'{"prompt": "a b", "lora_path": 5}').lora_path is None
    assert parse("/v1/completions", b'{"prompt": "a b"}').lora_path is None


# -- the member record -----------------------------------------------------------------------------


def test_a_member_record_carries_adapters_and_engine_api_and_old_records_still_decode():
    record = MemberRecord(url="http://h:1", model="llama", adapters=("sql",), engine_api="vllm")
    assert decode_member(encode_record(record)) == record
    old = json.dumps({"url": "http://h:1", "model": "llama", "served_models": ["llama"], "v": 1})
    decoded = decode_member(old)
    assert decoded.adapters == () and decoded.engine_api == ""


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("adapters", "sql", "field 'adapters' must be a list of at most 256 names"),
        ("adapters", ["x"] * (MAX_SERVED_MODELS + 1), "field 'adapters' must be a list of at most 256"),
        ("adapters", [""], "field 'adapters' holds '', not a name of 1-1024 characters"),
        ("adapters", [7], "field 'adapters' holds '7'"),
        ("engine_api", 7, "field 'engine_api' must be a string of at most 32 characters"),
        ("engine_api", "x" * 33, "field 'engine_api' must be a string of at most 32 characters"),
    ],
)
def test_a_member_record_with_unusable_adapter_fields_is_refused_naming_the_field(field, value, said):
    raw = json.dumps({"url": "http://h:1", field: value, "v": 1})
    with pytest.raises(SummaryError, match="member record: " + said.replace("(", r"\(")):
        decode_member(raw)


# -- gateway and mirror agree ----------------------------------------------------------------------


def fleet(adapters: tuple[str, ...], api: str = "vllm") -> FleetView:
    view = FleetView(block_tokens=B)
    member = MemberRecord(
        url="http://h:1", model=BASE.model, revision=BASE.revision, block_tokens=B,
        served_models=(BASE.model, *adapters), adapters=adapters, engine_api=api,
    )  # fmt: skip
    view.apply_snapshot({"w1": encode_record(member)}, {"w1": load_record(1)}, 0.0)
    return view


def matched(view: FleetView, model: str | None, lora_path: str | None = None, wall: float = 100.0) -> int:
    workers = view.routable(0.0)
    hashes = view.request_hashes(PROMPT, None, workers, model, lora_path)
    return view.replica_states(workers, hashes, 40, wall, model, lora_path)[0].matched_tokens


def mirror_with(model: str | None, adapters: tuple[str, ...], api: str = "vllm") -> CacheMirror:
    """A sidecar's mirror that recorded PROMPT from one request naming ``model``."""
    mirror = CacheMirror(1000, BASE, block_tokens=B, clock=lambda: 50.0)
    mirror.admit_sent(PROMPT, mirror.request_namespace(None, adapters, api, model, None))
    return mirror


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_a_prompt_cached_under_adapter_a_is_no_hit_for_adapter_b_or_the_base_model(api):
    adapters = ("A", "B")
    name = (lambda a: a) if api == "vllm" else (lambda a: f"{BASE.model}:{a}")
    mirror = mirror_with(name("A"), adapters, api)
    view = fleet(adapters, api)
    summary = mirror.summary(worker="w1", version=1)
    assert view.apply_summary("w1", encode_summary(summary)) is None
    # the gateway finds the blocks the mirror published exactly where the mirror put them
    assert matched(view, name("A")) == 40
    assert matched(view, name("B")) == 0  # before: 40, a hit the engine does not have
    assert matched(view, BASE.model) == 0
    assert matched(view, None) == 0
    # and the mirror itself: B's prompt matches none of A's tokens
    admitted = mirror.admit_sent(PROMPT, mirror.request_namespace(None, adapters, api, name("B"), None))
    assert admitted.matched_tokens == 0


def test_sglang_lora_path_selects_the_same_adapter_blocks_as_the_model_syntax():
    mirror = mirror_with("llama:A", ("A",), "sglang")
    view = fleet(("A",), "sglang")
    assert view.apply_summary("w1", encode_summary(mirror.summary(worker="w1", version=1))) is None
    assert matched(view, None, "A") == 40
    assert matched(view, "A") == 0  # a bare adapter name is SGLang's base model


def test_a_base_model_prompt_is_no_hit_for_an_adapter_and_keeps_its_old_hashes():
    mirror = mirror_with(BASE.model, ("A",))
    view = fleet(("A",))
    assert view.apply_summary("w1", encode_summary(mirror.summary(worker="w1", version=1))) is None
    assert matched(view, BASE.model) == 40 and matched(view, None) == 40
    assert matched(view, "A") == 0
    # requests naming no adapter are hashed and recorded as before adapters existed
    assert mirror.request_namespace("t", ("A",), "vllm", BASE.model, None) == "t"
    assert view.request_key(view.workers["w1"], None, None) == (BASE.seed(), B)


def test_a_worker_without_the_adapter_hashes_a_request_naming_it_under_its_own_identity():
    mirror = mirror_with("A", ())  # an engine without adapter A: vLLM would refuse, nothing new
    view = fleet(())
    assert view.apply_summary("w1", encode_summary(mirror.summary(worker="w1", version=1))) is None
    assert matched(view, "A") == 40  # as before: nothing says A is an adapter there


def test_the_gateways_own_sends_under_adapter_a_count_for_a_only():
    view = fleet(("A", "B"))
    w = view.workers["w1"]
    key = view.request_key(w, "A", None)
    chain = view.request_hashes(PROMPT, None, [w], "A", None)[key]
    view.record_send("w1", chain, 40, 100.0, key)
    assert matched(view, "A") == 40
    assert matched(view, "B") == 0 and matched(view, None) == 0
    # an adapter's send is not a former name of the worker's own cache
    assert list(w.overlay_keys) == []


def test_a_policy_keeping_its_own_tree_files_an_adapters_prompt_apart_from_the_base_models():
    view = fleet(("A",))
    workers = view.routable(0.0)
    assert view.route_namespace(workers, "A", None, "t") == AdapterNamespace("A", "t")
    assert view.route_namespace(workers, BASE.model, None, "t") == "t"
    assert view.route_namespace(workers, None, None, None) is None
    assert view.route_namespace(workers, "not-loaded", None, None) is None
    policy = make_policy("sglang_cache_aware")
    as_a = RouteRequest(PROMPT, 40, 1.0, namespace=view.route_namespace(workers, "A", None, None))
    policy.on_routed(as_a, Decision("w1", "low_match", 0))
    # before, both requests were filed under no salt: the base request matched A's 40 tokens
    as_base = view.route_namespace(workers, BASE.model, None, None)
    assert policy.tree.prefix_match(PROMPT, None, as_base)[0] == 0
    assert policy.tree.prefix_match(PROMPT, None, as_a.namespace)[0] == 40


def test_a_tenant_salt_under_an_adapter_is_its_own_namespace():
    mirror = CacheMirror(1000, BASE, block_tokens=B, clock=lambda: 50.0)
    ns = mirror.request_namespace("t1", ("A",), "vllm", "A", None)
    assert ns == AdapterNamespace("A", "t1")
    assert namespace_salt(ns) == "t1" and namespace_adapter(ns) == "A"
    assert namespace_salt("t1") == "t1" and namespace_adapter("t1") is None
    assert mirror.namespace_seed(ns) != mirror.namespace_seed("t1")
    assert mirror.namespace_seed(ns) != mirror.namespace_seed(AdapterNamespace("A", None))


def test_the_exemplar_kept_for_an_adapters_prefix_is_that_adapters_request():
    store = ExemplarStore(1 << 20)
    store.record("/v1/completions", b'{"model":"A"}', AdapterNamespace("A", None), PROMPT)
    store.record("/v1/completions", b'{"model":"llama"}', None, PROMPT)  # same prompt, base model
    assert store.holding(PROMPT[:16], AdapterNamespace("A", None)).body == b'{"model":"A"}'
    assert store.holding(PROMPT[:16], None).body == b'{"model":"llama"}'
    assert store.holding(PROMPT[:16], AdapterNamespace("B", None)) is None
