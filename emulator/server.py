"""aiohttp web server exposing one :class:`EngineRunner` through SGLang's HTTP API (or vLLM's:
:mod:`.vllm_api`).

In-process use (tests, other components)::

    async with EmulatorServer(EmulatorConfig(time_scale=50)) as server:
        ...  # server.url is "http://127.0.0.1:<free port>"

or ``server = await start_emulator(config, port=0)`` ... ``await server.stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping

from aiohttp import web

from prefixfleet import __version__ as prefixfleet_version
from prefixfleet.router.addresses import base_url
from prefixfleet.router.front import fallback_runner, json_parse_error_connections
from prefixfleet.router.slow_clients import ClientTimeouts

from .auth import api_key_middleware, sglang_guarded
from .config import EmulatorConfig
from .metrics import CONTENT_TYPE, EngineMetrics
from .protocol import (
    BadRequest,
    Call,
    Limits,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    error_body,
    generate_object,
    json_object,
    parse_chat,
    parse_completion,
    parse_generate,
    unix_now,
    usage_chunk,
)
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
from .sglang_options import (
    LoraRef,
    SglangOptions,
    check_adapters,
    registry_keys,
    requested_adapters,
    server_info_loras,
)
from .vllm_api import VllmOptions, build_vllm_app, vllm_engine

log = logging.getLogger("prefixfleet.emulator")

SERVER_INFO_KEY = web.AppKey("server_info", dict)
SGLANG_OPTIONS_KEY = web.AppKey("sglang_options", SglangOptions)
# the adapters loaded now, by name: --lora-paths, then /load_lora_adapter and /unload_lora_adapter
SGLANG_LORAS_KEY = web.AppKey("sglang_lora_adapters", dict)
HEALTH_GENERATE_TIMEOUT_S = 20.0


def _json_error(message: str, param: str | None, status: int, _kind: str | None = None) -> web.Response:
    return web.json_response(error_body(message, param, status), status=status)


def _http_error(exc: web.HTTPException) -> web.Response | None:
    if exc.status >= 400 and exc.content_type != "application/json":
        return _json_error(exc.reason, None, exc.status)
    return None


def _limits(engine: EngineRunner) -> Limits:
    cfg = engine.config
    return Limits(
        max_prompt_tokens=int(cfg.max_prompt_tokens or 0),
        max_new_tokens=cfg.max_new_tokens_limit,
        vocab_size=cfg.vocab_size,
    )


def _with_adapters(request: web.Request, body: object, call: Call, *, openai: bool) -> Call:
    """The call with the LoRA adapter each prompt names, when the engine serves LoRA (else SGLang
    ignores ``lora_path``, and so does the emulator); an adapter not loaded is SGLang's 400."""
    if not request.app[SGLANG_OPTIONS_KEY].enable_lora or not isinstance(body, dict):
        return call
    adapters, param = requested_adapters(body, len(call.prompts), call.batch, openai=openai)
    check_adapters(adapters, list(request.app[SGLANG_LORAS_KEY]), param)
    return call if not any(adapters) else dataclasses.replace(call, adapters=adapters)


# -- SGLang native -------------------------------------------------------------------------------


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    call = _with_adapters(request, body, parse_generate(body, _limits(engine)), openai=False)
    handles = submit(engine, call)
    try:
        if not call.stream:
            snaps = await asyncio.gather(*(h.result() for h in handles))
            objs = [
                generate_object(s, h.text(s.completion_tokens), i if call.batch else None)
                for i, (s, h) in enumerate(zip(snaps, handles, strict=True))
            ]
            return web.json_response(objs if call.batch else objs[0])
        response = await sse_response(request)
        try:
            async for i, snap in merged(handles):
                obj = generate_object(
                    snap, handles[i].text(snap.completion_tokens), i if call.batch else None
                )
                await send(response, obj)
        except EngineStopped as exc:
            await send(response, error_body(str(exc), None, 503))
        await send_done(response)
        return response
    finally:
        abort_unfinished(handles)


async def health(request: web.Request) -> web.Response:
    if not request.app[ENGINE_KEY].running:
        return web.Response(status=503, text="engine not running")
    return web.Response(text="")


async def _finishes(handle: RequestHandle) -> bool:
    try:
        await handle.result()
    except EngineStopped:
        return False
    return True


async def health_generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if not engine.running:
        return web.Response(status=503, text="engine not running")
    # As SGLang: a 1-token probe kept out of the request metrics, and the engine is healthy once its
    # scheduler completes any iteration after this began. A busy engine answers at its next step
    # instead of after the probe's turn in the queue; an idle one runs the probe.
    handle = engine.submit([0], 1, log_metrics=False)
    progressed = asyncio.ensure_future(engine.next_iteration())  # no await since submit: none missed
    finished = asyncio.ensure_future(_finishes(handle))
    try:
        done, _ = await asyncio.wait(
            (progressed, finished), timeout=HEALTH_GENERATE_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
        )
        if progressed not in done and not (finished in done and finished.result()):
            return web.Response(status=503, text="engine did not generate in time")
    finally:
        for task in (progressed, finished):
            task.cancel()
        abort_unfinished([handle])
    return web.Response(text="")


def _server_info_static(cfg: EmulatorConfig, options: SglangOptions) -> dict[str, object]:
    # Field names follow SGLang's server args so tools that read them keep working.
    return {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "served_model_name": cfg.model,
        "revision": cfg.model_revision,
        "max_total_num_tokens": cfg.cache_tokens,
        "chunked_prefill_size": cfg.chunk_tokens,
        "max_prefill_tokens": cfg.chunk_tokens,
        "max_running_requests": cfg.max_running,
        "context_length": int(cfg.max_prompt_tokens or 0) + cfg.max_new_tokens_limit,
        "max_req_input_len": cfg.max_prompt_tokens,
        "page_size": 1,
        "tp_size": 1,
        "dp_size": 1,
        "schedule_policy": "fcfs",
        "disable_radix_cache": False,
        "enable_cache_report": cfg.enable_cache_report,
        "enable_lora": options.enable_lora,
        "lora_paths": server_info_loras(options.lora_paths) if options.lora_paths else None,
        "is_embedding": False,
        "version": f"prefixfleet-emulator-{prefixfleet_version}",
        "prefixfleet_version": prefixfleet_version,
        "engine": "prefixfleet-emulator",
        "emulator": cfg.as_dict(),
    }


async def server_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    stats = engine.stats()
    info = dict(request.app[SERVER_INFO_KEY])
    info["internal_states"] = [
        {
            "last_gen_throughput": stats.gen_throughput,
            "num_running_reqs": stats.num_running,
            "num_queue_reqs": stats.num_waiting,
            "token_usage": stats.token_usage,
            "cache_hit_rate": stats.cache_hit_rate,
            "cached_tokens_in_tree": stats.cached_tokens_in_tree,
        }
    ]
    return web.json_response(info)


async def model_info(request: web.Request) -> web.Response:
    cfg = request.app[ENGINE_KEY].config
    return web.json_response(
        {
            "model_path": cfg.model,
            "tokenizer_path": cfg.model,
            "is_generation": True,
            "served_model_name": cfg.model,
            "weight_version": cfg.model_revision,
            "preferred_sampling_params": None,
        }
    )


async def get_load(request: web.Request) -> web.Response:
    stats = request.app[ENGINE_KEY].stats()
    return web.json_response(
        [
            {
                "dp_rank": 0,
                "num_reqs": stats.num_running + stats.num_waiting,
                "num_running_reqs": stats.num_running,
                "num_waiting_reqs": stats.num_waiting,
                "num_tokens": stats.num_used_tokens,
            }
        ]
    )


async def flush_cache(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.flush():
        return web.Response(text="Cache flushed.\n")
    stats = engine.stats()
    return web.Response(
        status=400,
        text=(
            f"Cache not flushed: {stats.num_running} running and {stats.num_waiting} waiting requests. "
            "Retry when the engine is idle.\n"
        ),
    )


async def metrics(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    engine.refresh_metrics()
    body = engine.metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


# -- OpenAI-compatible ---------------------------------------------------------------------------


def _model_card(name: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, object]:
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "prefixfleet",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
    }


async def list_models(request: web.Request) -> web.Response:
    cfg = request.app[ENGINE_KEY].config
    cards = [
        _model_card(cfg.model, cfg.model, None, int(cfg.max_prompt_tokens or 0) + cfg.max_new_tokens_limit)
    ]
    if request.app[SGLANG_OPTIONS_KEY].enable_lora:  # as SGLang's available_models: each adapter after
        loras: dict[str, LoraRef] = request.app[SGLANG_LORAS_KEY]
        cards += [_model_card(r.name, r.path, cfg.model, None) for r in loras.values()]
    return web.json_response({"object": "list", "data": cards})


async def _object_body(request: web.Request) -> Mapping[str, object]:
    return json_object(await read_json(request))


def _loaded(loras: dict[str, LoraRef]) -> str:
    return f"Loaded LoRAs: {registry_keys(list(loras))}"  # SGLang's words


LORA_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."  # SGLang's words


def _lora_update(success: bool, error: str | None, loras: dict[str, LoraRef]) -> web.Response:
    """SGLang's LoRAUpdateResult: 200 on success, else 400, with the adapters loaded now."""
    loaded = {name: ref.path for name, ref in loras.items()}
    body = {"success": success, "error_message": error, "loaded_adapters": loaded}
    return web.json_response(body, status=200 if success else 400)


async def load_lora_adapter(request: web.Request) -> web.Response:
    """SGLang's POST /load_lora_adapter {lora_name, lora_path, pinned}. No weights are read."""
    body = await _object_body(request)
    name, path, pinned = body.get("lora_name"), body.get("lora_path"), body.get("pinned", False)
    if not (isinstance(name, str) and name and isinstance(path, str) and path):
        raise BadRequest("lora_name and lora_path must be non-empty strings", "lora_name")
    if not isinstance(pinned, bool):
        raise BadRequest("pinned must be true or false", "pinned")
    loras: dict[str, LoraRef] = request.app[SGLANG_LORAS_KEY]
    if not request.app[SGLANG_OPTIONS_KEY].enable_lora:
        return _lora_update(False, LORA_NOT_ENABLED, loras)
    if name in loras:
        return _lora_update(False, f"LoRA with name {name} already exists. {_loaded(loras)}", loras)
    loras[name] = LoraRef(name, path, pinned)
    return _lora_update(True, None, loras)


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """SGLang's POST /unload_lora_adapter {lora_name}. What was cached under it stays cached (loaded
    again under that name, SGLang mints a new id: the emulator keys by name, so those are hits)."""
    name = (await _object_body(request)).get("lora_name")
    if not isinstance(name, str) or not name:
        raise BadRequest("lora_name must be a non-empty string", "lora_name")
    loras: dict[str, LoraRef] = request.app[SGLANG_LORAS_KEY]
    if not request.app[SGLANG_OPTIONS_KEY].enable_lora:
        return _lora_update(False, LORA_NOT_ENABLED, loras)
    if loras.pop(name, None) is None:
        return _lora_update(False, f"LoRA with name {name} does not exist. {_loaded(loras)}", loras)
    return _lora_update(True, None, loras)


async def completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    call = _with_adapters(request, body, parse_completion(body, _limits(engine)), openai=True)
    model, created, report = engine.config.model, unix_now(), engine.config.enable_cache_report
    handles = submit(engine, call)
    response_id = "cmpl-" + handles[0].rid
    try:
        if not call.stream:
            snaps = list(await asyncio.gather(*(h.result() for h in handles)))
            texts = [h.text(s.completion_tokens) for s, h in zip(snaps, handles, strict=True)]
            return web.json_response(
                completion_response(response_id, model, created, snaps, texts, cache_report=report)
            )
        response = await sse_response(request)
        sent = [0] * len(handles)
        finals: dict[int, Snapshot] = {}
        try:
            async for i, snap in merged(handles):
                delta = handles[i].text(snap.completion_tokens, sent[i])  # only the new tokens
                sent[i] = snap.completion_tokens
                if snap.finished:
                    finals[i] = snap
                await send(
                    response, completion_chunk(response_id, model, created, i, delta, snap.finish_reason)
                )
            if call.include_usage:
                ordered = [finals[i] for i in sorted(finals)]
                await send(
                    response,
                    usage_chunk(response_id, model, created, "text_completion", ordered, cache_report=report),
                )
        except EngineStopped as exc:
            await send(response, error_body(str(exc), None, 503))
        await send_done(response)
        return response
    finally:
        abort_unfinished(handles)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    body = await read_json(request)
    call = _with_adapters(request, body, parse_chat(body, _limits(engine)), openai=True)
    model, created, report = engine.config.model, unix_now(), engine.config.enable_cache_report
    handles = submit(engine, call)
    handle = handles[0]
    response_id = "chatcmpl-" + handle.rid
    try:
        if not call.stream:
            snap = await handle.result()
            content = handle.text(snap.completion_tokens)[1:]  # a message has no leading space
            return web.json_response(
                chat_response(response_id, model, created, snap, content, cache_report=report)
            )
        response = await sse_response(request)
        sent = 0
        try:
            async for _, snap in merged(handles):
                delta: dict[str, object] = {"content": handle.text(snap.completion_tokens, sent)}
                if sent == 0:  # the first chunk: a message has no leading space, and names the role
                    delta = {"role": "assistant", "content": str(delta["content"])[1:]}
                sent = snap.completion_tokens
                await send(response, chat_chunk(response_id, model, created, delta, snap.finish_reason))
                if snap.finished and call.include_usage:
                    await send(
                        response,
                        usage_chunk(
                            response_id, model, created, "chat.completion.chunk", [snap], cache_report=report
                        ),
                    )
        except EngineStopped as exc:
            await send(response, error_body(str(exc), None, 503))
        await send_done(response)
        return response
    finally:
        abort_unfinished(handles)


# -- assembly ------------------------------------------------------------------------------------


def build_app(engine: EngineRunner, options: SglangOptions | None = None) -> web.Application:
    options = options or SglangOptions()
    problems = options.problems()
    if problems:
        raise ValueError("; ".join(problems))
    auth = api_key_middleware((options.api_key,), sglang_guarded) if options.api_key else None
    app = make_app(engine, _json_error, _http_error, auth)
    expect = app[EXPECT_KEY]
    app[SERVER_INFO_KEY] = _server_info_static(engine.config, options)
    app[SGLANG_OPTIONS_KEY] = options
    app[SGLANG_LORAS_KEY] = {lora.name: lora for lora in options.lora_paths}
    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health_generate)
    for path in ("/get_server_info", "/server_info"):
        r.add_get(path, server_info)
    for path in ("/get_model_info", "/model_info"):
        r.add_get(path, model_info)
    r.add_get("/get_load", get_load)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/models", list_models)
    r.add_post("/generate", generate, expect_handler=expect)
    r.add_post("/v1/completions", completions, expect_handler=expect)
    r.add_post("/v1/chat/completions", chat_completions, expect_handler=expect)
    r.add_route("GET", "/flush_cache", flush_cache)
    r.add_route("POST", "/flush_cache", flush_cache, expect_handler=expect)
    r.add_post("/load_lora_adapter", load_lora_adapter, expect_handler=expect)
    r.add_post("/unload_lora_adapter", unload_lora_adapter, expect_handler=expect)
    return app


class EmulatorServer:
    """One emulated engine serving HTTP; ``port=0`` picks a free port (see :attr:`url`).

    ``vllm``: serve vLLM's API (:mod:`.vllm_api`) with these options instead of SGLang's; ``sglang``:
    the SGLang face's options (LoRA adapters, API key)."""

    def __init__(
        self,
        config: EmulatorConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        vllm: VllmOptions | None = None,
        sglang: SglangOptions | None = None,
    ) -> None:
        self.config = config
        self.host = host
        self.port = port
        if vllm is not None and sglang is not None:
            raise ValueError("an emulator serves one API: give vllm or sglang options, not both")
        self.vllm = vllm
        self.sglang = sglang or SglangOptions()
        if vllm is None:
            self.engine = EngineRunner(config, EngineMetrics(config.model))
        else:
            self.engine = vllm_engine(config, vllm)
        self._runner: web.AppRunner | None = None
        self._listening: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return base_url(self.host, self.port)

    async def start(self) -> EmulatorServer:
        await self.engine.start()
        runner: web.AppRunner | None = None
        # whatever fails from here (the client limits' environment, the socket) stops the engine
        try:
            # engine.stop() ends streaming handlers first, so cleanup need not wait aiohttp's 60 s
            app = (
                build_app(self.engine, self.sglang)
                if self.vllm is None
                else build_vllm_app(self.engine, self.vllm)
            )
            runner = await fallback_runner(app, ClientTimeouts.from_env(), shutdown_timeout_s=5.0)
            # each connection answers a request aiohttp's parser refuses (a br or zstd body: 415; a
            # malformed head: 400) in JSON with one log line, as the gateway's and sidecar's do,
            # not in plain text with an ERROR traceback
            listening = await asyncio.get_running_loop().create_server(
                json_parse_error_connections(runner),
                self.host,
                self.port,
                reuse_address=True,
                backlog=128,  # as aiohttp's TCPSite listened before (asyncio's default is 100)
            )
        except BaseException:
            if runner is not None:
                await runner.cleanup()
            await self.engine.stop()
            raise
        self._runner, self._listening = runner, listening
        self.port = int(listening.sockets[0].getsockname()[1])
        log.info("emulator %s serving on %s", self.config.model, self.url)
        return self

    async def stop(self) -> None:
        await self.engine.stop()  # fails in-flight requests so streaming handlers end promptly
        listening, self._listening = self._listening, None
        if listening is not None:
            listening.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()

    async def __aenter__(self) -> EmulatorServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def start_emulator(
    config: EmulatorConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    vllm: VllmOptions | None = None,
    sglang: SglangOptions | None = None,
) -> EmulatorServer:
    """Start an emulator in this event loop; stop it with ``await server.stop()``."""
    return await EmulatorServer(config, host, port, vllm, sglang).start()
