"""Which engine routes the sidecar forwards without the fleet's control token (pure data and one decision).

A sidecar listens on its pod's IP and forwards every path it does not serve itself to its engine,
which listens on loopback only. The engine's data plane (inference, tokenizing, model and server
information, health) is what clients and gateways reach it for; everything else an engine serves
administers it: SGLang's ``/flush_cache``, ``/update_weights_from_*``, ``/abort_request``,
``/release_memory_occupation``, ``/load_lora_adapter``, ``/start_profile``...; vLLM's ``/sleep``,
``/wake_up``, ``/reset_prefix_cache``, ``/collective_rpc``, ``/scale_elastic_ep`` and, under ``/v1``,
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``. Those need the control token
(:mod:`.control`). So this is an allowlist: a route not named here (a new admin route of a later
release included) needs the token; a data-plane route missing here costs a client the token, never
the engine its safety.

The lists were read from the engines' route tables: SGLang's
``python/sglang/srt/entrypoints/http_server.py`` and vLLM's ``vllm/entrypoints/openai/api_server.py``
(its routes for generation, pooling, speech, tokenizing, SageMaker and Anthropic messages).

The decision is made on the request target as the sidecar forwards it, decoded the way uvicorn
decodes it before Starlette routes it (percent-escapes, ``%2F`` included), so ``/flush%5Fcache`` is
judged as the ``/flush_cache`` the engine will run. A path with a dot segment (``..``) needs the token
whatever it names: an engine or proxy that resolves it may route it elsewhere than it reads.
"""

from __future__ import annotations

from urllib.parse import unquote

# Exact paths an engine serves to clients. Method is not judged: on these paths no method
# administers the engine (SGLang answers /generate to PUT too; a wrong one is the engine's 405).
SGLANG_DATA_PLANE = frozenset(
    {
        "/generate",
        "/generate_from_file",
        "/encode",
        "/classify",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/classify",
        "/v1/score",
        "/v1/rerank",
        "/v1/responses",
        "/v1/tokenize",
        "/v1/detokenize",
        "/tokenize",
        "/detokenize",
        "/v1/models",
        "/parse_function_call",  # parses text it is given: no engine state
        "/separate_reasoning",  # likewise
        "/invocations",  # SageMaker's chat completion
        "/vertex_generate",  # Vertex AI's generate (its default AIP_PREDICT_ROUTE)
        "/health",
        "/health_generate",
        "/ping",
        "/get_model_info",
        "/model_info",  # the newer name
        "/get_server_info",
        "/server_info",  # the newer name
        "/get_weight_version",
        "/get_load",
        "/version",
        "/metrics",
    }
)
VLLM_DATA_PLANE = frozenset(
    {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/messages",  # Anthropic's messages API
        "/v1/embeddings",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/invocations",
        "/tokenize",
        "/detokenize",
        "/tokenizer_info",
        "/v1/models",
        "/version",
        "/health",
        "/load",
        "/ping",
        "/metrics",
    }
)
DATA_PLANE_PATHS = SGLANG_DATA_PLANE | VLLM_DATA_PLANE
# Routes with a parameter: the prefix, then what may follow it. OpenAI's model retrieval (SGLang's
# /v1/models/{model:path}: a model name may hold slashes) and a Responses API response by id (read,
# or cancelled by the client that holds its id: both engines).
DATA_PLANE_PREFIXES = (
    ("/v1/models/", "path"),
    ("/v1/responses/", "segment"),
)
RESPONSE_CANCEL_SUFFIX = "/cancel"

# Admin routes known by name: the label a refusal is counted under (any other path counts as
# "other", so a client cannot grow the metric's label set by sending made-up paths). Not consulted
# by the decision, which needs no list of what it refuses.
KNOWN_ADMIN_PATHS = frozenset(
    {
        # SGLang
        "/flush_cache",
        "/clear_hicache_storage_backend",
        "/abort_request",
        "/pause_generation",
        "/continue_generation",
        "/set_internal_state",
        "/configure_logging",
        "/start_profile",
        "/stop_profile",
        "/freeze_gc",
        "/start_expert_distribution_record",
        "/stop_expert_distribution_record",
        "/dump_expert_distribution_record",
        "/update_weights_from_disk",
        "/update_weights_from_tensor",
        "/update_weights_from_distributed",
        "/update_weights_from_ipc",
        "/update_weight_version",
        "/init_weights_update_group",
        "/destroy_weights_update_group",
        "/init_weights_send_group_for_remote_instance",
        "/send_weights_to_remote_instance",
        "/get_weights_by_name",
        "/release_memory_occupation",
        "/resume_memory_occupation",
        "/slow_down",
        "/load_lora_adapter",
        "/unload_lora_adapter",
        "/open_session",
        "/close_session",
        # vLLM
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/collective_rpc",
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/pause",
        "/resume",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
    }
)
OTHER_ROUTE = "other"


def engine_path(target: str) -> str:
    """The path an engine routes ``target`` (path and query as the sidecar forwards it) by: the part
    before ``?``, percent-decoded as uvicorn decodes it."""
    path = target.partition("?")[0]
    return unquote(path, errors="replace") if "%" in path else path


def engine_route_is_open(target: str) -> bool:
    """Whether the sidecar forwards ``target`` to its engine without the control token: a data-plane
    route of SGLang or vLLM (:data:`DATA_PLANE_PATHS`, :data:`DATA_PLANE_PREFIXES`)."""
    path = engine_path(target)
    if path in DATA_PLANE_PATHS:  # the common case, first: no listed path has a dot segment
        return True
    if not path.startswith("/") or "\\" in path or any(seg in (".", "..") for seg in path.split("/")):
        return False
    for prefix, rest_kind in DATA_PLANE_PREFIXES:
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :]
        if rest_kind == "path":
            return bool(rest) and "" not in rest.split("/")
        rest = rest.removesuffix(RESPONSE_CANCEL_SUFFIX)
        return bool(rest) and "/" not in rest
    return False


def refused_route_label(target: str) -> str:
    """The metric label of a refused engine route: its path when it is a known admin route, else
    :data:`OTHER_ROUTE` (bounded: never a client's made-up path)."""
    path = engine_path(target)
    return path if path in KNOWN_ADMIN_PATHS else OTHER_ROUTE
