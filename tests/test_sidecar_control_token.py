"""The sidecar enforces the fleet's control token (router.control, router.engine_routes).

Specification:
* the sidecar's control routes (``POST /prefixfleet/state``, ``POST /prefixfleet/warm``,
  ``GET /prefixfleet/prefix/{hash}``, ``GET /prefixfleet/hot``) answer 401 without the
  ``X-Prefixfleet-Token`` header or with another token than the fleet's, in the sidecar's error shape,
  naming the route, the header and where the token lives (``redis-cli GET pf:{fleet}:control``); with
  the fleet's token they work; ``/prefixfleet/status`` and ``/metrics`` stay open;
* refusals are counted in ``prefixfleet_sidecar_control_refused_total{route}``, its label bounded
  (a made-up path counts as ``other``);
* the engine's data-plane routes (SGLang's and vLLM's: inference, tokenizing, models, health, server
  and model info) are forwarded without a token; every other engine route (``/flush_cache``,
  ``/v1/load_lora_adapter``, ``/sleep``..., and any route not known as data plane) needs it: refused
  before the engine sees it, forwarded with it; the header never reaches the engine;
* a flush passing through with the token still empties the sidecar's mirror;
* a rotation (the key deleted, a new token made by the next reader) is picked up: the new token is
  accepted, the old one refused within a second, also when a client keeps sending it; a token is
  accepted only against a read younger than a second, and Redis is asked at most once a second;
* a token known and Redis unreachable: the cached token serves for a bounded grace after the last
  read that worked, then 503 naming Redis;
* no token cached and Redis unreachable: 503 naming Redis, never open;
* a standalone sidecar (no Redis) is open (one startup warning) unless given PREFIXFLEET_CONTROL_TOKEN;
* pre-warming sends the sidecar's token with its fetch from the source sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from control_fixtures import fleet_token, token_header
from fleet_fixtures import (
    LOOPBACK,
    RedisServer,
    Spawner,
    eventually,
    free_port,
    prefixfleet_argv,
    serve_aiohttp,
)
from prometheus_client.parser import text_string_to_metric_families

from prefixfleet.router import gateway
from prefixfleet.router.control import CONTROL_HEADER, ControlTokenSource, Verdict, token_matches
from prefixfleet.router.engine_routes import OTHER_ROUTE, engine_route_is_open, refused_route_label
from prefixfleet.router.keys import FleetKeys
from prefixfleet.router.sidecar import Sidecar, SidecarConfig, listening

FLEET = "guarded"
CONTROL_ROUTES = [
    ("POST", "/prefixfleet/state", {"state": "ready"}),
    ("POST", "/prefixfleet/warm", {"source": "http://127.0.0.1:1", "hashes": [], "hold_traffic": False}),
    ("GET", "/prefixfleet/prefix/0123456789abcdef", None),  # not held: a 404 once past the guard
    ("GET", "/prefixfleet/hot", None),
    ("POST", "/prefixfleet/reset_rates", None),
]


# -- the pure decisions ------------------------------------------------------------------------------

# Read from python/sglang/srt/entrypoints/http_server.py (sgl-project/sglang)
SGLANG_OPEN = [
    "/generate", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/encode", "/classify",
    "/v1/tokenize", "/v1/detokenize", "/tokenize", "/detokenize", "/v1/models", "/v1/models/org/name-7b",
    "/get_model_info", "/get_server_info", "/server_info", "/model_info", "/health", "/health_generate",
    "/get_load", "/v1/responses", "/v1/responses/resp_1", "/v1/responses/resp_1/cancel", "/v1/score",
    "/v1/rerank", "/ping", "/invocations", "/v1/completions?stream=1",
]  # fmt: skip
SGLANG_ADMIN = [
    "/flush_cache", "/flush_cache?x=1", "/abort_request", "/update_weights_from_disk",
    "/update_weights_from_tensor", "/update_weights_from_distributed", "/init_weights_update_group",
    "/release_memory_occupation", "/resume_memory_occupation", "/start_profile", "/stop_profile",
    "/configure_logging", "/load_lora_adapter", "/unload_lora_adapter", "/set_internal_state",
    "/pause_generation", "/continue_generation", "/slow_down", "/get_weights_by_name", "/open_session",
    "/freeze_gc", "/clear_hicache_storage_backend", "/dump_expert_distribution_record",
]  # fmt: skip
# Read from vllm/entrypoints/openai/api_server.py (vllm-project/vllm) and its routers
VLLM_OPEN = [
    "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/pooling", "/score", "/v1/score",
    "/rerank", "/v1/rerank", "/v2/rerank", "/classify", "/tokenize", "/detokenize", "/v1/models",
    "/version", "/health", "/load", "/ping", "/v1/audio/transcriptions", "/v1/messages", "/metrics",
]  # fmt: skip
VLLM_ADMIN = [
    "/sleep", "/sleep?level=2", "/wake_up", "/is_sleeping", "/reset_prefix_cache", "/reset_mm_cache",
    "/collective_rpc", "/scale_elastic_ep", "/is_scaling_elastic_ep", "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter", "/start_profile", "/stop_profile", "/pause", "/resume",
]  # fmt: skip
# Spellings of an admin route, or paths a lenient server might route elsewhere than they read
DISGUISED = [
    "/flush%5Fcache", "/%66lush_cache", "/v1/models/../../flush_cache", "/v1/models/%2E%2E/flush_cache",
    "/v1/completions/../../sleep", "/./flush_cache", "//flush_cache", "/v1/completions/", "/V1/COMPLETIONS",
    "/v1/models/", "/v1/models//x", "/v1/responses/a/b", "/v1/responses/", "\\flush_cache", "*", "",
    "/v1\\..\\flush_cache", "/generate/x",
]  # fmt: skip


def per_api(**routes: list[str]) -> list[object]:
    """One case per (API, route), named so: ``sglang:/flush_cache``."""
    return [pytest.param(t, id=f"{api}:{t}") for api, targets in routes.items() for t in targets]


@pytest.mark.parametrize("target", per_api(sglang=SGLANG_OPEN, vllm=VLLM_OPEN))
def test_data_plane_routes_of_each_api_are_open(target: str) -> None:
    assert engine_route_is_open(target)


@pytest.mark.parametrize("target", per_api(sglang=SGLANG_ADMIN, vllm=VLLM_ADMIN))
def test_admin_routes_of_each_api_need_the_token_and_count_by_name(target: str) -> None:
    assert not engine_route_is_open(target)
    assert refused_route_label(target) == target.partition("?")[0]


@pytest.mark.parametrize("target", DISGUISED)
def test_a_disguised_or_unknown_route_needs_the_token(target: str) -> None:
    assert not engine_route_is_open(target)


def test_the_label_of_an_unknown_route_is_other() -> None:
    assert refused_route_label("/made-up/abc123") == OTHER_ROUTE
    assert refused_route_label("/flush%5Fcache") == "/flush_cache"  # as the engine would read it


def test_a_header_that_was_not_utf8_is_compared_not_an_error() -> None:
    assert not token_matches("abc", "\udcff\udcfe")  # aiohttp's surrogate escapes of bytes 0xff 0xfe


@dataclass
class FakeRead:
    """A Redis read of the token: returns ``token`` (or raises ``error``), counting calls; ``gate``
    holds each read until set."""

    token: str = "t1"
    error: BaseException | None = None
    calls: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self) -> str:
        self.calls += 1
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        return self.token


async def test_the_token_source_reads_once_a_second_and_shares_a_read() -> None:
    now = [100.0]
    read = FakeRead()
    source = ControlTokenSource(read=read, clock=lambda: now[0])
    assert await source.check(None) is Verdict.MISSING and read.calls == 0  # no header: no read
    # eight concurrent checks, one read
    checks = [asyncio.ensure_future(source.check("t1")) for _ in range(8)]
    await asyncio.sleep(0)
    read.gate.set()
    assert set(await asyncio.gather(*checks)) == {Verdict.ACCEPTED} and read.calls == 1
    # a wrong token within the second: refused from the cache; after it, Redis asked again
    assert await source.check("nope") is Verdict.WRONG and read.calls == 1
    now[0] += 1.0
    read.token = "t2"  # rotated meanwhile
    assert await source.check("t2") is Verdict.ACCEPTED and read.calls == 2
    assert await source.check("t1") is Verdict.WRONG and read.calls == 2  # the old one, within the second


async def test_the_token_source_never_opens_when_redis_fails() -> None:
    now = [0.0]
    read = FakeRead(error=ConnectionError("Connection refused"))
    read.gate.set()
    source = ControlTokenSource(read=read, clock=lambda: now[0])
    assert await source.check("anything") is Verdict.UNAVAILABLE
    assert "Connection refused" in (source.error or "")
    read.error = None
    now[0] += 1.0
    assert await source.check("t1") is Verdict.ACCEPTED and source.error is None
    read.error = ConnectionError("down again")
    now[0] += 1.0
    assert await source.check("other") is Verdict.WRONG  # a cached token: not the fleet's, said so
    assert await source.check("t1") is Verdict.ACCEPTED


async def test_a_matching_token_is_accepted_only_against_a_recent_read() -> None:
    now = [0.0]
    read = FakeRead()
    read.gate.set()
    source = ControlTokenSource(read=read, clock=lambda: now[0])
    assert await source.check("t1") is Verdict.ACCEPTED and read.calls == 1
    now[0] += 0.5
    assert await source.check("t1") is Verdict.ACCEPTED and read.calls == 1  # read 0.5 s ago: no read
    read.token = "t2"  # rotated
    now[0] += 0.5
    # read a second ago: read again before accepting, though the token matches the cached one
    assert await source.check("t1") is Verdict.WRONG and read.calls == 2
    assert await source.check("t2") is Verdict.ACCEPTED and read.calls == 2


async def test_redis_down_keeps_the_cached_token_for_the_grace_only() -> None:
    now = [0.0]
    read = FakeRead()
    read.gate.set()
    source = ControlTokenSource(read=read, clock=lambda: now[0], grace_s=30.0)
    assert await source.check("t1") is Verdict.ACCEPTED  # read at 0
    read.error = ConnectionError("Connection refused")
    now[0] = 29.0
    assert await source.check("t1") is Verdict.ACCEPTED and read.calls == 2  # tried, failed: grace
    assert await source.check("t0") is Verdict.WRONG
    now[0] = 30.5
    # unconfirmed for longer than the grace: neither accepted nor called wrong; Redis named
    assert await source.check("t1") is Verdict.UNAVAILABLE and read.calls == 3
    assert await source.check("t0") is Verdict.UNAVAILABLE and "Connection refused" in (source.error or "")
    read.error = None
    now[0] = 31.5
    assert await source.check("t1") is Verdict.ACCEPTED and source.error is None and read.calls == 4


async def test_a_fixed_token_is_never_read_and_never_ages() -> None:
    now = [0.0]
    source = ControlTokenSource(token="fixed", clock=lambda: now[0])
    now[0] = 1e6
    assert await source.check("fixed") is Verdict.ACCEPTED
    assert await source.check("other") is Verdict.WRONG


# -- a sidecar in front of a recording engine --------------------------------------------------------


@dataclass
class Seen:
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests]


def recording_engine(seen: Seen) -> web.Application:
    """An engine that answers every route 200 (its /metrics 404) and records what reached it."""

    async def anything(request: web.Request) -> web.Response:
        seen.requests.append((request.method, request.path_qs, dict(request.headers)))
        if request.path == "/metrics":
            return web.Response(status=404)
        return web.json_response({"ok": True, "path": request.path})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    return app


@contextlib.asynccontextmanager
async def guarded_sidecar(engine_url: str, redis_url: str | None, **settings: object) -> AsyncIterator[str]:
    defaults: dict[str, object] = {"worker_id": "w0", "fleet": FLEET, "model": "m", "revision": "r"}
    defaults |= {"cache_tokens": 20_000, "publish_interval_s": 0.1}
    settings = {**defaults, **settings}
    config = SidecarConfig(engine_url=engine_url, redis_url=redis_url, port=0, **settings)  # type: ignore[arg-type]
    async with listening(config) as served:
        yield f"http://{LOOPBACK}:{served.port}"


@contextlib.asynccontextmanager
async def recorded(
    redis_url: str | None, **settings: object
) -> AsyncIterator[tuple[Seen, str, aiohttp.ClientSession]]:
    """A recording engine, a sidecar in front of it and a client: (what reached the engine, the
    sidecar's URL, the client)."""
    seen = Seen()
    async with (
        serve_aiohttp(recording_engine(seen)) as engine,
        guarded_sidecar(engine, redis_url, **settings) as sidecar,
        aiohttp.ClientSession() as http,
    ):
        yield seen, sidecar, http


def refused_counts(metrics_text: str) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "prefixfleet_sidecar_control_refused":
            return {s.labels["route"]: s.value for s in family.samples if s.name.endswith("_total")}
    raise AssertionError("no prefixfleet_sidecar_control_refused_total family")


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: object = None, token: str | None = None
) -> tuple[int, dict]:
    headers = token_header(token) if token is not None else {}
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def assert_refused(status: int, answer: dict, method: str, path: str) -> None:
    assert status == 401, answer
    error = answer["error"]
    assert (error["code"], error["param"]) == (401, CONTROL_HEADER)
    for word in (f"{method} {path}", CONTROL_HEADER, f"redis-cli GET pf:{FLEET}:control"):
        assert word in error["message"], error["message"]


async def test_control_routes_need_the_fleets_token_and_refusals_are_counted(
    redis_server: RedisServer,
) -> None:
    async with recorded(redis_server.url) as (seen, sidecar, http):
        token = await fleet_token(redis_server.url, FLEET)  # as the operator reads it
        for method, path, body in CONTROL_ROUTES:
            assert_refused(*await call(http, method, sidecar + path, body), method, path)
            assert_refused(*await call(http, method, sidecar + path, body, "not-the-token"), method, path)
            status, answer = await call(http, method, sidecar + path, body, token)
            assert status == (404 if "/prefix/" in path else 200), answer
        # read-only, for probes, drain checks and Prometheus: open
        status, answer = await call(http, "GET", sidecar + "/prefixfleet/status")
        assert status == 200 and answer["worker_id"] == "w0"
        for made_up in ("/made-up-1", "/made-up-2/x"):
            assert (await call(http, "POST", sidecar + made_up))[0] == 401
        async with http.get(sidecar + "/metrics") as resp:
            assert resp.status == 200
            counts = refused_counts(await resp.text())
    assert counts == {
        "/prefixfleet/state": 2,
        "/prefixfleet/warm": 2,
        "/prefixfleet/prefix/{hash}": 2,
        "/prefixfleet/hot": 2,
        "/prefixfleet/reset_rates": 2,
        OTHER_ROUTE: 2,  # not one label per made-up path
    }
    assert not [p for p in seen.paths() if p.startswith("/made-up")]  # refused before the engine


async def test_engine_admin_routes_need_the_token_data_plane_routes_do_not_and_it_never_reaches_the_engine(
    redis_server: RedisServer,
) -> None:
    async with recorded(redis_server.url, engine_api="sglang") as (seen, sidecar, http):
        token = await fleet_token(redis_server.url, FLEET)
        for method, path in [("POST", "/flush_cache"), ("POST", "/v1/load_lora_adapter"), ("POST", "/sleep"),
                             ("POST", "/update_weights_from_disk"), ("GET", "/flush%5Fcache")]:  # fmt: skip
            status, answer = await call(http, method, sidecar + path, {})
            assert status == 401, answer
            assert CONTROL_HEADER in answer["error"]["message"]
        assert not {"/flush_cache", "/v1/load_lora_adapter", "/sleep", "/update_weights_from_disk"} & set(
            seen.paths()
        )
        # with the token: forwarded, without it
        for path in ("/flush_cache", "/v1/load_lora_adapter", "/sleep"):
            status, answer = await call(http, "POST", sidecar + path, {}, token)
            assert (status, answer.get("path")) == (200, path), answer
        # the data plane, with and without a token: forwarded, no token header
        for method, path, body in [
            ("GET", "/v1/models", None), ("GET", "/get_model_info", None), ("GET", "/health", None),
            ("POST", "/tokenize", {"prompt": "x"}), ("POST", "/generate", {"text": "x"}),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1}),
        ]:  # fmt: skip
            for given in (None, token):
                status, answer = await call(http, method, sidecar + path, body, given)
                assert status == 200, (path, answer)
    reached = [(path, headers) for _, path, headers in seen.requests]
    forwarded = {"/flush_cache", "/v1/load_lora_adapter", "/sleep", "/tokenize", "/generate"}
    assert forwarded <= {p for p, _ in reached}
    assert all(CONTROL_HEADER.lower() not in {k.lower() for k in headers} for _, headers in reached)


async def raw_status(url: str, target: str) -> int:
    """The status a sidecar answers ``POST target`` with, the target sent as written (an HTTP client
    would resolve its dot segments first)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"prompt": "x", "max_tokens": 1}'
    head = f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    writer.write(head.encode() + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    status = int((await reader.readline()).split()[1])
    writer.close()
    return status


@pytest.mark.parametrize(
    "target",
    [
        "/flush_cache/../v1/completions",
        "/v1/models/..%2F..%2Fflush_cache",
        "/sleep/../generate",
        "/flush%5Fcache",
    ],
)
async def test_a_target_spelt_to_look_like_data_plane_needs_the_token(
    redis_server: RedisServer, target: str
) -> None:
    seen = Seen()
    async with (
        serve_aiohttp(recording_engine(seen)) as engine,
        guarded_sidecar(engine, redis_server.url, engine_api="sglang") as sidecar,
    ):
        assert await raw_status(sidecar, target) == 401
    assert not [p for p in seen.paths() if p not in ("/get_server_info", "/get_model_info", "/health")]


async def test_a_gateway_passes_no_token_on_either(redis_server: RedisServer) -> None:
    seen = Seen()
    async with (
        serve_aiohttp(recording_engine(seen)) as engine,
        guarded_sidecar(engine, redis_server.url, engine_api="sglang") as sidecar,
        gateway.listening(gateway.GatewayConfig(port=0, workers=(sidecar,))) as served,
        aiohttp.ClientSession() as http,
    ):
        front = f"http://{LOOPBACK}:{served.port}"
        token = await fleet_token(redis_server.url, FLEET)
        status, answer = await call(http, "POST", front + "/generate", {"text": "hi"}, token)
        assert status == 200, answer
    generated = [headers for _, path, headers in seen.requests if path == "/generate"]
    assert generated and all(CONTROL_HEADER.lower() not in {k.lower() for k in h} for h in generated)


async def test_a_flush_with_the_token_still_empties_the_mirror(
    redis_server: RedisServer, spawn: Spawner
) -> None:
    port = free_port()
    spawn(prefixfleet_argv("emulator", "--port", str(port), "--cache-tokens", "20000"), name="engine",
          ready_url=f"http://{LOOPBACK}:{port}/health")  # fmt: skip
    async with (
        guarded_sidecar(f"http://{LOOPBACK}:{port}", redis_server.url, cache_tokens=None) as sidecar,
        aiohttp.ClientSession() as http,
    ):
        token = await fleet_token(redis_server.url, FLEET)
        prompt = {"text": "the flushed prompt " * 20, "sampling_params": {"max_new_tokens": 1}}
        assert (await call(http, "POST", sidecar + "/generate", prompt))[0] == 200

        async def mirrored() -> int:
            return (await call(http, "GET", sidecar + "/prefixfleet/status"))[1]["load"]["cached_tokens"]

        assert await mirrored() > 0
        assert (await call(http, "POST", sidecar + "/flush_cache"))[0] == 401
        assert await mirrored() > 0  # refused: neither the engine nor the mirror flushed
        async with http.post(sidecar + "/flush_cache", headers=token_header(token)) as resp:
            assert resp.status == 200, await resp.text()  # SGLang's (and the emulator's) plain text
        assert await mirrored() == 0


async def test_a_rotation_is_picked_up_and_the_old_token_refused(redis_server: RedisServer) -> None:
    async with recorded(redis_server.url) as (_seen, sidecar, http):
        hot = sidecar + "/prefixfleet/hot"
        old = await fleet_token(redis_server.url, FLEET)
        assert (await call(http, "GET", hot, None, old))[0] == 200
        redis_server.client().delete(FleetKeys(FLEET).control)  # the documented rotation
        new = await fleet_token(redis_server.url, FLEET)  # the next reader (the operator) makes one
        assert new != old
        # the sidecar asks Redis again at most once a second: within a few seconds, not at once
        await eventually(lambda: call(http, "GET", hot, None, new), 10, "the new token to be accepted",
                         done=lambda answer: answer[0] == 200)  # fmt: skip
        assert (await call(http, "GET", hot, None, old))[0] == 401


async def test_a_rotated_token_kept_in_use_is_refused_within_the_bound(redis_server: RedisServer) -> None:
    """The old token sent again and again (a leaked token in use) stops working once the sidecar's
    reading of the key is older than REREAD_INTERVAL_S: a matching token is no reason to skip the
    read. (Before, only a request bringing another token made it read again, so this one never did.)"""
    async with recorded(redis_server.url) as (_seen, sidecar, http):
        hot = sidecar + "/prefixfleet/hot"
        old = await fleet_token(redis_server.url, FLEET)
        assert (await call(http, "GET", hot, None, old))[0] == 200
        redis_server.client().delete(FleetKeys(FLEET).control)  # rotated; nobody has read the new one
        answer = await eventually(
            lambda: call(http, "GET", hot, None, old),
            15,
            "the old token to be refused",
            done=lambda a: a[0] != 200,
        )
        assert answer[0] == 401, answer
        # the sidecar's read made the new token (SET NX): it is the one Redis holds, and accepted
        new = await fleet_token(redis_server.url, FLEET)
        assert new != old
        assert (await call(http, "GET", hot, None, new))[0] == 200
        assert (await call(http, "GET", hot, None, old))[0] == 401


async def test_no_token_known_and_redis_unreachable_is_a_503_naming_redis() -> None:
    seen = Seen()
    nowhere = f"redis://{LOOPBACK}:{free_port()}/0"  # nothing listens: connection refused
    async with (
        serve_aiohttp(recording_engine(seen)) as engine,
        guarded_sidecar(engine, nowhere) as sidecar,
        aiohttp.ClientSession() as http,
    ):
        for method, path, body in [*CONTROL_ROUTES[:2], ("POST", "/flush_cache", None)]:
            async with http.request(
                method, sidecar + path, json=body, headers=token_header("some-token")
            ) as resp:
                answer = await resp.json()
                assert resp.status == 503, answer
                assert resp.headers["Retry-After"] == "1"
            assert (
                "Redis" in answer["error"]["message"] and f"pf:{FLEET}:control" in answer["error"]["message"]
            )
            # no header at all: a 401 whatever Redis does
            assert (await call(http, method, sidecar + path, body))[0] == 401
    assert "/flush_cache" not in seen.paths()


async def test_a_standalone_sidecar_is_open_and_says_so_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PREFIXFLEET_CONTROL_TOKEN", raising=False)
    with caplog.at_level(logging.WARNING, logger="prefixfleet.sidecar"):
        async with recorded(None) as (seen, sidecar, http):
            for method, path, body in [
                *CONTROL_ROUTES[:2],
                CONTROL_ROUTES[3],
                ("POST", "/flush_cache", None),
            ]:
                assert (await call(http, method, sidecar + path, body))[0] == 200, path
    warnings = [r.getMessage() for r in caplog.records if "PREFIXFLEET_CONTROL_TOKEN" in r.getMessage()]
    assert len(warnings) == 1 and "open" in warnings[0], warnings
    assert "/flush_cache" in seen.paths()


@pytest.mark.parametrize("via", ["config", "env"])
async def test_a_standalone_sidecar_given_a_token_enforces_it(
    monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    settings: dict[str, object] = {}
    if via == "env":
        monkeypatch.setenv("PREFIXFLEET_CONTROL_TOKEN", "standalone-secret")
    else:
        monkeypatch.delenv("PREFIXFLEET_CONTROL_TOKEN", raising=False)
        settings["control_token"] = "standalone-secret"
    async with recorded(None, **settings) as (seen, sidecar, http):
        for method, path, body in [*CONTROL_ROUTES[:2], ("POST", "/flush_cache", None)]:
            status, answer = await call(http, method, sidecar + path, body, "wrong")
            assert status == 401 and "PREFIXFLEET_CONTROL_TOKEN" in answer["error"]["message"], answer
            assert (await call(http, method, sidecar + path, body, "standalone-secret"))[0] == 200
    assert seen.paths().count("/flush_cache") == 1  # the one with the token


def test_a_token_no_header_can_carry_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFIXFLEET_CONTROL_TOKEN", "with a space\n")
    with pytest.raises(ValueError, match="PREFIXFLEET_CONTROL_TOKEN"):
        Sidecar(SidecarConfig(engine_url="http://127.0.0.1:9", redis_url=None, port=1, worker_id="w0"))


async def test_prewarm_sends_the_sidecars_token_to_the_source(redis_server: RedisServer) -> None:
    fetches: list[dict[str, str]] = []

    async def source_prefix(request: web.Request) -> web.Response:
        fetches.append(dict(request.headers))
        return web.json_response({"error": {"message": "not held"}}, status=404)

    source_app = web.Application()
    source_app.router.add_get("/prefixfleet/prefix/{hash}", source_prefix)
    seen = Seen()
    async with (
        serve_aiohttp(recording_engine(seen)) as engine,
        serve_aiohttp(source_app) as source,
        guarded_sidecar(engine, redis_server.url) as sidecar,
        aiohttp.ClientSession() as http,
    ):
        token = await fleet_token(redis_server.url, FLEET)
        warm = {"source": source, "hashes": ["0123456789abcdef"], "hold_traffic": False}
        status, answer = await call(http, "POST", sidecar + "/prefixfleet/warm", warm, token)
        assert status == 200 and answer["results"]["0123456789abcdef"]["status"] == "failed", answer
    assert [f.get(CONTROL_HEADER) for f in fetches] == [token]
