"""The emulator's vLLM face: vLLM's OpenAI-compatible server's HTTP interface over the same engine.

Same engine model underneath as the SGLang face (timing, radix cache, batching); what differs is the
API — routes, validation, response and error shapes, ``vllm:*`` metrics — and the granularity of
cache hits: vLLM's prefix cache hits whole blocks of ``--block-size`` tokens (default 16) and never
the whole prompt (a full hit recomputes the last token, so at most ``floor((n - 1) / B) * B``).

Routes (vLLM's, see docs/emulator.md "vLLM mode" for the source files checked): GET /health,
/version, /v1/models, /metrics; POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize;
POST /reset_prefix_cache only in dev mode (vLLM registers it when VLLM_SERVER_DEV_MODE=1). No SGLang
route: /generate, /get_server_info, /get_model_info, /flush_cache answer 404 as FastAPI does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from prefixfleet import __version__ as prefixfleet_version
from prefixfleet.tokenizer import tokenize

from .auth import api_key_middleware, vllm_guarded
from .config import EmulatorConfig
from .metrics import CONTENT_TYPE
from .protocol import BadRequest, Call, unix_now
from .runner import EngineRunner, EngineStopped, RequestHandle, Snapshot
from .serving import (
    ENGINE_KEY,
    EXPECT_KEY,
    abort_unfinished,
    make_app,
    merged,
    read_json,
    send,
    send_done,
    sse_response,
    submit,
)
from .text import VOCABULARY
from .vllm_metrics import VllmMetrics
from .vllm_protocol import (
    VOCAB_SIZE,
    ChatBody,
    CompletionBody,
    DetokenizeBody,
    Limits,
    LoraModule,
    SamplingBody,
    TokenizeBody,
    VllmBadRequest,
    chat_call,
    chat_chunk,
    chat_prompt,
    chat_response,
    check_model,
    completion_call,
    completion_chunk,
    completion_response,
    continuous_usage,
    error_body,
    model_list,
    request_id,
    running_usage,
    usage_chunk,
    usage_object,
    validated,
)

log = logging.getLogger("prefixfleet.emulator")

DEFAULT_BLOCK_SIZE = 16  # vLLM's CacheConfig.DEFAULT_BLOCK_SIZE
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
MAX_KNOWN_WORDS = 1_000_000  # /detokenize's memory of words seen by /tokenize


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """What the vLLM face adds to an EmulatorConfig: vLLM's own flags and environment."""

    block_size: int = DEFAULT_BLOCK_SIZE  # --block-size: cache hits count whole blocks of this many tokens
    enable_prompt_tokens_details: bool = False  # --enable-prompt-tokens-details
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: /reset_prefix_cache exists
    enable_lora: bool = False  # --enable-lora
    lora_modules: tuple[LoraModule, ...] = ()  # --lora-modules: adapters loaded at start
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING: /v1/load_lora_adapter and /v1/unload_lora_adapter exist
    runtime_lora_updating: bool = False
    # --api-key: /v1/* need one of them as a bearer token; kept out of repr (so out of logs)
    api_keys: tuple[str, ...] = field(default=(), repr=False)

    def problems(self, config: EmulatorConfig) -> list[str]:
        out: list[str] = []
        if self.lora_modules and not self.enable_lora:
            out.append("--lora-modules needs --enable-lora (without it the engine loads no adapter)")
        names = [lora.name for lora in self.lora_modules]
        if len(set(names)) != len(names):
            out.append(f"--lora-modules names an adapter twice: {names}")
        if config.model in names:
            out.append(f"--lora-modules: adapter name {config.model!r} is also the name the engine serves")
        size = self.block_size
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            return [f"block_size must be a positive integer, got {size!r}"]
        if config.cache_tokens % size:
            # vLLM's KV pool is num_gpu_blocks whole blocks: capacity = block_size * num_gpu_blocks
            out.append(
                f"cache_tokens ({config.cache_tokens}) must be a multiple of block_size ({size}): the KV "
                f"pool is num_gpu_blocks whole blocks"
            )
        return out

    def num_gpu_blocks(self, config: EmulatorConfig) -> int:
        """vLLM's num_gpu_blocks for the emulator's pool: --cache-tokens / --block-size, exactly."""
        return config.cache_tokens // self.block_size


def max_model_len(config: EmulatorConfig) -> int:
    """The context this engine serves: the emulator's prompt and output limits, never beyond the KV
    pool (vLLM refuses to start with a max_model_len its KV cache cannot hold)."""
    return min(int(config.max_prompt_tokens or 0) + config.max_new_tokens_limit, config.cache_tokens)


def vllm_engine(config: EmulatorConfig, options: VllmOptions) -> EngineRunner:
    """The engine behind the vLLM face: block-granular cache hits, vllm:* metrics."""
    problems = options.problems(config)
    if problems:
        raise ValueError("; ".join(problems))
    metrics = VllmMetrics(config.model, options.block_size, options.num_gpu_blocks(config))
    return EngineRunner(config, metrics, block_size=options.block_size)


OPTIONS_KEY = web.AppKey("vllm_options", VllmOptions)
WORDS_KEY = web.AppKey("known_words", dict)
# the adapters loaded now, by name: --lora-modules, then runtime loads and unloads
LORAS_KEY = web.AppKey("lora_adapters", dict)


def _loras(request: web.Request) -> tuple[LoraModule, ...]:
    return tuple(request.app[LORAS_KEY].values())


def _limits(config: EmulatorConfig) -> Limits:
    vocab = config.vocab_size if config.vocab_size is not None else VOCAB_SIZE
    prompt_tokens = int(config.max_prompt_tokens or 0)
    return Limits(max_model_len(config), prompt_tokens, config.max_new_tokens_limit, vocab)


# -- errors ------------------------------------------------------------------------------------


def _json_error(message: str, param: str | None, status: int, kind: str | None = None) -> web.Response:
    return web.json_response(error_body(message, param, status, kind), status=status)


def _http_error(exc: web.HTTPException) -> web.Response | None:
    if exc.status in (404, 405):  # FastAPI's answer to an unknown route or method
        return web.json_response({"detail": exc.reason}, status=exc.status)
    if exc.status >= 400 and exc.content_type != "application/json":
        return _json_error(exc.reason, None, exc.status)
    return None


async def _body(request: web.Request, model: type[Any]) -> Any:
    """The request's JSON body as vLLM's request model takes it. Like vLLM's validate_json_request
    dependency, a body that is not declared application/json is refused."""
    media_type = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise VllmBadRequest(
            "Unsupported Media Type: Only 'application/json' is allowed", None, 400, "Bad Request"
        )
    try:
        raw = await read_json(request)
    except BadRequest as exc:  # JSON vLLM cannot decode: FastAPI's validation error
        raise VllmBadRequest(exc.message, None, 400, "Bad Request") from None
    return validated(model, raw)


# -- info routes -------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[ENGINE_KEY].running else 503)


async def version(_request: web.Request) -> web.Response:
    return web.json_response({"version": f"prefixfleet-emulator-{prefixfleet_version}"})


async def models(request: web.Request) -> web.Response:
    cfg = request.app[ENGINE_KEY].config
    return web.json_response(
        model_list(cfg.model, cfg.model, max_model_len(cfg), unix_now(), _loras(request))
    )


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    engine.refresh_metrics()
    return web.Response(body=engine.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    # vLLM answers 200 whether or not the reset happened (its scheduler refuses while blocks are in
    # use and only logs it: "we currently do not check if the prefix cache is successfully reset")
    if not request.app[ENGINE_KEY].flush():
        log.warning("prefix cache not reset: requests are running or waiting")
    return web.Response(status=200)


async def _lora_body(request: web.Request) -> dict[str, Any]:
    try:
        obj = json.loads(await request.read())
    except (ValueError, RecursionError):
        raise VllmBadRequest("the body is not a JSON object", None) from None
    if not isinstance(obj, dict):
        raise VllmBadRequest("the body is not a JSON object", None)
    return obj


async def load_lora_adapter(request: web.Request) -> web.Response:
    """vLLM's POST /v1/load_lora_adapter (OpenAIServingModels.load_lora_adapter and its checks)."""
    body = await _lora_body(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise VllmBadRequest("Both 'lora_name' and 'lora_path' must be provided.", None)
    if not request.app[OPTIONS_KEY].enable_lora:
        raise VllmBadRequest("LoRA is not enabled: the engine runs without --enable-lora", None)
    loras = request.app[LORAS_KEY]
    if name in loras:
        raise VllmBadRequest(f"The lora adapter '{name}' has already been loaded.", None)
    loras[name] = LoraModule(name, path)
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """vLLM's POST /v1/unload_lora_adapter. What was cached under the adapter stays cached (vLLM's
    block hashes keep its name: loaded again under that name, its blocks are hits again)."""
    name = (await _lora_body(request)).get("lora_name")
    if not isinstance(name, str) or not name:
        raise VllmBadRequest("'lora_name' needs to be provided to unload a LoRA adapter.", None)
    if request.app[LORAS_KEY].pop(name, None) is None:
        raise VllmBadRequest(f"The lora adapter '{name}' cannot be found.", None, 404)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


# -- tokenizer routes --------------------------------------------------------------------------


def _remember(words: dict[int, str], text: str, ids: list[int]) -> list[str]:
    pieces = text.split()
    for t, w in zip(ids, pieces, strict=True):
        if len(words) < MAX_KNOWN_WORDS:
            words.setdefault(t, w)
    return pieces


async def tokenize_route(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request, TokenizeBody)
    check_model(body.model, engine.config.model, _loras(request))
    if body.prompt is not None:
        ids = list(tokenize(body.prompt))
        pieces = _remember(request.app[WORDS_KEY], body.prompt, ids)
    else:
        ids = list(chat_prompt(body.messages or []))
        pieces = None
    answer = {
        "count": len(ids),
        "max_model_len": max_model_len(engine.config),
        "tokens": ids,
        "token_strs": pieces if body.return_token_strs and pieces is not None else None,
    }
    return web.json_response(answer)


async def detokenize_route(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await _body(request, DetokenizeBody)
    check_model(body.model, engine.config.model, _loras(request))
    words = request.app[WORDS_KEY]
    for t in body.tokens:
        if not 0 <= t < VOCAB_SIZE:
            raise VllmBadRequest(f"Token id {t} is out of vocabulary", "tokens")
    # the shared tokenizer's ids are hashes: words this engine has seen come back as they were,
    # others as the stand-in words prefixfleet.tokenizer.text_for_tokens uses
    return web.json_response({"prompt": " ".join(words.get(t, f"t{t:x}") for t in body.tokens)})


# -- generation routes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Answer:
    """What a generation handler needs besides the call: names, and how usage is reported."""

    rid: str
    model: str
    created: int
    details: bool  # --enable-prompt-tokens-details
    continuous: bool  # stream_options.continuous_usage_stats: usage so far on every chunk

    async def send(
        self, response: web.StreamResponse, chunk: dict[str, object], prompt: int, done: int
    ) -> None:
        """A streamed chunk, with the usage so far when the request asked for it continuously."""
        if self.continuous:
            chunk["usage"] = running_usage(prompt, done)
        await send(response, chunk)


async def _prepared(
    request: web.Request, model: type[SamplingBody], build: Any, prefix: str
) -> tuple[Call, list[RequestHandle], _Answer]:
    engine = request.app[ENGINE_KEY]
    body = await _body(request, model)
    options = request.app[OPTIONS_KEY]
    adapter = check_model(body.model, engine.config.model, _loras(request))
    call = build(body, _limits(engine.config))
    if adapter is not None:  # cached under the adapter; the answer names it, as vLLM's does
        call = dataclasses.replace(call, adapter=adapter)
    details = options.enable_prompt_tokens_details
    answer = _Answer(
        request_id(prefix), adapter or engine.config.model, unix_now(), details, continuous_usage(body)
    )
    return call, submit(engine, call), answer


async def completions(request: web.Request) -> web.StreamResponse:
    call, handles, a = await _prepared(request, CompletionBody, completion_call, "cmpl")
    try:
        if not call.stream:
            snaps = list(await asyncio.gather(*(h.result() for h in handles)))
            texts = [h.text(s.completion_tokens) for s, h in zip(snaps, handles, strict=True)]
            # vLLM reports the last prompt's cached tokens for the whole answer
            usage = usage_object(snaps, snaps[-1].cached_tokens, details=a.details)
            return web.json_response(completion_response(a.rid, a.model, a.created, snaps, texts, usage))
        response = await sse_response(request)
        sent = [0] * len(handles)

        async def chunks(i: int, snap: Snapshot) -> None:
            delta = handles[i].text(snap.completion_tokens, sent[i])
            sent[i] = snap.completion_tokens
            chunk = completion_chunk(a.rid, a.model, a.created, i, delta, snap.finish_reason)
            await a.send(response, chunk, snap.prompt_tokens, snap.completion_tokens)

        await _stream(response, call, handles, a, "text_completion", chunks)
        return response
    finally:
        abort_unfinished(handles)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    call, handles, a = await _prepared(request, ChatBody, chat_call, "chatcmpl")
    handle = handles[0]
    try:
        if not call.stream:
            snap = await handle.result()
            content = handle.text(snap.completion_tokens)[1:]  # a message has no leading space
            usage = usage_object([snap], snap.cached_tokens, details=a.details)
            return web.json_response(chat_response(a.rid, a.model, a.created, snap, content, usage))
        response = await sse_response(request)
        sent = [0]

        async def chunks(_i: int, snap: Snapshot) -> None:
            text = handle.text(snap.completion_tokens, sent[0])
            if sent[0] == 0:  # vLLM's first event names the role with empty content; no leading space
                role = chat_chunk(a.rid, a.model, a.created, {"role": "assistant", "content": ""}, None)
                await a.send(response, role, snap.prompt_tokens, 0)
                text = text[1:]
            sent[0] = snap.completion_tokens
            chunk = chat_chunk(a.rid, a.model, a.created, {"content": text}, snap.finish_reason)
            await a.send(response, chunk, snap.prompt_tokens, snap.completion_tokens)

        await _stream(response, call, handles, a, "chat.completion.chunk", chunks)
        return response
    finally:
        abort_unfinished(handles)


async def _stream(
    response: web.StreamResponse, call: Call, handles: list[RequestHandle], a: _Answer, obj: str, chunks: Any
) -> None:
    """Stream every update through ``chunks``; then, when asked (stream_options.include_usage), the
    usage event with no choices; then ``data: [DONE]``. An engine stop is an error event in vLLM's
    shape before [DONE], as vLLM's stream generators answer their exceptions."""
    finals: dict[int, Snapshot] = {}
    first_cached: int | None = None
    try:
        async for i, snap in merged(handles):
            if first_cached is None:  # vLLM's streams report the first output's cached tokens
                first_cached = snap.cached_tokens
            if snap.finished:
                finals[i] = snap
            await chunks(i, snap)
        if call.include_usage:
            ordered = [finals[i] for i in sorted(finals)]
            usage = usage_object(ordered, first_cached, details=a.details)
            await send(response, usage_chunk(a.rid, obj, a.model, a.created, usage))
    except EngineStopped as exc:
        await send(response, error_body(str(exc), None, 503))
    await send_done(response)


# -- assembly ----------------------------------------------------------------------------------


def build_vllm_app(engine: EngineRunner, options: VllmOptions) -> web.Application:
    auth = api_key_middleware(options.api_keys, vllm_guarded) if options.api_keys else None
    app = make_app(engine, _json_error, _http_error, auth)
    expect = app[EXPECT_KEY]
    app[OPTIONS_KEY] = options
    app[LORAS_KEY] = {lora.name: lora for lora in options.lora_modules}
    app[WORDS_KEY] = {tokenize(w)[0]: w for w in VOCABULARY}  # generated text detokenizes as it was
    r = app.router
    r.add_get("/health", health)
    r.add_get("/version", version)
    r.add_get("/v1/models", models)
    r.add_get("/metrics", metrics)
    r.add_post("/v1/completions", completions, expect_handler=expect)
    r.add_post("/v1/chat/completions", chat_completions, expect_handler=expect)
    r.add_post("/tokenize", tokenize_route, expect_handler=expect)
    r.add_post("/detokenize", detokenize_route, expect_handler=expect)
    if options.runtime_lora_updating:
        r.add_post("/v1/load_lora_adapter", load_lora_adapter, expect_handler=expect)
        r.add_post("/v1/unload_lora_adapter", unload_lora_adapter, expect_handler=expect)
    if options.dev_mode:
        r.add_post("/reset_prefix_cache", reset_prefix_cache, expect_handler=expect)
    return app
