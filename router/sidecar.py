"""The sidecar: a reverse proxy in front of one engine that publishes what the engine has cached.

Every path is forwarded to the engine. Generation requests are also tokenized, mirrored into the
worker's prefix tree (:class:`~.mirror.CacheMirror`) and tracked for load (:class:`~.loadtrack.LoadTracker`);
their responses stream through chunk by chunk. A publisher task writes the load record every
interval and the summary whenever the tree changed, and keeps the member record registered. Redis
being down never stops proxying: publishing backs off and one warning is logged per outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST

from prefixfleet.cancellation import cancel_and_wait
from prefixfleet.tokenizer import tokenize

from .addresses import base_url, bracket_ipv6_url
from .blockhash import CacheIdentity
from .control import (
    CONTROL_HEADER,
    CONTROL_ROUTES,
    CONTROL_TOKEN_ENV,
    ControlTokenSource,
    Verdict,
    control_headers,
    fleet_control_token,
)
from .engine_api import (
    ADAPTER_ROUTES,
    AUTO,
    VLLM,
    VLLM_FLUSH_BUSY,
    VLLM_FLUSH_PATH,
    VLLM_FLUSH_UNAVAILABLE,
    Probe,
    adapters_after,
    engine_visible_hit,
    is_sglang_info,
    mirror_block_tokens,
    pick_engine_api,
    sglang_adapter_names,
    vllm_adapter_ids,
    vllm_cache_config,
    vllm_model_ids,
    vllm_resets_running,
    vllm_served_model,
)
from .engine_routes import engine_route_is_open, refused_route_label
from .exemplars import DEFAULT_EXEMPLAR_BYTES, ExemplarStore
from .front import ClientStalled, FrontServing, serving_front
from .keys import DEFAULT_FLEET, FleetKeys, deregister_worker
from .loadtrack import DEFAULT_PREFILL_TOKENS_PER_S, LoadTracker
from .mirror import Admission, CacheMirror, namespace_adapter, namespace_salt
from .policies.base import RATE_WINDOW_S, DecayedRate
from .prewarm import SIDECAR_KEY
from .prewarm import add_routes as add_prewarm_routes
from .proxying import (
    RETRYABLE_HEADER,
    Answer,
    AnyRequest,
    StreamedText,
    after_echo,
    answer_headers,
    answer_now,
    answer_uncached_tokens,
    bad_request,
    body_guards,
    echoed_prompt,
    failure_text,
    find_cached_tokens,
    find_uncached_tokens,
    forward_header_pairs,
    is_error_event,
    json_error,
    json_route_errors,
    open_stream,
    output_text,
    read_json_object,
    request_target,
    sse_error_event,
    stream_writer,
    whole_events,
)
from .radix import CacheFullError, as_token_bytes
from .records import (
    MAX_RECORD_INT,
    EngineRecord,
    LoadReport,
    MemberRecord,
    encode_load_push,
    encode_record,
    servable_names,
    validate_state,
    validate_worker_id,
)
from .redis_conn import connect_redis, redis_error_text
from .requests import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_PROMPT_TOKENS,
    GENERATE_PATHS,
    BadRequest,
    InferenceRequest,
    parse_inference_request,
)
from .sidecar_metrics import exposition, fetch_engine_metrics, sidecar_registry
from .slow_clients import ClientTimeouts
from .summary import DEFAULT_MAX_BLOCKS, encode_summary
from .upstream import (
    RECEIVED_MARK,
    Exchange,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    reached_upstream,
    read_timeout_from_env,
    split_url,
)

log = logging.getLogger("prefixfleet.sidecar")
# an OpenAI stream's usage event: `"choices": []` (a content chunk names at least one choice)
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
# The engine's API key (vLLM --api-key / VLLM_API_KEY, SGLang --api-key), for the requests the sidecar
# itself sends its engine. An environment variable, never a flag: a flag shows in `ps` and the pod spec.
ENGINE_API_KEY_ENV = "PREFIXFLEET_ENGINE_API_KEY"
DEFAULT_CACHE_TOKENS = 200_000  # used until the engine reports its capacity


def engine_failure(what: str, exc: BaseException) -> web.Response:
    """The answer to an engine failure before the answer began. Never reached (refused, DNS,
    connect timeout): a 502 the gateway re-sends anywhere. Reached (the engine took the request and
    broke off, perhaps dying of it): a 502 marked :data:`RECEIVED_MARK`, which a gateway re-sends
    only within its bound, as the same prompt may take the next engine down. Silent past the
    read-idle limit: 504, not re-sent (a hung engine would be joined by the next)."""
    if isinstance(exc, UpstreamTimeout):
        return json_error(504, f"{what}: {exc}", kind="timeout")
    if not reached_upstream(exc):
        return json_error(502, f"{what}: {failure_text(exc)}", kind="engine_unavailable", retryable=True)
    response = json_error(502, f"{what}: {failure_text(exc)}", kind="engine_unavailable")
    response.headers[RETRYABLE_HEADER] = RECEIVED_MARK
    return response


def _body_error(_request: AnyRequest, status: int, message: str) -> web.Response:
    return json_error(status, message, param="body")


@dataclass(frozen=True, slots=True)
class SidecarConfig:
    engine_url: str
    redis_url: str | None
    port: int
    host: str = "127.0.0.1"
    worker_id: str = ""
    advertise_url: str = ""
    fleet: str = DEFAULT_FLEET
    publish_interval_s: float = 0.25
    # None: DEFAULT_BLOCK_TOKENS, or a vLLM engine's hit granularity (its block_size), which it reports
    block_tokens: int | None = None
    # None: ask the engine (SGLang: /get_server_info max_total_num_tokens; vLLM: vllm:cache_config_info)
    cache_tokens: int | None = None
    engine_api: str = AUTO  # auto: detected at each engine start (engine_api.pick_engine_api)
    self_register: bool = True
    model: str | None = None  # None: ask the engine
    revision: str | None = None
    adapter: str = ""
    max_summary_blocks: int = DEFAULT_MAX_BLOCKS
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    prefill_tokens_per_s: float | None = None  # None: the engine's own figure if it reports one
    push_load: bool = True  # also PUBLISH each load change on the fleet's loads channel
    # coalesce load pushes: at most one per this gap. 50 ms, not 20: each push costs ~0.14 ms in the
    # sidecar and ~0.08 ms in every gateway, and gateways learn each other's sends on the sends
    # channel anyway (bench-overhead: -56 µs sidecar, -51 µs gateway CPU per request; up queue_aware
    # hit rate 83.2% vs 82.5% over 3 runs each)
    push_min_interval_s: float = 0.05
    record_ttl_s: float = 10.0  # load/summary keys expire this long after the last publish
    client_write_timeout_s: float | None = None  # None: PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S, else 60 s
    # recent requests kept for pre-warming other replicas (router.exemplars); 0 keeps none
    warm_exemplar_bytes: int = DEFAULT_EXEMPLAR_BYTES
    # None: PREFIXFLEET_ENGINE_API_KEY (unset or empty: no key); kept out of repr, so out of logs
    engine_api_key: str | None = field(default=None, repr=False)
    # Standalone (no redis_url) only: the token its control routes need; None: PREFIXFLEET_CONTROL_TOKEN,
    # and unset or empty, they are open. With Redis the fleet's token is used (router.control).
    control_token: str | None = field(default=None, repr=False)

    def resolved_worker_id(self) -> str:
        wid = self.worker_id or f"{socket.gethostname().split('.')[0]}-{self.port}"
        return validate_worker_id(wid)

    def resolved_advertise_url(self) -> str:
        if self.advertise_url:
            # the pod spec's http://$(POD_IP):<port> on an IPv6 cluster has the address unbracketed
            return bracket_ipv6_url(self.advertise_url.rstrip("/"))
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname()
        return base_url(host, self.port)


def header_safe(secret: str, name: str, sent_as: str) -> str:
    """``secret`` when an HTTP header can carry it as it is; else a ValueError naming ``name`` (the
    variable it came from): whitespace, a control or a non-ASCII character, e.g. a Secret written
    with its trailing newline, refused at start rather than sent mangled or not at all."""
    if not all("!" <= c <= "~" for c in secret):
        raise ValueError(
            f"{name} must be printable ASCII without spaces (it is sent as '{sent_as}'); it has "
            "whitespace, a control or a non-ASCII character (a Secret created from a file keeps "
            "the file's trailing newline)"
        )
    return secret


def engine_auth(key: str | None) -> dict[str, str]:
    """The headers that carry the sidecar's engine API key (none without one; a key no header can
    carry is refused: :func:`header_safe`)."""
    if not key:
        return {}
    header_safe(key, ENGINE_API_KEY_ENV, "Authorization: Bearer <key>")
    return {"Authorization": f"Bearer {key}"}


def control_source(
    config: SidecarConfig, environ: Mapping[str, str], read: Callable[[], Awaitable[str]] | None = None
) -> ControlTokenSource | None:
    """What the sidecar checks control requests against: with Redis, the fleet's token, read by
    ``read`` (:meth:`Sidecar.read_control_token`); standalone, ``config.control_token`` or
    :data:`~.control.CONTROL_TOKEN_ENV`; None (open) for a standalone sidecar given neither."""
    if config.redis_url:
        return ControlTokenSource(read=read, describe_error=redis_error_text)
    token = config.control_token if config.control_token is not None else environ.get(CONTROL_TOKEN_ENV)
    if not token:
        return None
    return ControlTokenSource(token=header_safe(token, CONTROL_TOKEN_ENV, f"{CONTROL_HEADER}: <token>"))


@dataclass(frozen=True, slots=True)
class EmulatedSpeed:
    """What an emulator states about its speed, in wall-clock units (None: not stated or refused)."""

    prefill_tokens_per_s: float | None = None
    fixed_latency_s: float | None = None  # a prefill pass plus a decode step
    problems: tuple[str, ...] = ()  # the figures refused, named


def _finite(value: object) -> float | None:
    """A JSON number as a finite float; None for anything else (bools, NaN, 1e400 read as infinity,
    integers too wide for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def emulated_speed(emulated: dict[str, object]) -> EmulatedSpeed:
    """The emulator block of an engine's ``/get_server_info``: its modelled prefill speed and fixed
    costs, divided by its time scale. Figures stated but unusable (not a finite number, or not
    positive; or a product or quotient that is not) are named in ``problems`` and not used."""
    problems: list[str] = []
    figures: dict[str, float] = {}
    for name, positive in (
        ("prefill_tokens_per_s", True),
        ("time_scale", True),
        ("prefill_overhead_s", False),
        ("decode_step_s", False),
    ):
        raw = emulated.get(name)
        if raw is None:
            continue
        number = _finite(raw)
        if number is None or number < 0 or (positive and number == 0):
            wanted = "positive" if positive else "non-negative"
            problems.append(f"{name} {raw!r:.40} is not a finite {wanted} number")
        else:
            figures[name] = number
    rate = fixed = None
    scale = figures.get("time_scale")
    if scale is not None and "prefill_tokens_per_s" in figures:
        rate = figures["prefill_tokens_per_s"] * scale
        if not (math.isfinite(rate) and rate > 0 and math.isfinite(1.0 / rate)):
            problems.append(f"prefill_tokens_per_s × time_scale = {rate!r} is no usable rate")
            rate = None
    if scale is not None and "prefill_overhead_s" in figures and "decode_step_s" in figures:
        fixed = (figures["prefill_overhead_s"] + figures["decode_step_s"]) / scale
        if not math.isfinite(fixed):
            problems.append(f"(prefill_overhead_s + decode_step_s) / time_scale = {fixed!r} is not finite")
            fixed = None
    return EmulatedSpeed(rate, fixed, tuple(problems))


@dataclass(slots=True)
class _EngineInfo:
    model: str = ""
    revision: str = ""
    capacity_tokens: int | None = None
    known: bool = False
    # Its server info says enable_cache_report (SGLang's flag, the emulator's): an OpenAI usage
    # report without prompt_tokens_details then means 0 cached tokens, not "not reported". vLLM
    # states no such flag, and most of its releases leave a 0 out even with
    # --enable-prompt-tokens-details: its first answer that has the details says the flag is on.
    cache_report: bool = False
    api: str = ""  # sglang or vllm once known (--engine-api, or detected)
    served_model: str = ""  # vLLM: /v1/models data[0].id, the name its requests' "model" must give
    served_models: tuple[str, ...] = ()  # every name it answers to, for the member record
    adapters: tuple[str, ...] = ()  # the LoRA adapters it has loaded (blockhash.request_identity)
    match_unit: int | None = None  # vLLM: the token boundary its cache hits land on (block_size)
    # False: the engine keeps no prefix cache (vLLM --no-enable-prefix-caching, SGLang
    # --disable-radix-cache): the mirror stays empty, so no hit is predicted or published
    prefix_caching: bool = True


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What an engine states about itself, whichever API it speaks."""

    model: str
    revision: str
    capacity_tokens: object = None  # as stated: checked before use
    cache_report: bool = False
    emulator: object = None  # the emulator block of SGLang's server info
    served_model: str = ""
    match_unit: int | None = None
    prefix_caching: bool = True
    served_models: tuple[str, ...] = ()  # the names clients may give as "model" (not --model)
    adapters: tuple[str, ...] = ()  # its LoRA adapters' names


def sglang_facts(info: dict[str, object], model: str | None, revision: str | None) -> EngineFacts:
    """An SGLang engine's ``/get_server_info`` merged with its ``/get_model_info``; ``model`` and
    ``revision`` given on the command line win."""
    return EngineFacts(
        model=model or str(info.get("served_model_name") or info.get("model_path") or ""),
        revision=revision or str(info.get("revision") or info.get("model_revision") or ""),
        capacity_tokens=info.get("max_total_num_tokens"),
        cache_report=info.get("enable_cache_report") is True,
        emulator=info.get("emulator"),
        # SGLang's server args: --disable-radix-cache turns its prefix cache off
        prefix_caching=info.get("disable_radix_cache") is not True,
        # what the engine calls itself, whatever --model names the cache
        served_models=servable_names([info.get("served_model_name") or info.get("model_path")]),
        adapters=servable_names(sglang_adapter_names(info.get("lora_paths"))),
    )


class _LinkedEvent(asyncio.Event):
    """An event whose ``set()`` also sets another: the publish loop then waits on one event for
    either reason (a load change or a state change) without a task per wait."""

    def __init__(self, also: asyncio.Event) -> None:
        super().__init__()
        self._also = also

    def set(self) -> None:
        super().set()
        self._also.set()


@dataclass(slots=True)
class SidecarState:
    """Mutable state of one running sidecar (owned by its app; no module globals)."""

    config: SidecarConfig
    worker_id: str
    url: str
    mirror: CacheMirror
    load: LoadTracker
    exemplars: ExemplarStore
    state: str = "ready"
    engine_ok: bool = False
    engine: _EngineInfo = field(default_factory=_EngineInfo)
    summary_version: int = 0
    published_changes: int = -1
    pushed_load: tuple[object, ...] | None = None  # the queue figures of the last load record written
    load_seq: int = 0
    next_summary_at: float = 0.0  # monotonic: earliest next summary rebuild
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # any reason to publish (load or state)
    engine_was_down: bool = False  # it refused a connection since it last answered
    redis_ok: bool = True
    # control requests refused 401, by route (router.control.CONTROL_ROUTES, or a known engine admin
    # path, or "other": bounded, never a client's made-up path)
    control_refused: dict[str, int] = field(default_factory=dict)
    state_changed: asyncio.Event = field(init=False)
    # The member record must be written again now, though the state did not change (the engine's
    # LoRA adapters did): the next round registers, and publishes no state notice.
    record_changed: bool = False
    # Every generation request the worker got (whatever gateway sent it) and the uncached tokens it
    # wrote to the cache, as decayed rates on the monotonic clock: published in the load record,
    # where each gateway's queue_aware reads the whole fleet's traffic instead of its own share.
    arrivals: DecayedRate = field(default_factory=DecayedRate)
    writes: DecayedRate = field(default_factory=DecayedRate)

    def __post_init__(self) -> None:
        self.state_changed = _LinkedEvent(self.wake)


class Sidecar:
    """Owns the sidecar's state, its HTTP session to the engine and its Redis client."""

    def __init__(self, config: SidecarConfig) -> None:
        self.config = config
        capacity = config.cache_tokens or DEFAULT_CACHE_TOKENS
        identity = CacheIdentity(config.model or "", config.revision or "", config.adapter)
        block_tokens = mirror_block_tokens(config.block_tokens, config.engine_api, None)
        self.s = SidecarState(
            config=config,
            worker_id=config.resolved_worker_id(),
            url=config.resolved_advertise_url(),
            mirror=CacheMirror(capacity, identity, block_tokens=block_tokens, clock=time.time),
            load=LoadTracker(config.prefill_tokens_per_s or DEFAULT_PREFILL_TOKENS_PER_S),
            exemplars=ExemplarStore(config.warm_exemplar_bytes),
        )
        self.keys = FleetKeys(config.fleet)
        self.session: aiohttp.ClientSession | None = None  # engine discovery, health, metrics, pre-warming
        self.upstream: UpstreamPool | None = None  # every proxied request
        self._read_timeout_s = read_timeout_from_env()  # a bad value fails here, at start
        self._engine_origin, self._engine_prefix = split_url(config.engine_url.rstrip("/"))
        self.redis: aioredis.Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._finishing: set[asyncio.Task[Answer]] = set()  # flushes seen through
        # A request saw the engine fail: the watch probes at once instead of at its next round, so
        # a killed engine is seen refusing (its cache is gone) even if it restarts within a second.
        self._probe_engine = asyncio.Event()
        self._left = False  # deregistered from the fleet (shutting down)
        self.metrics = sidecar_registry(lambda: self.s)
        self.timeouts = ClientTimeouts.from_env(write_s=config.client_write_timeout_s)
        key = config.engine_api_key
        if key is None:
            key = os.environ.get(ENGINE_API_KEY_ENV)
        # on every request the sidecar itself sends its engine (probes, metrics, pre-warm replays);
        # a client's request carries the client's own Authorization, never this
        self.engine_headers = engine_auth(key)
        self._refused_warned = False  # one warning for an engine refusing the sidecar's probes
        # None: a standalone sidecar without a token, whose control routes are open (warned at start)
        self.control = control_source(config, os.environ, self.read_control_token)
        self._proxy_resource: web.AbstractResource | None = None  # the catch-all route to the engine
        self._refusals_said: set[str] = set()  # routes whose first refusal was logged
        self._unavailable_said: str | None = None  # the Redis error last logged with a 503

    # -- lifecycle -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        guards = body_guards(self.timeouts, _body_error)
        # the control guard innermost: a refused request's body was read within the limits (so the
        # answer reaches a client still sending it), and an unknown path or method keeps its 404/405
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[json_route_errors, *guards.middlewares, self._control_guard],
        )
        app[SIDECAR_KEY] = self
        expect = guards.expect_handler
        app.router.add_post("/prefixfleet/state", self.handle_set_state, expect_handler=expect)
        app.router.add_post("/prefixfleet/reset_rates", self.handle_reset_rates, expect_handler=expect)
        app.router.add_get("/prefixfleet/status", self.handle_status)
        app.router.add_get("/prefixfleet/hot", self.handle_hot)
        add_prewarm_routes(app, expect)
        for path in GENERATE_PATHS:
            app.router.add_post(path, self.handle_generate, expect_handler=expect)
        app.router.add_get("/metrics", self.handle_metrics)
        # Everything else goes to the engine, but not the sidecar's own /prefixfleet/ paths: a wrong
        # method or an unknown one there is answered here (405 with Allow, 404), not by the engine.
        engine = "/{tail:(?!prefixfleet/).*}"
        proxy = app.router.add_route("*", engine, self.handle_proxy, expect_handler=expect)
        self._proxy_resource = proxy.resource
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=3),
            auto_decompress=False,
        )
        self.upstream = UpstreamPool(connect_timeout_s=3.0, read_timeout_s=self._read_timeout_s)
        if self.config.redis_url:
            self.redis = connect_redis(self.config.redis_url, timeout_s=1.0)
        self._tasks = [asyncio.create_task(self._engine_watch())]
        if self.redis is not None:
            self._tasks.append(asyncio.create_task(self._publish_loop()))

    def say_how_control_is_guarded(self) -> None:
        """Warn when the control routes are open (or PREFIXFLEET_CONTROL_TOKEN is ignored). Called
        once listening, not at app start-up: a sidecar that cannot bind says only that, in one line."""
        if self.config.redis_url:
            if os.environ.get(CONTROL_TOKEN_ENV) or self.config.control_token:
                log.warning(
                    "%s is ignored: a sidecar with Redis checks control requests against its fleet's "
                    "token (%s in Redis)",
                    CONTROL_TOKEN_ENV,
                    self.keys.control,
                )
        elif self.control is None:
            log.warning(
                "no Redis and no %s: this standalone sidecar's control routes (%s) and its engine's "
                "admin routes are open to anyone who can reach %s:%d; set %s to require a token",
                CONTROL_TOKEN_ENV,
                ", ".join(sorted(CONTROL_ROUTES)),
                self.config.host,
                self.config.port,
                CONTROL_TOKEN_ENV,
            )

    async def leave_fleet(self) -> None:
        """Stop publishing and deregister, so gateways stop routing here (idempotent).

        Runs first on shutdown, before in-flight requests are drained: draining may take seconds,
        and a process killed meanwhile would otherwise stay in the members hash.
        """
        tasks, self._tasks = self._tasks, []
        for task in await cancel_and_wait(tasks):
            log.warning("sidecar shutdown: background task %s did not stop; leaving it", task.get_name())
        if self.redis is not None and not self._left:
            self._left = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    deregister_worker(
                        self.redis, self.keys, self.s.worker_id, member=self.config.self_register
                    ),
                    timeout=1.0,
                )

    async def _on_cleanup(self, _app: web.Application) -> None:
        await self.leave_fleet()
        if self.control is not None:
            self.control.close()
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if self.upstream is not None:
            self.upstream.close()
        if self.session is not None:
            await self.session.close()

    # -- engine discovery and health -------------------------------------------------------------

    async def _engine_watch(self) -> None:
        """Learn the engine's identity and capacity, then keep probing its health."""
        assert self.session is not None
        backoff = 1.0  # after an unexpected error: doubles while it persists, up to 5 s
        while True:
            pause = 1.0 if self.s.engine.known else 0.2
            try:
                if not self.s.engine.known:
                    await self._fetch_engine_info()
                async with self._engine_get("/health") as resp:
                    await resp.read()
                    was_ok, self.s.engine_ok = self.s.engine_ok, resp.status == 200
                if was_ok != self.s.engine_ok:
                    self.load_changed()  # gateways learn of an engine failure/recovery at once
                if self.s.engine_ok and self.s.engine_was_down:
                    # It refused connections, so its process was gone: a restarted engine has an empty
                    # cache and possibly another model revision. Forget the mirror, re-read identity.
                    log.warning("engine %s is back: resetting the cache mirror", self.config.engine_url)
                    self.s.engine_was_down = False
                    self.s.mirror.flush()
                    self.s.engine.known = False
                    await self._fetch_engine_info()
                # vLLM states no cached-token count (nothing like SGLang's /get_server_info
                # internal_states): its mirror is corrected from answers' cached_tokens only, and
                # asking would be a 404 every second.
                idle = self.s.load.in_flight == 0 and self.s.engine.api != VLLM
                if self.s.engine_ok and self.s.engine.known and idle:
                    await self._reconcile_cached_tokens()
                backoff = 1.0
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self._engine_failed(exc, probe=False)
                backoff = 1.0
            except Exception:  # a bug must not end the watch: engine_ok would then never change again
                pause = max(pause, backoff)
                log.exception("engine watch failed unexpectedly; probing again in %.1f s", pause)
                backoff = min(backoff * 2, 5.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._probe_engine.wait()
            self._probe_engine.clear()

    def _engine_failed(self, exc: BaseException, *, probe: bool = True) -> None:
        if probe:
            self._probe_engine.set()
        if self.s.engine_ok:
            self.load_changed()
        self.s.engine_ok = False
        if self.s.engine.known and isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
            self.s.engine_was_down = True  # refused: not busy but gone (a timeout proves nothing)

    async def _reconcile_cached_tokens(self) -> None:
        """When idle, shrink the mirror to the engine's reported cache size (e.g. after an engine restart).

        Engines that report it (the emulator's ``internal_states[0].cached_tokens_in_tree``) let the
        mirror drop what the engine no longer holds; others are left alone.
        """
        async with self._engine_get("/get_server_info") as resp:
            if resp.status != 200:
                return
            try:
                info = await resp.json(content_type=None)
                engine_cached = info["internal_states"][0]["cached_tokens_in_tree"]
            except (ValueError, KeyError, IndexError, TypeError):
                return
        if not isinstance(engine_cached, int) or self.s.load.in_flight:
            return
        tree = self.s.mirror.tree
        excess = tree.cached_tokens - max(engine_cached, 0)
        if excess > 0:
            with contextlib.suppress(CacheFullError):
                tree.evict(min(excess, tree.cached_tokens - tree.pinned_tokens))
            self.s.mirror.changes += 1

    @contextlib.asynccontextmanager
    async def _engine_get(self, path: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET a route of the engine as the sidecar itself (its key, if any; 2 s in all). Callers
        read the answer their own way: what a failure or a bad body means differs per route."""
        assert self.session is not None
        async with self.session.get(
            f"{self.config.engine_url}{path}",
            headers=self.engine_headers,
            timeout=aiohttp.ClientTimeout(total=2),
        ) as resp:
            yield resp

    async def _get_json(self, path: str) -> Probe:
        """GET an engine route: its status and JSON body (Probe(None) when the engine did not answer)."""
        try:
            async with self._engine_get(path) as resp:
                status, data = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError):
            return Probe(None)
        if status in (401, 403):
            self._engine_refused(path, status)
        try:
            return Probe(status, json.loads(data) if status == 200 else None)
        except (ValueError, RecursionError):
            return Probe(status)

    def _engine_refused(self, path: str, status: int) -> None:
        """An engine run with an API key refuses the sidecar's unkeyed (or wrongly keyed) probes: its
        capacity stays unknown and a vLLM is not recognised as one. Said once, naming the fix."""
        if self._refused_warned:
            return
        self._refused_warned = True
        if self.engine_headers:
            log.warning(
                "engine %s refused the key in %s (HTTP %d on %s): it was started with another API key",
                self.config.engine_url,
                ENGINE_API_KEY_ENV,
                status,
                path,
            )
        else:
            log.warning(
                "engine %s answered HTTP %d on %s: it requires an API key; set %s to it (the sidecar "
                "sends it on its own probes and pre-warm requests); until then the engine's API, "
                "model and capacity are not learned",
                self.config.engine_url,
                status,
                path,
                ENGINE_API_KEY_ENV,
            )

    async def _fetch_engine_info(self) -> None:
        """Learn the engine's API (detected under ``--engine-api auto``, at each engine start),
        identity and capacity; left unknown (asked again next round) while the engine does not answer."""
        api, models = self.config.engine_api, None
        server_info: dict[str, object] | None = None  # SGLang's, as the detection probe read it
        if api == AUTO:
            probe = await self._get_json("/get_server_info")
            if is_sglang_info(probe):
                server_info = cast(dict[str, object], probe.body)  # a JSON object: is_sglang_info
            else:
                models = await self._get_json("/v1/models")
            decided = pick_engine_api(probe, models)
            if decided is None:
                return
            api = decided
        facts = await (self._vllm_facts(models) if api == VLLM else self._sglang_facts(server_info))
        if facts is not None:
            self._apply_engine_facts(api, facts)

    async def _sglang_facts(self, server_info: dict[str, object] | None = None) -> EngineFacts | None:
        """SGLang: ``/get_server_info`` (unless ``server_info`` is its answer, read already) merged with
        ``/get_model_info``."""
        info: dict = dict(server_info or {})
        paths = ("/get_server_info", "/get_model_info") if server_info is None else ("/get_model_info",)
        for path in paths:
            # not _get_json: a 200 whose body is not JSON leaves the facts unknown (asked again next
            # round) rather than read as an answer without them
            try:
                async with self._engine_get(path) as resp:
                    if resp.status in (401, 403):
                        self._engine_refused(path, resp.status)
                    if resp.status == 200:
                        body = await resp.json(content_type=None)
                        if isinstance(body, dict):
                            info.update({k: v for k, v in body.items() if k not in info})
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                return None
        return sglang_facts(info, self.config.model, self.config.revision)

    async def _vllm_facts(self, models: Probe | None) -> EngineFacts | None:
        """vLLM: the served model from ``/v1/models``, the cache from ``/metrics``; no revision is
        reported (``--revision`` gives one)."""
        assert self.session is not None
        if models is None:
            models = await self._get_json("/v1/models")
            if models.status is None:
                return None
        served = vllm_served_model(models.body) or ""
        metrics = await fetch_engine_metrics(self.session, self.config.engine_url, self.engine_headers)
        cache = None
        try:
            if metrics is None:
                raise ValueError("its /metrics did not answer 200")
            cache = vllm_cache_config(metrics.decode("utf-8", "replace"))
        except ValueError as exc:
            log.warning(
                "engine %s: no KV cache size from vllm:cache_config_info (%s); the mirror keeps %d tokens",
                self.config.engine_url,
                exc,
                self.s.mirror.tree.capacity_tokens,
            )
        return EngineFacts(
            model=self.config.model or served,
            revision=self.config.revision or "",
            capacity_tokens=cache.capacity_tokens if cache is not None else None,
            served_model=served,
            served_models=servable_names(vllm_model_ids(models.body)),
            adapters=servable_names(vllm_adapter_ids(models.body)),
            match_unit=cache.match_unit if cache is not None else None,
            prefix_caching=cache.prefix_caching if cache is not None else True,
        )

    def _apply_engine_facts(self, api: str, facts: EngineFacts) -> None:
        model, revision, capacity = facts.model, facts.revision, facts.capacity_tokens
        e = self.s.engine
        e.model, e.revision, e.known, e.api = model, revision, True, api
        e.cache_report = facts.cache_report
        e.served_model, e.match_unit = facts.served_model, facts.match_unit
        e.served_models = facts.served_models
        e.adapters = facts.adapters
        e.prefix_caching = facts.prefix_caching
        if not facts.prefix_caching:
            log.warning(
                "engine %s keeps no prefix cache: this sidecar mirrors nothing, gateways see no hits here",
                self.config.engine_url,
            )
            self.s.mirror.flush()
        if isinstance(capacity, int) and not isinstance(capacity, bool) and capacity > 0:
            if capacity > MAX_RECORD_INT:  # the load record could not carry it: gateways would refuse it
                log.warning(
                    "engine %s: ignoring %s %.40r (over %d)",
                    self.config.engine_url,
                    "its vllm:cache_config_info capacity" if api == VLLM else "max_total_num_tokens",
                    capacity,
                    MAX_RECORD_INT,
                )
            elif not self.config.cache_tokens:
                e.capacity_tokens = capacity
                self.s.mirror.resize(capacity)
        emulated = facts.emulator
        speed = emulated_speed(emulated) if isinstance(emulated, dict) else EmulatedSpeed()
        if speed.problems:
            # An infinite or zero rate would be published in the load record, which gateways refuse:
            # the worker would silently drop out of routing. Keep the defaults instead.
            log.warning(
                "engine %s: ignoring emulator figures (the defaults stand until requests measure): %s",
                self.config.engine_url,
                "; ".join(speed.problems),
            )
        seed_rate = self.config.prefill_tokens_per_s is None and not self.s.load.samples
        if seed_rate and speed.prefill_tokens_per_s is not None:
            # The emulator states its modelled speed: a better first estimate than a generic default
            # (the measured rate takes over as requests stream).
            self.s.load.prefill_tokens_per_s = speed.prefill_tokens_per_s
        if speed.fixed_latency_s is not None and not self.s.load.latency_samples:
            # ...and its fixed cost per iteration (a prefill pass, then a decode step): the first
            # estimate of the latency no queued token explains, until requests measure it. Without
            # it a cold fleet's idle replicas look free for the first requests.
            self.s.load.fixed_latency_s = speed.fixed_latency_s
        identity = CacheIdentity(model, revision, self.config.adapter)
        block_tokens = mirror_block_tokens(self.config.block_tokens, api, facts.match_unit)
        if identity != self.s.mirror.identity:
            self.s.exemplars.clear()  # requests naming another model: no replay for this one
        if identity != self.s.mirror.identity or block_tokens != self.s.mirror.block_tokens:
            # A different cache identity (or block size) names different blocks: start the mirror afresh.
            self.s.mirror = CacheMirror(
                self.s.mirror.tree.capacity_tokens,
                identity,
                block_tokens=block_tokens,
                clock=time.time,
            )
            # Its change count starts again at 0, maybe the count the old mirror's summary was
            # published at: publish this one whatever its count, so Redis names the new identity.
            self.s.published_changes = -1
        log.info(
            "engine %s (%s): model=%r revision=%r capacity=%s tokens, blocks of %d",
            self.config.engine_url,
            api,
            model,
            revision,
            self.s.mirror.tree.capacity_tokens,
            self.s.mirror.block_tokens,
        )

    # -- Redis publishing ------------------------------------------------------------------------

    def member_record(self) -> MemberRecord:
        e = self.s.engine
        return MemberRecord(
            url=self.s.url,
            state=self.s.state,
            model=e.model,
            revision=e.revision,
            adapter=self.config.adapter,
            block_tokens=self.s.mirror.block_tokens,
            registered_at=time.time(),
            served_models=e.served_models,
            adapters=e.adapters,
            engine_api=e.api,
        )

    def engine_record(self) -> EngineRecord:
        e = self.s.engine
        return EngineRecord(served_models=e.served_models, adapters=e.adapters, engine_api=e.api)

    def load_report(self) -> LoadReport:
        load = self.s.load
        mono = time.monotonic()
        return LoadReport(
            seq=self.s.load_seq,
            ts=time.time(),
            state=self.s.state,
            engine_ok=self.s.engine_ok,
            in_flight=load.in_flight,
            queued=load.queued,
            # the tracker's clock (arrivals are stamped with it): at the wall clock every request
            # without a first byte to wait for read as drained decades ago
            pending_prefill_tokens=load.pending_prefill_tokens(mono),
            prefill_tokens_per_s=round(load.prefill_tokens_per_s, 1),
            cached_tokens=self.s.mirror.tree.cached_tokens,
            capacity_tokens=self.s.mirror.tree.capacity_tokens,
            summary_version=self.s.summary_version,
            fixed_latency_s=round(load.fixed_latency_s, 4),
            arrivals_per_s=round(self.s.arrivals.rate(mono, RATE_WINDOW_S), 4),
            write_tokens_per_s=round(self.s.writes.rate(mono, RATE_WINDOW_S), 1),
        )

    async def publish_once(self, *, register: bool, periodic: bool = True) -> LoadReport:
        """Write the load record (and push it to gateways); on periodic rounds also the summary when
        the tree changed, TTL refreshes and, when asked, the member record. Returns the record written."""
        assert self.redis is not None
        ttl_ms = int(self.config.record_ttl_s * 1000)
        pipe = self.redis.pipeline(transaction=False)
        mirror = self.s.mirror
        now = time.monotonic()
        refreshed = False  # the pipeline's first command refreshes the summary's TTL
        if periodic:
            if mirror.changes != self.s.published_changes and now >= self.s.next_summary_at:
                self.s.summary_version += 1
                summary = mirror.summary(
                    worker=self.s.worker_id,
                    version=self.s.summary_version,
                    max_blocks=self.config.max_summary_blocks,
                )
                # The mirror keeps the summary current (no tree walk), but a tree over the block cap
                # still sorts its nodes by recency, milliseconds on the event loop: build at most at
                # a pace that keeps that under ~10% of the loop's time.
                self.s.next_summary_at = now + 9.0 * (time.monotonic() - now)
                pipe.set(self.keys.summary(self.s.worker_id), encode_summary(summary), px=ttl_ms)
                self.s.published_changes = mirror.changes
            else:
                pipe.pexpire(self.keys.summary(self.s.worker_id), ttl_ms)
                refreshed = True
        self.s.load_seq += 1
        report = self.load_report()
        load = encode_record(report)
        pipe.set(self.keys.load(self.s.worker_id), load, px=ttl_ms)
        if self.config.push_load:
            # Gateways subscribed to this channel see every worker's load within milliseconds, so
            # several gateways see each other's sends instead of a report up to an interval old.
            pipe.publish(self.keys.loads, encode_load_push(self.s.worker_id, load))
        if register and self.config.self_register:
            pipe.hset(self.keys.members, self.s.worker_id, encode_record(self.member_record()))
        elif register:
            # The operator writes this worker's member record without what only the engine says
            # (its LoRA adapters, its API, the names it serves): gateways take those from here.
            pipe.set(self.keys.engine(self.s.worker_id), encode_record(self.engine_record()), px=ttl_ms)
        results = await pipe.execute()
        if refreshed and not results[0]:
            # The key is gone though Redis stayed up (evicted under maxmemory: volatile-* policies
            # pick keys with a TTL; deleted by hand): write the summary again next round, or it
            # stays missing while this mirror does not change.
            self.s.published_changes = -1
        self.s.pushed_load = self._queue_figures(report)
        return report

    @staticmethod
    def _queue_figures(report: LoadReport) -> tuple[object, ...]:
        """What a load push is for: the figures that change as requests come and go."""
        return (
            report.state,
            report.engine_ok,
            report.in_flight,
            report.queued,
            report.pending_prefill_tokens,
        )

    def load_changed(self) -> None:
        """A request arrived, started answering or finished: push the new load soon (coalesced)."""
        if self.config.push_load:
            self.s.wake.set()

    async def _publish_loop(self) -> None:
        interval = self.config.publish_interval_s
        backoff = interval
        last_register = 0.0
        last_periodic = 0.0
        # A state change whose publish failed: retried after the backoff. (Re-setting the event
        # instead made the wait below return at once: a tight retry loop for the whole outage.)
        unpublished_state = False
        while True:
            if self.control is not None and self.control.token is None:
                # known before the first control request (one Redis read); a failed read is retried
                # here. A control request reads it again when this reading is over a second old, and
                # with Redis down the cached one serves only for router.control.UNCONFIRMED_GRACE_S
                await self.control.refresh()
            state_change = self.s.state_changed.is_set() or unpublished_state
            record_change, self.s.record_changed = self.s.record_changed, False
            self.s.state_changed.clear()
            self.s.wake.clear()
            now = time.monotonic()
            prompt = state_change or record_change  # written in this round, not at the next interval
            periodic = prompt or now - last_periodic >= interval or not self.s.redis_ok
            register = periodic and (prompt or now - last_register >= 2.0 or not self.s.redis_ok)
            try:
                # Between periodic rounds, push only if the queue differs from what gateways last saw
                # (requests may have come and gone meanwhile; the periodic round refreshes the rest).
                written = self.s.state
                if periodic or self._queue_figures(self.load_report()) != self.s.pushed_load:
                    written = (await self.publish_once(register=register, periodic=periodic)).state
                if periodic:
                    last_periodic = now
                if state_change:
                    # The notice names the state the record just written holds: one that changed
                    # while it was written (warming -> ready) has its own round next, so a reader
                    # acting on a notice never finds the record behind it.
                    assert self.redis is not None
                    await self.redis.publish(self.keys.events, f"state {self.s.worker_id} {written}")
                if register:
                    last_register = now
                if not self.s.redis_ok:
                    log.warning("redis reachable again: publishing resumed")
                    self.s.redis_ok = True
                    # A restarted Redis lost everything: republish the summary too.
                    self.s.published_changes = -1
                unpublished_state = False
                backoff = interval
                failed = False
            except (aioredis.RedisError, OSError, TimeoutError) as exc:
                if self.s.redis_ok:
                    log.warning(
                        "redis unavailable (%s): still proxying, retrying with backoff", redis_error_text(exc)
                    )
                    self.s.redis_ok = False
                failed = True
            except Exception:  # a bug must not end the heartbeat: gateways would take us for dead
                log.exception("publishing failed unexpectedly; retrying in %.2f s", backoff)
                failed = True
            if failed:
                unpublished_state = state_change
                self.s.record_changed = self.s.record_changed or record_change  # written on the retry
                wait, event = backoff, self.s.state_changed  # a new state change retries at once
                backoff = min(backoff * 2, 2.0)
            else:
                # coalesce load changes: at most one push per min gap, a full round every interval
                await asyncio.sleep(self.config.push_min_interval_s)
                wait = max(interval - (time.monotonic() - last_periodic), 0.0)
                event = self.s.wake  # a load change or a state change
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await event.wait()

    # -- the control token -----------------------------------------------------------------------

    async def read_control_token(self) -> str:
        """The fleet's control token from its Redis (created there when missing)."""
        if self.redis is None:
            raise ConnectionError("the sidecar's Redis client is not open yet")
        return await fleet_control_token(self.redis, self.keys)

    def peer_control_headers(self) -> dict[str, str]:
        """The header of this sidecar's own control requests to other sidecars of its fleet (pre-warm's
        fetch from a source): its token, none when it has none (a standalone sidecar left open). A
        warm request was checked against the cached token just before, so it is the fleet's current one."""
        token = self.control.token if self.control is not None else None
        return control_headers(token) if token else {}

    @web.middleware
    async def _control_guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Control routes and the engine's non-data-plane routes need the control token."""
        if self.control is None:
            return await handler(request)
        resource = request.match_info.route.resource
        if resource is None:  # aiohttp's own 404/405: nothing runs
            return await handler(request)
        forwarded = resource is self._proxy_resource or resource.canonical in GENERATE_PATHS
        # judged on the target as the engine gets it (a generation route is matched here on
        # aiohttp's normalised path, while the target goes on as the client wrote it)
        target = request_target(request) if forwarded else ""
        if resource.canonical in CONTROL_ROUTES:
            label = resource.canonical
        elif forwarded and not engine_route_is_open(target):
            label = refused_route_label(target)
        else:
            return await handler(request)
        verdict = await self.control.check(request.headers.get(CONTROL_HEADER))
        if verdict is Verdict.ACCEPTED:
            return await handler(request)
        return self._refused(request, label, verdict)

    def _refused(self, request: web.Request, label: str, verdict: Verdict) -> web.Response:
        """The 401 (or, the token unknown with Redis down, the 503) of a control request, counted."""
        assert self.control is not None
        where = (
            f"the fleet's Redis holds it: redis-cli GET {self.keys.control}"
            if self.control.read is not None
            else f"it is this sidecar's {CONTROL_TOKEN_ENV}"
        )
        what = f"{request.method} {request.path}"
        if verdict is Verdict.UNAVAILABLE:
            if self._unavailable_said != self.control.error:  # once per error, not per request
                self._unavailable_said = self.control.error
                log.warning("refused %s: the control token could not be read: %s", what, self.control.error)
            response = json_error(
                503,
                f"{what} needs the fleet's control token, which lives in the fleet's Redis "
                f"({self.keys.control}), and Redis could not be read: {self.control.error}; retry "
                "when Redis is back",
                kind="service_unavailable",
            )
            response.headers["Retry-After"] = "1"
            return response
        self.s.control_refused[label] = self.s.control_refused.get(label, 0) + 1
        if label not in self._refusals_said:  # once per route: a flood of refusals is no flood of logs
            self._refusals_said.add(label)
            log.warning("refused %s from %s: %s control token", what, request.remote, verdict.value)
        problem = "none was sent" if verdict is Verdict.MISSING else "the one sent is not the fleet's"
        response = json_error(
            401,
            f"{what} needs the fleet's control token in the {CONTROL_HEADER} header ({problem}); {where}",
            kind="authentication_error",
            param=CONTROL_HEADER,
        )
        response.headers["WWW-Authenticate"] = f'Prefixfleet-Token realm="{self.keys.control}"'
        return response

    # -- admin endpoints -------------------------------------------------------------------------

    async def handle_set_state(self, request: web.Request) -> web.Response:
        try:
            state = validate_state((await read_json_object(request)).get("state"))
        except BadRequest as exc:
            return bad_request(exc)
        except ValueError as exc:
            return json_error(400, str(exc), param="state")
        previous, self.s.state = self.s.state, state
        if previous != state:
            log.info("state %s -> %s", previous, state)
            self.s.state_changed.set()
        return web.json_response({"worker_id": self.s.worker_id, "state": state, "previous": previous})

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        """The engine's metrics followed by the sidecar's own (docs/metrics.md)."""
        assert self.session is not None
        engine = await fetch_engine_metrics(self.session, self.config.engine_url, self.engine_headers)
        body = exposition(engine, self.metrics)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_reset_rates(self, _request: web.Request) -> web.Response:
        """Forget the worker's traffic rates (arrivals, cache writes), as if no request had come. For a
        benchmark replaying runs one after another on one fleet (``prefixfleet up`` between policies):
        a run must not start with the run before's rates. Not part of a cache flush: a flush on a live
        engine does not stop its traffic."""
        # in Redis from the next periodic round (publish_interval_s), which the caller waits for
        self.s.arrivals, self.s.writes = DecayedRate(), DecayedRate()
        return web.json_response(
            {"worker_id": self.s.worker_id, "arrivals_per_s": 0.0, "write_tokens_per_s": 0.0}
        )

    async def handle_status(self, _request: web.Request) -> web.Response:
        report = self.load_report()
        return web.json_response(
            {
                "worker_id": self.s.worker_id,
                "url": self.s.url,
                "fleet": self.config.fleet,
                "state": self.s.state,
                "engine_ok": self.s.engine_ok,
                "redis_ok": self.s.redis_ok,
                "model": self.s.engine.model,
                "revision": self.s.engine.revision,
                "engine_api": self.s.engine.api or None,  # None: not known yet
                "adapters": list(self.s.engine.adapters),  # its LoRA adapters (blockhash.request_identity)
                "block_tokens": self.s.mirror.block_tokens,
                "load": {k: getattr(report, k) for k in report.__dataclass_fields__},
                "mirror": {
                    "compared_requests": self.s.mirror.compared_requests,
                    "predicted_cached_tokens": self.s.mirror.predicted_tokens_total,
                    "engine_cached_tokens": self.s.mirror.reported_tokens_total,
                    "overpredicted_tokens": self.s.mirror.overpredicted_tokens_total,
                },
            }
        )

    async def handle_hot(self, request: web.Request) -> web.Response:
        """Hot prefixes as token ids, for pre-warming another replica. Pod-local: never in Redis."""
        out = [
            {
                "hash": f"{h:016x}",
                "namespace": namespace_salt(p.namespace),  # the tenant salt
                "adapter": namespace_adapter(p.namespace),  # None: the worker's own identity
                "num_tokens": len(p.token_bytes) // 4,
                "input_ids": list(memoryview(p.token_bytes).cast("I")),
            }
            for h, p in self.s.mirror.hot_prefixes.items()
        ]
        return web.json_response({"worker_id": self.s.worker_id, "prefixes": out})

    # -- proxying --------------------------------------------------------------------------------

    async def handle_generate(self, request: AnyRequest) -> Answer:
        body = await request.read()  # within the limit: body_deadline read it (or the front did)
        return await self._forward(request, body, track=True)

    def _track(self, path: str, body: bytes) -> tuple[InferenceRequest, Admission | None, int, int] | None:
        """Tokenize, mirror and count a generation request (after it is on its way to the engine);
        with the cached tokens predicted for it, in the engine's terms."""
        try:
            parsed = parse_inference_request(path, body, max_prompt_tokens=self.config.max_prompt_tokens)
        except BadRequest:
            return None  # not ours to judge what the engine accepts: forwarded untracked
        engine = self.s.engine
        # an engine without a prefix cache reuses nothing: nothing is mirrored, no hit predicted
        admission = (
            self.s.mirror.admit_sent(parsed.token_bytes, self._namespace(parsed))
            if engine.prefix_caching
            else None
        )
        predicted = mirrored = admission.matched_tokens if admission is not None else 0
        # Each engine reports its hit short of the prompt's last token (vLLM in whole blocks too): a
        # mirror match counted to the token read as that many tokens evicted at each repeat.
        unit = engine.match_unit or self.s.mirror.block_tokens
        predicted = engine_visible_hit(engine.api, predicted, parsed.num_tokens, unit)
        now = time.monotonic()
        handle = self.s.load.admit(
            parsed.uncached_tokens(predicted), now, timed=parsed.stream or parsed.max_new_tokens <= 1
        )
        # Written to the cache: the prompt past what the mirror held (in the mirror's terms, as the
        # gateways' own count takes it: the prompt past the match they saw in its summary). Not the
        # tokens the mirror's insert added: a prompt longer than the cache adds none to the mirror,
        # yet the engine prefills it through its cache and evicts as much.
        self.s.arrivals.add(1.0, now, RATE_WINDOW_S)
        self.s.writes.add(max(parsed.num_tokens - mirrored, 0), now, RATE_WINDOW_S)
        self.load_changed()
        return parsed, admission, handle, predicted

    def _namespace(self, parsed: InferenceRequest) -> object:
        """The mirror namespace ``parsed`` is cached under: its tenant salt, under the LoRA adapter it
        names when the engine has that adapter loaded (CacheMirror.request_namespace)."""
        e = self.s.engine
        return self.s.mirror.request_namespace(
            parsed.tenant_salt, e.adapters, e.api, parsed.adapter_model, parsed.lora_path
        )

    async def handle_proxy(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()  # within the limit: body_deadline read it
        vllm_flush = self.s.engine.api == VLLM and request.path == VLLM_FLUSH_PATH
        if request.path in ADAPTER_ROUTES:
            # The engine loads or unloads the adapter even if the client leaves: seen through, so
            # the member record names the adapters requests are hashed by (request_identity).
            adapting = asyncio.create_task(self._adapter_change(request, body))
            self._finishing.add(adapting)
            adapting.add_done_callback(self._finishing.discard)
            return await asyncio.shield(adapting)
        if request.path != "/flush_cache" and not vllm_flush:
            return await self._forward(request, body)
        # Once sent, the engine may empty its cache even if the client leaves (aiohttp then cancels
        # this handler): the flush is seen through, so the mirror empties with the engine.
        task = asyncio.create_task(self._flush_cache(request, body))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        return await asyncio.shield(task)

    async def _adapter_change(self, request: web.Request, body: bytes) -> Answer:
        """Forward a LoRA adapter load or unload; once the engine took it, the sidecar's adapters
        (and, for vLLM, served names) follow, and the member record is published at once."""
        response = await self._forward(request, body)
        e = self.s.engine
        after = adapters_after(e.api, request.path, response.status, body, e.served_models, e.adapters)
        if after is not None:
            served, adapters = servable_names(after[0]), servable_names(after[1])
            if (served, adapters) != (e.served_models, e.adapters):
                e.served_models, e.adapters = served, adapters
                log.info("engine %s: LoRA adapters now %s", self.config.engine_url, list(adapters))
                # registers again now, not at the next 2 s round; no state notice: the state is as it was
                self.s.record_changed = True
                self.s.wake.set()
        return response

    async def _flush_cache(self, request: web.Request, body: bytes) -> Answer:
        if self.s.engine.api != VLLM:
            response = await self._forward(request, body)
        else:
            # SGLang's /flush_cache is vLLM's POST /reset_prefix_cache (the query passed on: vLLM
            # reads reset_running_requests and reset_external there).
            query = request_target(request).partition("?")[2]
            if self.s.load.in_flight and not vllm_resets_running(query):
                # vLLM would answer 200 and keep its cache: say so (as SGLang's busy flush does)
                return json_error(400, VLLM_FLUSH_BUSY)
            target = VLLM_FLUSH_PATH + (f"?{query}" if query else "")
            method = "POST" if request.path == "/flush_cache" else request.method
            response = await self._forward(request, body, method=method, target=target)
            if response.status == 404:
                # no such route: the server runs without VLLM_SERVER_DEV_MODE=1 and kept its cache,
                # so the mirror keeps its copy too
                return json_error(501, VLLM_FLUSH_UNAVAILABLE, kind="not_implemented")
        if 200 <= response.status < 300:
            self.s.mirror.flush()
        return response

    async def _forward(
        self,
        request: AnyRequest,
        body: bytes,
        *,
        track: bool = False,
        method: str | None = None,
        target: str | None = None,
    ) -> Answer:
        """Send ``request`` to the engine (as ``method`` to ``target`` when given, else as the client
        sent it) and answer with what the engine answers."""
        assert self.upstream is not None
        load = self.s.load
        handle = predicted = None
        parsed: InferenceRequest | None = None
        echoed: str | None = ""  # what the answer's text repeats before its output
        admission: Admission | None = None
        # the engine began its answer (a stream's first event: the prompt is prefilled) or answered
        # whole with success: until then the mirror's admission of the prompt is only a guess
        prefilled = [False]
        exchange: Exchange | None = None
        failure: BaseException | None = None
        try:
            # On a pooled connection the request is on the wire when this returns, without a suspension.
            exchange = await self.upstream.send(
                self._engine_origin,
                method or request.method,
                self._engine_prefix + (target or request_target(request)),
                forward_header_pairs(request.headers),
                body if body else None,
            )
        except (OSError, TimeoutError) as exc:
            failure = exc
        if track:
            # Bookkeeping off the critical path: the request reached the engine first; tokenize and
            # mirror it while the engine works (it cannot answer before the next await).
            tracked = self._track(request.path, body)
            if tracked is not None:
                parsed, admission, handle, predicted = tracked
                echoed = echoed_prompt(request.path, body)
        try:
            try:
                if exchange is None:
                    assert failure is not None
                    raise failure
                upstream = await exchange.response()
            except (OSError, TimeoutError) as exc:
                self._engine_failed(exc)
                return engine_failure("engine unavailable", exc)
            headers = answer_headers(upstream.headers)
            streaming = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            if not streaming:
                try:
                    data = await upstream.read()
                except (OSError, TimeoutError) as exc:
                    self._engine_failed(exc)
                    return engine_failure("engine failed mid-response", exc)
                exchange.close()  # the connection goes back to the pool before the client is answered
                response = web.Response(status=upstream.status, body=data, headers=headers)
                if handle is None:
                    return response
                load.first_byte(handle, time.monotonic())
                self.load_changed()
                prefilled[0] = upstream.status == 200
                # Answer first, learn after: the mirror update is not the client's wait. Learn even
                # if the client left mid-answer (then aiohttp cancels this handler): the engine did it.
                try:
                    with contextlib.suppress(ConnectionError):
                        await answer_now(request, response)
                finally:
                    if parsed is not None and upstream.status == 200:
                        self._learn(parsed, data, predicted or 0, handle, echoed)
                return response
            return await self._stream(
                request, upstream, headers, parsed, handle, predicted or 0, prefilled, echoed
            )
        finally:
            if exchange is not None:
                exchange.close()  # unfinished (client left, handler cancelled): aborts the engine's request
            if admission is not None and not prefilled[0]:
                self.s.mirror.withdraw(admission)  # the next summary leaves the prompt out again
            elif admission is not None and parsed is not None and parsed.prompts == 1:
                # the engine cached this prompt: keep the request, to replay when pre-warming
                # another replica (a batch is not kept: its other prompts are not mirrored)
                self.s.exemplars.record(request.path, body, self._namespace(parsed), parsed.token_bytes)
            if handle is not None:
                # ok only if the engine prefilled it: an error answer (a 4xx refusal comes at once)
                # timed as a prefill read as millions of tokens a second, and gateways then sent
                # everything to the replica that refuses
                load.finish(handle, time.monotonic(), ok=prefilled[0])
                self.load_changed()

    async def _stream(
        self,
        request: AnyRequest,
        upstream: UpstreamResponse,
        headers: CIMultiDict[str],
        parsed: InferenceRequest | None,
        handle: int | None,
        predicted: int,
        prefilled: list[bool],
        echoed: str | None,
    ) -> Answer:
        response = await open_stream(request, upstream.status, headers)
        write = stream_writer(request, response, self.timeouts.write_s)
        cached: int | None = None
        usage = b""  # the event(s) carrying the engine's token counts
        # A batch's stream interleaves its prompts' events: the text and cached count seen last may be
        # another prompt's, so only a single prompt's stream teaches the mirror (a batch's first
        # prompt was admitted when sent).
        learn = parsed is not None and parsed.prompts == 1
        # an OpenAI usage event without cached_tokens: 0 if the engine reports them (find_cached_tokens)
        zero = self.s.engine.cache_report
        collected = StreamedText(parsed.path) if learn and upstream.status == 200 else None
        complete = False
        first = True
        try:
            async for chunk in whole_events(upstream.iter_chunks()):
                if handle is not None:
                    if first:
                        first = False
                        self.s.load.first_byte(handle, time.monotonic())
                        self.load_changed()
                        # an engine's error event before any token (a refused prompt): no prefill
                        prefilled[0] = upstream.status == 200 and not is_error_event(chunk)
                    # a usage without cached_tokens is a 0 only in the stream's usage event (no
                    # choices): continuous_usage_stats put a running count on every chunk, and a
                    # stream cut before its usage event never said what was cached
                    final = zero and b'"prompt_tokens"' in chunk and _NO_CHOICES.search(chunk) is not None
                    if learn and (b"cached_tokens" in chunk or final):
                        usage = chunk
                        cached = find_cached_tokens(chunk, absent_is_zero=zero)
                        self._reports_cached_tokens(chunk)
                if collected is not None:
                    collected.feed(chunk)
                try:
                    await write(chunk)
                except ConnectionError:
                    return response  # the client left; closing upstream aborts the engine's request
                except ClientStalled:
                    self._client_stalled(request.path)
                    return response  # as for a client that left
            complete = True
        except (OSError, TimeoutError) as exc:
            self._engine_failed(exc)
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                try:
                    await write(sse_error_event(f"engine stream ended early: {exc.__class__.__name__}"))
                except ClientStalled:
                    # stalled on the last event as on any other (the connection is closed)
                    self._client_stalled(request.path)
        if parsed is not None and handle is not None and cached is not None:
            uncached = find_uncached_tokens(usage, parsed.num_tokens, absent_is_zero=zero)
            if uncached is not None:
                self.s.load.report_uncached(handle, uncached)
            self.s.mirror.correct(predicted, cached, ran_alone=self.s.load.ran_alone(handle))
        # no text at all (a stream of nothing but an error event or usage, nothing generated):
        # nothing to learn, and the stream still ends properly below
        text = collected.text if complete and collected is not None else None
        output = after_echo(text, echoed) if text else None
        if parsed is not None and output and self.s.engine.prefix_caching:
            self.s.mirror.admit(
                parsed.token_bytes + as_token_bytes(tokenize(output)), self._namespace(parsed)
            )
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    def _client_stalled(self, path: str) -> None:
        """A streamed answer's client read nothing for the write timeout: its connection was closed."""
        log.info(
            "client of %s read nothing of its stream for %g s: connection closed, request aborted",
            path,
            self.timeouts.write_s,
        )

    def _reports_cached_tokens(self, usage: bytes) -> None:
        """A vLLM answer with ``prompt_tokens_details`` says its engine runs with
        --enable-prompt-tokens-details: its later usage reports without them are 0 cached tokens
        (vLLM tests the count's truth: ``if self.enable_prompt_tokens_details and num_cached_tokens``),
        until the engine restarts (its facts, read again, reset this)."""
        engine = self.s.engine
        if engine.api == VLLM and not engine.cache_report and b'"cached_tokens"' in usage:
            engine.cache_report = True

    def _learn(
        self, parsed: InferenceRequest, data: bytes, predicted: int, handle: int, echoed: str | None
    ) -> None:
        """Reconcile the mirror with a finished non-streaming response."""
        # an OpenAI usage without cached_tokens: 0 if the engine reports them (find_cached_tokens)
        zero = self.s.engine.cache_report
        cached = find_cached_tokens(data, absent_is_zero=zero)
        self._reports_cached_tokens(data)
        if cached is not None:
            uncached = answer_uncached_tokens(parsed.path, data, parsed.num_tokens, absent_is_zero=zero)
            if uncached is not None:
                self.s.load.report_uncached(handle, uncached)
            # A batch's answer counts cached tokens per prompt (/generate: the last one found is the
            # last prompt's) or summed (completions' usage): neither is the first prompt's, which
            # alone was predicted, so only a single prompt's count corrects the mirror (as streamed).
            if parsed.prompts == 1:
                self.s.mirror.correct(predicted, cached, ran_alone=self.s.load.ran_alone(handle))
        text = output_text(parsed.path, data)
        # echo: the text repeats the prompt first (already mirrored when sent)
        text = after_echo(text, echoed) if text else None
        if text and self.s.engine.prefix_caching:
            # The engine keeps prompt + generated tokens cached (so does SGLang): mirror that too,
            # so the next turn of a conversation is predicted as the hit it will be.
            self.s.mirror.admit(parsed.token_bytes + as_token_bytes(tokenize(text)), self._namespace(parsed))


@dataclass(frozen=True, slots=True)
class Listening(FrontServing):
    """A sidecar serving on its socket (see :func:`listening`), with its ``.sidecar``."""

    sidecar: Sidecar


@contextlib.asynccontextmanager
async def listening(config: SidecarConfig) -> AsyncIterator[Listening]:
    """Serve ``config`` until the block ends, then leave the fleet and stop."""
    sidecar = Sidecar(config)
    # Generation requests take the lean front; every other path (and anything unusual) aiohttp.
    async with serving_front(
        sidecar.app(),
        config.host,
        config.port,
        dict.fromkeys(GENERATE_PATHS, sidecar.handle_generate),
        _body_error,
        timeouts=sidecar.timeouts,
        max_body_bytes=config.max_body_bytes,
    ) as serving:
        sidecar.say_how_control_is_guarded()
        try:
            yield Listening(server=serving.server, front=serving.front, sidecar=sidecar)
        finally:
            # Leave before the socket closes, so the fleet stops routing here first.
            await sidecar.leave_fleet()


async def serve(config: SidecarConfig) -> None:
    """Run a sidecar until cancelled."""
    async with listening(config) as served:
        log.info(
            "sidecar %s on %s:%d -> %s (fleet %s)",
            served.sidecar.s.worker_id,
            config.host,
            config.port,
            config.engine_url,
            config.fleet,
        )
        await asyncio.Event().wait()
