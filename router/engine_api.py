"""Which engine API a sidecar speaks, SGLang's or vLLM's, and what it reads from each (pure).

SGLang states its identity and capacity in ``/get_server_info`` + ``/get_model_info``; vLLM has
neither (404): its served model name is ``/v1/models``' ``data[0].id`` and its KV capacity a label
set of the ``vllm:cache_config_info`` gauge on ``/metrics`` (``CacheConfig.metrics_info()``: every
field of vLLM's ``vllm/config/cache.py`` as a string, ``"None"`` when unset). The sidecar does the
I/O; these functions decide over what it read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs

from prometheus_client.parser import text_string_to_metric_families

from .blockhash import DEFAULT_BLOCK_TOKENS

SGLANG = "sglang"
VLLM = "vllm"
AUTO = "auto"
ENGINE_APIS = (AUTO, SGLANG, VLLM)

# The sidecar's /flush_cache (SGLang's route) is vLLM's POST /reset_prefix_cache, which vLLM
# registers only when the server runs with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/serve/cache/
# api_router.py attach_router); without it the route does not exist and vLLM answers 404.
VLLM_FLUSH_PATH = "/reset_prefix_cache"
VLLM_FLUSH_UNAVAILABLE = (
    "the vLLM engine has no POST /reset_prefix_cache (it answered 404): vLLM serves it only when "
    "started with VLLM_SERVER_DEV_MODE=1; the engine kept its prefix cache and so did this sidecar's mirror"
)
# vLLM answers /reset_prefix_cache with 200 whether or not it reset: its KV cache manager refuses
# while any request holds blocks (vllm/v1/core/kv_cache_manager.py reset_prefix_cache), unless asked
# with reset_running_requests=true (newer vLLM), which preempts them first.
VLLM_FLUSH_BUSY = (
    "requests are running: vLLM resets its prefix cache only when no request holds blocks (it answers "
    "200 and keeps the cache otherwise); nothing was flushed. Retry when idle, or pass "
    "reset_running_requests=true"
)
CACHE_CONFIG_METRIC = "vllm:cache_config_info"
REFUSED = (401, 403)  # an engine's answers to a request without its API key (or with another)


@dataclass(frozen=True, slots=True)
class Probe:
    """One GET of an engine route: its status (None: no answer — refused, reset, timed out) and
    its body when that parsed as JSON (else None)."""

    status: int | None
    body: object = None


def vllm_resets_running(query: str) -> bool:
    """Whether a /reset_prefix_cache query asks vLLM to reset despite running requests
    (``reset_running_requests``, a bool as FastAPI reads one: true, 1, yes, on)."""
    values = parse_qs(query).get("reset_running_requests", [])
    return bool(values) and values[-1].strip().lower() in ("true", "1", "yes", "on")


def is_sglang_info(server_info: Probe) -> bool:
    """``/get_server_info`` answered 200 with a JSON object: an SGLang server (or the emulator)."""
    return server_info.status == 200 and isinstance(server_info.body, dict)


def pick_engine_api(server_info: Probe, models: Probe | None) -> str | None:
    """The API of an engine from two probes, for ``--engine-api auto``: ``/get_server_info``
    answering 200 with a JSON object is SGLang; else ``/v1/models`` answering 200 is vLLM (``models``
    is None when it was not asked, the first probe having decided). An engine that answers both but
    neither way (a stand-in serving only the generation routes) is spoken to as SGLang, the
    sidecar's behaviour before it knew vLLM. None: the engine did not answer; ask again later.

    An engine run with an API key refuses the sidecar's probes when the sidecar has no key (or
    another): vLLM's key guards its ``/v1`` routes only (a 401 there; ``/get_server_info``, not
    one of its routes, stays a 404), SGLang's guards ``/get_server_info`` too. So a ``/v1/models``
    refused (401/403) beside a ``/get_server_info`` not refused is a keyed vLLM."""
    if is_sglang_info(server_info):
        return SGLANG
    if server_info.status is None or models is None or models.status is None:
        return None
    if models.status in REFUSED and server_info.status not in REFUSED:
        return VLLM
    return VLLM if models.status == 200 else SGLANG


def vllm_served_model(models_body: object) -> str | None:
    """The served model name in a vLLM ``/v1/models`` answer (``data[0].id``); None without one."""
    if not isinstance(models_body, dict):
        return None
    data = models_body.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return None
    name = data[0].get("id")
    return name if isinstance(name, str) and name else None


def vllm_model_ids(models_body: object) -> list[object]:
    """Every ``id`` of a vLLM ``/v1/models`` answer's ``data`` (its served names and loaded LoRA
    adapters: each a name its requests' "model" may give), as stated: the caller checks them.
    Entries that are not objects are skipped; served.model_list_ids, which refuses such a list,
    builds on this."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    if not isinstance(data, list):
        return []
    return [card.get("id") for card in data if isinstance(card, dict)]


def vllm_adapter_ids(models_body: object) -> list[object]:
    """The ``id`` of each LoRA adapter in a vLLM ``/v1/models`` answer: the entries with a
    ``parent`` (vLLM's ``show_available_models`` gives each adapter card ``parent`` = its base
    model's name; the base model's served names have none, ``null`` in the JSON), as stated."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    if not isinstance(data, list):
        return []
    return [card.get("id") for card in data if isinstance(card, dict) and card.get("parent") is not None]


def sglang_adapter_names(lora_paths: object) -> list[object]:
    """The adapter names in SGLang's ``lora_paths`` server argument as ``/get_server_info`` states
    it, in each form SGLang has had: a {name: path} object (older releases), a list of ``name=path``
    or ``path`` strings (a bare path is its own name), or a list of objects with ``lora_name``
    (``LoRARef``, as later releases normalise it); as stated: the caller checks them."""
    if isinstance(lora_paths, dict):
        return list(lora_paths)
    if not isinstance(lora_paths, list):
        return []
    names: list[object] = []
    for entry in lora_paths:
        if isinstance(entry, str):
            names.append(entry.split("=", 1)[0] if "=" in entry else entry)
        elif isinstance(entry, dict):
            names.append(entry.get("lora_name"))
    return names


# Loading and unloading a LoRA adapter at run time: vLLM's routes (served when the engine runs with
# VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; bodies LoadLoRAAdapterRequest {lora_name, lora_path} and
# UnloadLoRAAdapterRequest {lora_name}) and SGLang's (its LoadLoRAAdapterReqInput takes lora_name
# too): True loads, False unloads.
ADAPTER_ROUTES = {
    "/v1/load_lora_adapter": True,
    "/v1/unload_lora_adapter": False,
    "/load_lora_adapter": True,
    "/unload_lora_adapter": False,
}


def adapters_after(
    api: str, path: str, status: int, body: bytes, served_models: tuple[str, ...], adapters: tuple[str, ...]
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The engine's served names and LoRA adapters after it answered ``status`` to ``body`` posted to
    ``path``; None: unchanged (not an adapter route, not a 2xx answer, no ``lora_name`` string in the
    body). A vLLM engine lists its adapters among its ``/v1/models`` ids, so the name joins (leaves)
    its served names too; SGLang's served name stays its model's. The caller bounds the names
    (``records.servable_names``)."""
    load = ADAPTER_ROUTES.get(path)
    if load is None or not 200 <= status < 300:
        return None
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    name = obj.get("lora_name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or not name:
        return None
    if load:
        return ((*served_models, name) if api == VLLM else served_models), (*adapters, name)
    served = tuple(n for n in served_models if n != name) if api == VLLM else served_models
    return served, tuple(a for a in adapters if a != name)


@dataclass(frozen=True, slots=True)
class VllmCache:
    """What ``vllm:cache_config_info`` says of an engine's prefix cache."""

    block_size: int  # tokens per KV block: vLLM caches (and reports cached) whole blocks only
    match_unit: int  # the token boundary a hit lands on: prefix_match_unit where reported, else block_size
    capacity_tokens: int | None  # None: not stated yet (num_gpu_blocks is set after profiling)
    # False: the engine runs with --no-enable-prefix-caching (label enable_prefix_caching="False"),
    # so it never reports a hit: nothing it serves is worth mirroring or routing by
    prefix_caching: bool = True


def _label_int(labels: Mapping[str, str], name: str) -> int | None:
    """A label holding a positive integer (``"16"``); None when absent or ``"None"`` (unset)."""
    raw = labels.get(name)
    if raw is None or raw == "None":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{CACHE_CONFIG_METRIC} label {name}={raw!r:.40} is not an integer") from None
    if value < 1:
        raise ValueError(f"{CACHE_CONFIG_METRIC} label {name}={raw!r:.40} is not positive")
    return value


def vllm_cache_config(metrics_text: str) -> VllmCache:
    """The prefix cache of the vLLM engine whose ``/metrics`` text exposition is ``metrics_text``.

    Capacity in tokens is ``kv_cache_size_tokens`` where the engine states it (newer vLLM: right for
    hybrid models too), else ``block_size * num_gpu_blocks``. A data-parallel server has one series
    per engine (label ``engine``), each engine a cache of its own that a prompt lands in: the
    smallest is the capacity. ``enable_prefix_caching="False"`` (``--no-enable-prefix-caching``):
    no prefix cache at all. ValueError names what is missing or wrong."""
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError as exc:  # the parser's own errors (a malformed line) are ValueErrors
        raise ValueError(f"engine /metrics is not a Prometheus text exposition: {exc}"[:300]) from None
    samples = [s for f in families if f.name == CACHE_CONFIG_METRIC for s in f.samples]
    if not samples:
        raise ValueError(f"engine /metrics has no {CACHE_CONFIG_METRIC} series")
    block_sizes, units, capacities = set(), set(), []
    caching = True
    for sample in samples:
        # str() of a bool, as metrics_info() writes every field; absent (older vLLM): on, its default
        caching = caching and sample.labels.get("enable_prefix_caching") != "False"
        block_size = _label_int(sample.labels, "block_size")
        if block_size is None:
            raise ValueError(f"{CACHE_CONFIG_METRIC} has no block_size label")
        block_sizes.add(block_size)
        units.add(_label_int(sample.labels, "prefix_match_unit") or block_size)
        tokens = _label_int(sample.labels, "kv_cache_size_tokens")
        blocks = _label_int(sample.labels, "num_gpu_blocks")
        if tokens is None and blocks is not None:
            tokens = block_size * blocks
        if tokens is not None:
            capacities.append(tokens)
    if len(block_sizes) > 1 or len(units) > 1:
        disagree = f"block_size {sorted(block_sizes)}, prefix_match_unit {sorted(units)}"
        raise ValueError(f"{CACHE_CONFIG_METRIC} series disagree: {disagree}")
    return VllmCache(block_sizes.pop(), units.pop(), min(capacities) if capacities else None, caching)


def sglang_visible_hit(matched_tokens: int, prompt_tokens: int) -> int:
    """The cached tokens SGLang reports for a prompt of ``prompt_tokens`` of which its radix cache
    holds ``matched_tokens``: to the token, but never the prompt's last token, which it computes for
    the logits (sglang/srt/managers/schedule_batch.py ``Req.init_next_round_input``: the match is of
    the prompt's first ``max_prefix_len = input_len - 1`` tokens), so an exact repeat reports N - 1."""
    return max(min(matched_tokens, prompt_tokens - 1), 0)


def vllm_visible_hit(matched_tokens: int, prompt_tokens: int, match_unit: int) -> int:
    """The cached tokens vLLM reports for a prompt of ``prompt_tokens`` of which its cache holds
    ``matched_tokens``: whole ``match_unit`` blocks only, and never the prompt's last token, which it
    recomputes for the logits (vllm/v1/core/kv_cache_manager.py get_computed_blocks:
    ``max_cache_hit_length = request.num_tokens - 1``), as SGLang."""
    return sglang_visible_hit(matched_tokens, prompt_tokens) // match_unit * match_unit


def engine_visible_hit(api: str, matched_tokens: int, prompt_tokens: int, match_unit: int) -> int:
    """The cached tokens an engine speaking ``api`` reports for a prompt its cache (as mirrored)
    holds ``matched_tokens`` of: what a sidecar predicts, so that its mirror's correction compares
    like with like. An API not known yet is taken as SGLang's (the last-token rule both share)."""
    if api == VLLM:
        return vllm_visible_hit(matched_tokens, prompt_tokens, match_unit)
    return sglang_visible_hit(matched_tokens, prompt_tokens)


def mirror_block_tokens(given: int | None, api: str, match_unit: int | None) -> int:
    """Tokens per hashed block of a sidecar's mirror: ``--block-tokens`` when given; else, in front
    of vLLM, the granularity its cache hits land on (so the summary's blocks are the engine's and a
    gateway's n-block match is the hit vLLM reports); else :data:`DEFAULT_BLOCK_TOKENS`."""
    if given is not None:
        return given
    if api == VLLM and match_unit is not None:
        return match_unit
    return DEFAULT_BLOCK_TOKENS
