"""The gateway: an OpenAI/SGLang-compatible entry point that routes each request by prefix and load.

Per request: validate and tokenize (:mod:`.requests`), score every routable worker from the fleet
view (summaries + load from Redis, plus this gateway's own recent sends, :mod:`.view`), let the
policy choose, forward to the worker's sidecar and stream the answer back. A worker that refuses the
connection (or whose engine did) is skipped and the request re-sent elsewhere; one that took the
request and then died is re-sent only within ``resends_after_receipt`` (the request may be what
killed it); a stream that already started ends with an SSE error event instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import math
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import aiohttp
import redis.asyncio as aioredis
import yarl
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prefixfleet.cancellation import cancel_and_wait

from .blockhash import DEFAULT_BLOCK_TOKENS
from .front import ClientStalled, FrontServing, HotRequest, HotStream, serving_front
from .gateway_metrics import GatewayMetrics
from .hotspots import rank_hot_subtrees
from .keys import DEFAULT_FLEET, FleetKeys
from .loadtrack import DEFAULT_PREFILL_TOKENS_PER_S
from .policies import DEFAULT_POLICY, CostModel, NoReplicaError, RouteRequest, RoutingPolicy, make_policy
from .proxying import (
    RETRYABLE_HEADER,
    WORKER_HEADER,
    Answer,
    AnyRequest,
    answer_headers,
    body_guards,
    error_message,
    failure_text,
    forward_header_pairs,
    is_error_event,
    json_error,
    json_route_errors,
    open_stream,
    request_target,
    sse_error_event,
    stream_writer,
    whole_events,
)
from .records import (
    SENDS_MAGIC,
    WITHDRAW_MAGIC,
    WORKER_STATES,
    SendWithdrawal,
    decode_load_push,
    decode_sends_message,
    encode_send,
    encode_withdraw,
    split_member_fields,
)
from .redis_conn import connect_redis, redis_error_text
from .request_ids import DEFAULT_REQUEST_ID_HEADERS, REQUEST_ID_HEADER, request_id_for, upstream_header_pairs
from .requests import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_PROMPT_TOKENS,
    GENERATE_PATHS,
    BadRequest,
    InferenceRequest,
    inference_request,
    load_json_body,
    parse_inference_request,
)
from .served import merge_model_lists, model_list_ids, workers_to_ask
from .slow_clients import ClientTimeouts
from .tenancy import checked_tenant, salted_body
from .upstream import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_RESENDS_AFTER_RECEIPT,
    RECEIVED_MARK,
    Origin,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    reached_upstream,
    read_timeout_from_env,
    split_url,
)
from .view import DEFAULT_DEAD_AFTER_S, DEFAULT_OVERLAY_TTL_S, SUSPECT_S, FleetView, WorkerView

log = logging.getLogger("prefixfleet.gateway")
CLIENT_CLOSED_REQUEST = 499  # nginx's code for a client that left before its answer
_SHARE_COALESCE_S = 0.01  # send notices wait at most this long to share a publish round trip
_RETRY_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)
# Retry-After on a 503: the earliest a retry can find a worker that was not there. A worker that
# failed sits out SUSPECT_S (2 s); a member joining or leaving draining shows within a refresh
# (0.2 s). Clients (the OpenAI SDKs) honour it and back off on their own when it stays unavailable.
RETRY_AFTER_S = math.ceil(SUSPECT_S)


@dataclass(frozen=True, slots=True)
class _Arrival:
    """What the outermost middleware notes of an aiohttp-served request, for its handler and body
    errors (same task: aiohttp runs each request in a task of its own, with a copy of the context)."""

    request: web.Request
    request_id: str
    arrived: float  # time.perf_counter()


@dataclass(frozen=True, slots=True)
class _Inbound:
    """A generation request on its way to a worker: what every attempt at sending it needs."""

    request: AnyRequest
    body: bytes  # as forwarded (salted under tenant isolation)
    started: float  # time.perf_counter() at arrival
    rid: str  # its id (the client's or generated): upstream, in the answer, in log lines


@dataclass(slots=True)
class _Pick:
    """A routing decision: where a request goes, and the figures its metrics record once the request
    is on its way (:meth:`Gateway._note_decision`), off the path between its arrival and its send."""

    worker: WorkerView
    chain: list[int]  # the request's block hashes under the worker's cache name
    key: tuple[int, int]  # that name: (identity seed, block size), FleetView.request_key
    uncached: int  # prompt tokens the worker is expected to prefill
    matched_blocks: int
    reason: str
    matched_tokens: int
    num_tokens: int
    decided_s: float  # scoring + policy time
    noted: bool = False


_arrival: contextvars.ContextVar[_Arrival | None] = contextvars.ContextVar("gateway_arrival", default=None)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    port: int
    redis_url: str | None = None
    host: str = "127.0.0.1"
    fleet: str = DEFAULT_FLEET
    policy: str = DEFAULT_POLICY
    policy_params: dict[str, float] = field(default_factory=dict)
    workers: tuple[str, ...] = ()
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    refresh_interval_s: float = 0.2
    dead_after_s: float = DEFAULT_DEAD_AFTER_S
    overlay_ttl_s: float = DEFAULT_OVERLAY_TTL_S
    max_retries: int = DEFAULT_MAX_RETRIES
    health_interval_s: float = 2.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    upstream_timeout_s: float | None = None  # whole-request limit; None = unlimited (long generations)
    # of those, re-sends of a request a worker may have received before failing (its engine broke off
    # or died mid-request); 0: never re-sent
    resends_after_receipt: int = DEFAULT_RESENDS_AFTER_RECEIPT
    tenant_header: str | None = None  # isolation on: the tenant (cache_salt) comes from this header only
    client_write_timeout_s: float | None = None  # None: PREFIXFLEET_CLIENT_WRITE_TIMEOUT_S, else 60 s
    # where a client's request id is read, first present first (SGLang router's --request-id-headers)
    request_id_headers: tuple[str, ...] = DEFAULT_REQUEST_ID_HEADERS


# OpenAI's model list and model (``client.models.retrieve``), SGLang's model and server information
# (its frontend's RuntimeEndpoint reads /get_model_info when created; /model_info is the newer name)
INFO_PATHS = (
    "/v1/models",
    "/v1/models/{model:.+}",
    "/get_model_info",
    "/model_info",
    "/get_server_info",
    "/server_info",
    "/version",  # vLLM's {"version": ...} (vllm/entrypoints/openai/api_server.py)
)
# Tokenizer routes, read-only too but POST: vLLM's /tokenize and /detokenize (api_server.py), and
# SGLang's, which also answers them under /v1 (python/sglang/srt/entrypoints/http_server.py)
INFO_POST_PATHS = ("/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize")


def unavailable(message: str) -> web.Response:
    """503 in the OpenAI error shape, telling the client when a retry can succeed."""
    response = json_error(503, message, kind="service_unavailable")
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


def worker_received(headers: CIMultiDict[str]) -> bool:
    """Whether a sidecar's retryable 502 says its engine failed after the request may have reached it."""
    return headers.get(RETRYABLE_HEADER) == RECEIVED_MARK


def worker_refused(status: int, headers: CIMultiDict[str]) -> bool:
    """Whether a worker's whole answer says it did not take the request, so that re-sending it
    elsewhere is safe: a sidecar's retryable 502/503 (its engine failed before answering), or any
    503 (an engine refusing work: SGLang's full request queue, an engine not running; before, it
    went to the client while other workers were free). A 500 or 502 from an engine may follow work
    done, or fail the same way everywhere: passed on."""
    return status == 503 or (status == 502 and bool(headers.get(RETRYABLE_HEADER)))


class _Retryable(Exception):
    """The worker failed before the client saw anything: the request may go elsewhere.
    ``answer``: the worker's own answer (a 503), what the client gets if no other worker is left.
    ``received``: the worker (or its engine) may have taken the request before failing, so it is
    re-sent only within ``resends_after_receipt`` (the prompt may be what made it fail)."""

    def __init__(self, message: str, answer: web.Response | None = None, *, received: bool = False) -> None:
        super().__init__(message)
        self.answer = answer
        self.received = received


def _failed_after_send(exc: BaseException) -> _Retryable:
    """A failure once the request was written: received unless it failed to connect (a stale
    keep-alive connection's reconnect)."""
    return _Retryable(failure_text(exc), received=reached_upstream(exc))


class _StreamAbandoned(Exception):
    """The client stopped reading its stream (its connection is closed); ``response`` was begun."""

    def __init__(self, response: Answer) -> None:
        super().__init__("the client stopped reading its stream")
        self.response = response


class _WarnOnce:
    """Log a repeated warning at most once a minute (malformed Redis records recur every refresh)."""

    def __init__(self, period_s: float = 60.0) -> None:
        self.period_s = period_s
        self._last: dict[str, float] = {}

    def __call__(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(message, float("-inf")) >= self.period_s:
            self._last[message] = now
            log.warning("%s", message)
            if len(self._last) > 1000:
                self._last.clear()


class Gateway:
    def __init__(self, config: GatewayConfig) -> None:
        if not config.redis_url and not config.workers:
            raise ValueError("a gateway needs --redis or at least one --worker")
        self.config = config
        self.keys = FleetKeys(config.fleet)
        self.cost = CostModel(prefill_s_per_token=1.0 / config.prefill_tokens_per_s)
        self.policy: RoutingPolicy = make_policy(config.policy, self.cost, **config.policy_params)
        self.view = FleetView(
            block_tokens=config.block_tokens,
            dead_after_s=config.dead_after_s,
            overlay_ttl_s=config.overlay_ttl_s,
            default_prefill_tokens_per_s=config.prefill_tokens_per_s,
            fleet=config.fleet,
        )
        for url in config.workers:
            self.view.add_static(url)
        self.metrics = GatewayMetrics()
        self.timeouts = ClientTimeouts.from_env(write_s=config.client_write_timeout_s)
        self.session: aiohttp.ClientSession | None = None  # health checks and /v1/models
        self.upstream: UpstreamPool | None = None  # the generation hot path
        self._read_timeout_s = read_timeout_from_env()  # a bad value fails here, at start
        self._origins: dict[str, tuple[Origin, str]] = {}
        self._ranked_versions: tuple[tuple[str, int, float], ...] | None = None
        # the members the last refresh read, and their load keys then their engine keys (read with
        # the members hash)
        self._known_members: tuple[tuple[str, ...], list[str]] = ((), [])
        self.redis: aioredis.Redis | None = None
        self.redis_ok = True
        self._warn = _WarnOnce()
        self._tasks: list[asyncio.Task[None]] = []
        # own sends told to the other gateways (published off the request path, batched)
        self.gateway_id = uuid.uuid4().hex[:12]
        self._own_id_line = f"{self.gateway_id}\n".encode()  # after the 4-byte magic of our messages
        self._shares: list[bytes] = []
        self._peers_listening = True  # until the first refresh counts the sends channel's listeners
        self._sends_subscribed = False
        self._share_ready = asyncio.Event()
        self._sharing_ok = True  # the last publish on the sends channel worked (logged on change)
        self._withdrawals_lost = 0  # since sharing last failed: told when it works again

    # -- lifecycle -------------------------------------------------------------------------------

    def app(self) -> web.Application:
        guards = body_guards(self.timeouts, self._body_error)
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[self._request_ids, json_route_errors, *guards.middlewares],
        )
        expect = guards.expect_handler
        for path in GENERATE_PATHS:
            app.router.add_post(path, self.handle_generate, expect_handler=expect)
        # read-only engine information, from any live worker: what clients ask before generating
        for path in INFO_PATHS:
            app.router.add_get(path, self.handle_models)
        for path in INFO_POST_PATHS:
            app.router.add_post(path, self.handle_models, expect_handler=expect)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/livez", self.handle_livez)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/prefixfleet/view", self.handle_view)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=self.config.upstream_timeout_s, sock_connect=2),
            auto_decompress=False,
        )
        self.upstream = UpstreamPool(connect_timeout_s=2.0, read_timeout_s=self._read_timeout_s)
        if self.config.redis_url:
            self.redis = connect_redis(self.config.redis_url, timeout_s=1.0)
            with contextlib.suppress(Exception):
                await self.refresh_once()  # route on a real view from the first request
            self._tasks.append(asyncio.create_task(self._refresh_loop()))
            self._tasks.append(asyncio.create_task(self._load_push_loop()))
            self._tasks.append(asyncio.create_task(self._share_loop()))
        if self.config.workers:
            self._tasks.append(asyncio.create_task(self._health_loop()))

    async def _on_cleanup(self, _app: web.Application) -> None:
        for task in await cancel_and_wait(self._tasks):
            log.warning("gateway shutdown: background task %s did not stop; leaving it", task.get_name())
        if self.redis is not None:
            with contextlib.suppress(Exception):
                await self.redis.aclose()
        if self.upstream is not None:
            self.upstream.close()
        if self.session is not None:
            await self.session.close()

    # -- fleet view maintenance ------------------------------------------------------------------

    def _record_keys(self, ids: Sequence[str]) -> list[str]:
        """The load keys of ``ids``, then their engine keys: one MGET reads both."""
        return [self.keys.load(w) for w in ids] + [self.keys.engine(w) for w in ids]

    @staticmethod
    def _loads_and_engines(
        ids: Sequence[str], values: Sequence[bytes | None]
    ) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
        """The answer of an MGET of ``_record_keys(ids)``, split by worker into load and engine records."""
        n = len(ids)
        return dict(zip(ids, values[:n], strict=True)), dict(zip(ids, values[n:], strict=True))

    async def refresh_once(self) -> None:
        assert self.redis is not None
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.members)
        pipe.pubsub_numsub(self.keys.sends)  # same round trip: is any peer listening to our sends?
        # and the load records of the members the last refresh saw: one round trip, not two (redis-py
        # spends ~0.5 ms of CPU on one here, five times a second); a member new since is read after
        # With each load record, in the same MGET, its engine record (written by --no-self-register
        # sidecars, whose member record the operator writes without their engine's adapters).
        known, record_keys = self._known_members
        if known:
            pipe.mget(record_keys)
        members, listeners, *known_records = await pipe.execute()
        self._note_send_listeners(listeners)
        members_s, invalid = split_member_fields(members)
        for _, name in invalid:  # e.g. not UTF-8: it failed every refresh, freezing the whole view
            self._warn(f"ignoring member {name!r} of {self.keys.members}: not a valid worker id")
        ids = tuple(members_s)
        loads, engines = self._loads_and_engines(known, known_records[0]) if known else ({}, {})
        new = [w for w in ids if w not in loads]
        if new:
            fetched = await self.redis.mget(self._record_keys(new))
            more_loads, more_engines = self._loads_and_engines(new, fetched)
            loads.update(more_loads)
            engines.update(more_engines)
        if ids != known:
            self._known_members = (ids, self._record_keys(ids))
        result = self.view.apply_snapshot(
            members_s, {w: loads[w] for w in ids}, time.monotonic(), {w: engines[w] for w in ids}
        )
        for message in result.warnings:
            self._warn(message)
        if result.need_summaries:
            raws = await self.redis.mget([self.keys.summary(w) for w in result.need_summaries])
            for wid, raw in zip(result.need_summaries, raws, strict=True):
                warning = self.view.apply_summary(wid, raw)
                if warning:
                    self._warn(warning)
        for wid in result.removed:
            self.policy.on_replica_removed(wid)
            self.metrics.forget_worker(wid)
        self._after_refresh()

    def _after_refresh(self) -> None:
        wall = time.time()
        now = time.monotonic()
        self.view.prune_overlays(wall)
        routable = {w.worker_id for w in self.view.routable(now)}
        self.metrics.workers.labels("routable").set(len(routable))
        self.metrics.workers.labels("unroutable").set(len(self.view.workers) - len(routable))
        for state in WORKER_STATES:
            in_state = sum(1 for w in self.view.workers.values() if w.state == state)
            self.metrics.workers_in_state.labels(state).set(in_state)
        summaries = [w.summary for w in self.view.workers.values() if w.summary is not None]
        versions = tuple((s.worker, s.version, s.generated_at) for s in summaries)
        if versions != self._ranked_versions:  # re-rank only when a summary changed
            self._ranked_versions = versions
            self.metrics.set_hot_subtrees(rank_hot_subtrees(summaries))
        rates = []
        for w in self.view.workers.values():
            unreported = sum(1 for s in w.sends.values() if w.load is None or s.sent_at > w.load.ts)
            self.metrics.worker_in_flight.labels(w.worker_id).set(
                (w.load.in_flight if w.load else 0) + unreported
            )
            if w.summary is not None:
                self.metrics.summary_staleness.labels(w.worker_id).set(
                    max(wall - w.summary.generated_at, 0.0)
                )
            if w.load is not None and w.load.prefill_tokens_per_s > 0:
                rates.append(w.load.prefill_tokens_per_s)
        if rates:
            # Keep the policy's token->seconds conversion in the same units as the measured waits.
            rate = statistics.median(rates)
            current = 1.0 / self.cost.prefill_s_per_token
            if abs(rate - current) > 0.1 * current:
                self.cost = dataclasses.replace(self.cost, prefill_s_per_token=1.0 / rate)
                self.policy.cost = self.cost

    async def _load_push_loop(self) -> None:
        """Apply the load records sidecars push on the loads channel as they arrive.

        Polling alone leaves each gateway blind to the others' sends for up to a publish plus a
        refresh interval, and gateways sharing a fleet then herd onto the same replica. Membership
        and summaries still come from the polling refresh; this only keeps load fresh.
        """
        assert self.redis is not None
        backoff = 0.2  # before subscribing again: doubles while failures persist, up to 2 s
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.keys.loads, self.keys.sends)
                self._sends_subscribed = True
                while True:
                    message = await pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._apply_channel_message(message)
                    backoff = 0.2
            except (aioredis.RedisError, OSError, TimeoutError):
                pass  # the refresh loop reports the outage
            except Exception:  # a bug must not end the subscription: loads would then only be polled
                log.exception(
                    "load push subscriber failed unexpectedly; subscribing again in %.1f s", backoff
                )
            finally:
                self._sends_subscribed = False
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def _apply_channel_message(self, message: dict) -> None:
        data = message.get("data")
        if not isinstance(data, bytes | str):
            return
        if _channel(message) == self.keys.sends:
            self._apply_peer_send(data)
            return
        try:
            push = decode_load_push(data)
        except ValueError as exc:
            self._warn(f"ignoring a malformed message on the loads channel: {exc}")
            return
        self.view.apply_load(push.worker, push.load, time.monotonic())

    def _apply_peer_send(self, data: bytes | str) -> None:
        if isinstance(data, bytes) and data.startswith(self._own_id_line, len(SENDS_MAGIC)):
            return  # our own notice (or withdrawal) back from the channel
        try:
            notice = decode_sends_message(data)
        except ValueError as exc:
            self._warn(f"ignoring a malformed message on the sends channel: {exc}")
            return
        if notice.gateway == self.gateway_id:
            return
        if isinstance(notice, SendWithdrawal):
            # only the entries that send stamped (same worker and send time) are dropped; none when
            # its notice never reached us, or a summary, the TTL or a later send replaced them
            dropped = self.view.release_send(notice.worker, notice.hashes, notice.sent_at)
            self.metrics.peer_send_withdrawals.labels("applied" if dropped else "unknown").inc()
        else:
            self.view.record_peer_send(notice.worker, notice.hashes, notice.sent_at)

    def _note_send_listeners(self, numsub: object) -> None:
        """Share sends only while someone besides this gateway listens on the sends channel: a lone
        gateway would pay a publish and its own echo per request (~0.35 ms CPU) to tell nobody."""
        try:
            count = int(numsub[0][1])  # type: ignore[index]  # [(channel, subscribers)]
        except (TypeError, ValueError, IndexError):
            self._peers_listening = True  # unknown: share, as without this check
            return
        self._peers_listening = count - (1 if self._sends_subscribed else 0) > 0

    def _share_send(self, worker_id: str, chain: list[int], wall: float) -> bool:
        """Queue a send notice for the peers; whether one was queued (only then is a withdrawal due)."""
        if self.redis is not None and chain and self._peers_listening:
            self._shares.append(encode_send(self.gateway_id, worker_id, wall, chain))
            self._share_ready.set()
            return True
        return False

    def _withdraw_send(self, worker_id: str, blocks: list[int], wall: float, shared: bool) -> None:
        """The send made at ``wall`` ended before the engine's first token, so the engine most likely
        never cached ``blocks`` (its chain past what was already matched there): stop counting them,
        here and, if the send was shared, at the peers (queued after its notice: same order)."""
        self.view.release_send(worker_id, blocks, wall)
        if shared and blocks:
            self._shares.append(encode_withdraw(self.gateway_id, worker_id, wall, blocks))
            self._share_ready.set()

    async def _share_loop(self) -> None:
        """Publish own sends on the sends channel, so other gateways count them before a summary."""
        assert self.redis is not None
        backoff = 0.2  # after an unexpected error: doubles while it persists, up to 2 s
        while True:
            await self._share_ready.wait()
            # Gather the sends of the next few ms into one pipeline (one round trip, not one per send).
            await asyncio.sleep(_SHARE_COALESCE_S)
            self._share_ready.clear()
            batch, self._shares = self._shares, []
            withdrawals = sum(1 for message in batch if message.startswith(WITHDRAW_MAGIC))
            try:
                pipe = self.redis.pipeline(transaction=False)
                for notice in batch:
                    pipe.publish(self.keys.sends, notice)
                await pipe.execute()
                backoff = 0.2
            except (aioredis.RedisError, OSError, TimeoutError) as exc:
                self._sharing_failed(batch, withdrawals, exc)
                await asyncio.sleep(0.2)  # best effort: summaries still carry the prefixes
                continue
            except Exception as exc:  # a bug must not end sharing: peers would then route blind to our sends
                log.exception("sharing sends failed unexpectedly; %d dropped", len(batch))
                self._sharing_failed(batch, withdrawals, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self.metrics.send_withdrawals.labels("published").inc(withdrawals)
            if not self._sharing_ok:
                log.warning(
                    "sends channel publishing again (%d send withdrawals were lost meanwhile)",
                    self._withdrawals_lost,
                )
                self._sharing_ok = True
                self._withdrawals_lost = 0

    def _sharing_failed(self, batch: list[bytes], withdrawals: int, exc: BaseException) -> None:
        """A publish round lost ``batch``: counted, and logged once per outage (not per request)."""
        self.metrics.send_withdrawals.labels("failed").inc(withdrawals)
        self._withdrawals_lost += withdrawals
        if self._sharing_ok:
            self._sharing_ok = False
            log.warning(
                "publishing on the sends channel failed (%s): %d send notices and %d withdrawals "
                "lost; peers keep counting lost withdrawals' sends as hits until a summary or the "
                "overlay TTL (%g s). Not logged again until publishing works",
                redis_error_text(exc),
                len(batch) - withdrawals,
                withdrawals,
                self.config.overlay_ttl_s,
            )

    async def _refresh_loop(self) -> None:
        backoff = 0.5  # after an unexpected error: doubles while it persists, up to 5 s
        while True:
            pause = self.config.refresh_interval_s
            try:
                await self.refresh_once()
                self.metrics.redis_up.set(1)
                if not self.redis_ok:
                    log.warning("redis reachable again: fleet view refreshing")
                    self.redis_ok = True
                backoff = 0.5
            except (aioredis.RedisError, OSError, TimeoutError) as exc:
                self.view.refresh_failed()
                self.metrics.redis_up.set(0)
                if self.redis_ok:
                    log.warning("redis unavailable (%s): routing on the last view", redis_error_text(exc))
                    self.redis_ok = False
            except Exception:  # a bug must not stop the refresh loop (nor log a traceback 5 times a second)
                pause = max(pause, backoff)
                log.exception("fleet view refresh failed; next refresh in %.1f s", pause)
                backoff = min(backoff * 2, 5.0)
            await asyncio.sleep(pause)

    async def _health_loop(self) -> None:
        """Health-check static workers (sidecar workers report their engine's health themselves)."""
        assert self.session is not None
        while True:
            for w in [w for w in self.view.workers.values() if w.static]:
                try:
                    async with self.session.get(
                        f"{w.url}/health", timeout=aiohttp.ClientTimeout(total=2)
                    ) as resp:
                        await resp.read()
                        w.healthy = resp.status == 200
                except (aiohttp.ClientError, OSError, TimeoutError):
                    w.healthy = False
                except Exception:  # a bug must not end the checks: every worker's health would freeze
                    log.exception("health check of %s failed unexpectedly: health left as it was", w.url)
            # The worker gauges and overlay pruning otherwise follow only a Redis refresh: a gateway
            # without Redis had no prefixfleet_gateway_workers series at all, whatever its health.
            try:
                self._after_refresh()
            except Exception:  # as above: the checks go on
                log.exception("updating the worker figures after health checks failed unexpectedly")
            await asyncio.sleep(self.config.health_interval_s)

    # -- request handling ------------------------------------------------------------------------

    def _request_id(self, request: AnyRequest) -> str:
        """The request's id: the client's, else a generated one. For an aiohttp-served request the
        one its middleware noted, so the middleware, the handler and a body error name the same id;
        a front request's is made once and kept on it (:meth:`handle_generate` passes it on; the
        front's 408 and 500 name it)."""
        noted = _arrival.get()
        if noted is not None and noted.request is request:
            return noted.request_id
        if isinstance(request, HotRequest):
            # kept on the request: the front's own 500 after a handler failed names the id the
            # handler had used (and sent upstream), not another generated one
            if request.request_id is None:
                request.request_id = request_id_for(
                    request.headers, self.config.request_id_headers, request.path
                )
            return request.request_id
        # an Expect handler's 413 (it runs before the middlewares)
        return request_id_for(request.headers, self.config.request_id_headers, request.path)

    def _upstream_headers(self, request: AnyRequest, rid: str) -> list[tuple[str, str]]:
        """What goes upstream: the client's end-to-end headers, the request id, X-Forwarded-*."""
        scheme = "http" if isinstance(request, HotRequest) else request.scheme
        return upstream_header_pairs(forward_header_pairs(request.headers), rid, request.remote, scheme)

    @web.middleware
    async def _request_ids(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Outermost middleware of the requests aiohttp serves: every answer names the request's id
        (the lean front's requests get theirs in :meth:`handle_generate`), and the arrival time is
        kept for a body refused before any handler ran (:meth:`_body_error`)."""
        arrived = time.perf_counter()
        rid = request_id_for(request.headers, self.config.request_id_headers, request.path)
        _arrival.set(_Arrival(request, rid, arrived))
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            exc.headers[REQUEST_ID_HEADER] = rid
            raise
        if not response.prepared:  # a stream (or a drained refusal) named it when it began
            response.headers[REQUEST_ID_HEADER] = rid
        return response

    def _body_error(self, request: AnyRequest, status: int, message: str) -> web.Response:
        """A body too slow (408), too large (413) or in a coding not taken (415), refused before any
        handler ran: counted as an answered request, duration included, like every other."""
        self.metrics.errors.labels("bad_request").inc()
        noted = _arrival.get()
        if noted is not None and noted.request is request:
            seconds = time.perf_counter() - noted.arrived
        else:
            # The front's 408 fires the body limit after the head arrived; an Expect handler's 413
            # answers the head itself, before any middleware could note its arrival.
            seconds = self.timeouts.body_s if status == 408 else 0.0
        endpoint = request.path if request.path in GENERATE_PATHS else "other"
        self.metrics.request_answered(endpoint, status, seconds)
        response = json_error(status, message, param="body")
        response.headers[REQUEST_ID_HEADER] = self._request_id(request)
        return response

    def _answer(self, endpoint: str, response: Answer, started: float) -> Answer:
        self.metrics.request_answered(endpoint, response.status, time.perf_counter() - started)
        return response

    async def handle_generate(self, request: AnyRequest) -> Answer:
        started = time.perf_counter()
        endpoint = request.path
        rid = self._request_id(request)
        response = await self._generate(request, endpoint, started, rid)
        if not isinstance(response, HotStream) and not response.prepared:
            response.headers[REQUEST_ID_HEADER] = rid  # a stream named it as it began
        return response

    async def _generate(self, request: AnyRequest, endpoint: str, started: float, rid: str) -> Answer:
        body = await request.read()  # within the limit: body_deadline read it (or the front did)
        try:
            if self.config.tenant_header:
                header = self.config.tenant_header
                tenants = request.headers.getall(header, [])
                if len(tenants) > 1:  # a client's own value beside the proxy's: neither can be trusted
                    raise BadRequest(
                        f"header {header} must be sent once, not {len(tenants)} times", param=header
                    )
                tenant = checked_tenant(tenants[0] if tenants else None, header)
                # parsed once: the salted value is both forwarded and validated
                obj = load_json_body(body)
                if isinstance(obj, dict):
                    body = salted_body(obj, tenant)
                parsed = inference_request(endpoint, obj, max_prompt_tokens=self.config.max_prompt_tokens)
            else:
                parsed = parse_inference_request(
                    endpoint, body, max_prompt_tokens=self.config.max_prompt_tokens
                )
        except BadRequest as exc:
            self.metrics.errors.labels("bad_request").inc()
            return self._answer(endpoint, json_error(exc.status, str(exc), param=exc.param), started)
        try:
            response = await self._route_and_forward(_Inbound(request, body, started, rid), parsed)
        except asyncio.CancelledError:
            # The client left before its answer began (the front cancels the handler so the engine
            # aborts): still a request, counted under nginx's 499 "client closed request".
            self.metrics.request_answered(endpoint, CLIENT_CLOSED_REQUEST, time.perf_counter() - started)
            raise
        except _StreamAbandoned as exc:
            # Counted as a client that left (the request was aborted upstream the same way).
            log.info(
                "request %s: client of %s read nothing of its stream for %g s: connection closed, "
                "request aborted",
                rid,
                endpoint,
                self.timeouts.write_s,
            )
            self.metrics.request_answered(endpoint, CLIENT_CLOSED_REQUEST, time.perf_counter() - started)
            return exc.response
        return self._answer(endpoint, response, started)

    def _decide(self, parsed: InferenceRequest, excluded: set[str]) -> _Pick | None:
        t0 = time.perf_counter()
        now = time.monotonic()
        wall = time.time()
        # the model is matched before the exclusions (and before suspects are set aside): a retry
        # stays among the workers that serve it, rather than going on to one that does not
        workers = [w for w in self.view.routable(now, parsed.model) if w.worker_id not in excluded]
        if not workers:
            return None
        model, lora_path = parsed.adapter_model, parsed.lora_path  # what names a LoRA adapter
        hashes = self.view.request_hashes(parsed.token_bytes, parsed.tenant_salt, workers, model, lora_path)
        rows = self.view.replica_states(workers, hashes, parsed.num_tokens, wall, model, lora_path)
        route = RouteRequest(
            tokens=parsed.token_bytes,
            num_tokens=parsed.num_tokens,
            now=wall,
            namespace=self.view.route_namespace(workers, model, lora_path, parsed.tenant_salt),
            max_new_tokens=parsed.max_new_tokens,
        )
        try:
            decision = self.policy.choose(route, rows)
        except NoReplicaError:
            return None
        self.policy.on_routed(route, decision)
        chosen = self.view.workers[str(decision.replica_id)]
        row = next(r for r in rows if r.replica_id == decision.replica_id)
        key = self.view.request_key(chosen, model, lora_path)
        return _Pick(
            worker=chosen,
            chain=hashes[key],
            key=key,
            uncached=parsed.uncached_tokens(row.matched_tokens),
            matched_blocks=row.matched_tokens // key[1],
            reason=decision.reason,
            matched_tokens=row.matched_tokens,
            num_tokens=parsed.num_tokens,
            decided_s=time.perf_counter() - t0,
        )

    def _note_decision(self, pick: _Pick) -> None:
        """Record a decision's metrics, once: right after its request was written to the worker (the
        worker is busy with it meanwhile), or as its attempt ends if it never was. A failure here is
        logged, never the request's."""
        if pick.noted:
            return
        pick.noted = True
        try:
            self.metrics.decision_latency.observe(pick.decided_s)
            self.metrics.routed(
                self.policy.name, pick.reason, pick.worker.worker_id, pick.num_tokens, pick.matched_tokens
            )
            self.metrics.matched_ratio.observe(
                pick.matched_tokens / pick.num_tokens if pick.num_tokens else 0.0
            )
        except Exception:
            log.exception("recording a routing decision's metrics failed")

    async def _route_and_forward(self, inbound: _Inbound, parsed: InferenceRequest) -> Answer:
        rid = inbound.rid
        excluded: set[str] = set()
        last_error = "no worker is available"
        refused: web.Response | None = None  # the latest worker's own 503, if one answered so
        received = 0  # failures after a worker may have taken the request
        for attempt in range(self.config.max_retries + 1):
            pick = self._decide(parsed, excluded)
            if pick is None:
                break
            worker, chain = pick.worker, pick.chain
            if attempt:
                self.metrics.retries.inc()
            wall = time.time()
            handle = self.view.record_send(worker.worker_id, chain, pick.uncached, wall, pick.key)
            # Not for a static worker: its id is a URL from this gateway's flags, which peers do not
            # share and a notice's worker field does not admit (encoding it failed the request).
            shared = not worker.static and self._share_send(worker.worker_id, chain, wall)
            # Set once the worker's first token arrived (a streamed 200's first byte, unless an error
            # event: the prompt is prefilled) or its whole 200 answer. A send that ends without it is
            # withdrawn (here and at the peers), as the sidecar withdraws the prompt from its mirror:
            # no gateway then routes the prefix there as a hit the engine never computed.
            prefilled = [False]
            try:
                return await self._forward(inbound, pick, prefilled)
            except _Retryable as exc:
                last_error = f"worker {worker.worker_id} failed: {exc}"
                if exc.answer is None:
                    self.view.mark_failed(worker.worker_id, time.monotonic())
                else:
                    # It answered (busy, not gone): the others first for a while, but it is not
                    # dropped, so a fleet of one still gets its engine's answer, not "no worker".
                    refused = exc.answer
                    worker.suspect_until = max(worker.suspect_until, time.monotonic() + SUSPECT_S)
                for h in chain:
                    worker.overlay.pop(h, None)
                excluded.add(worker.worker_id)
                received += exc.received
                if exc.received and received > self.config.resends_after_receipt:
                    # a query of death would take down one engine per re-send: the client is told
                    log.warning("request %s: %s after taking the request; not re-sent", rid, last_error)
                    self.metrics.errors.labels("upstream").inc()
                    return json_error(
                        502,
                        f"{last_error} after it may have received the request; not re-sent, as the "
                        f"request may be what made it fail ({received} worker(s) failed so)",
                        kind="upstream_error",
                    )
                if exc.answer is not None and not self._unsuspected_left(excluded, parsed.model):
                    # every other worker failed or refused work lately: re-sending would only add
                    # load to a busy fleet (each request asking every engine), so its 503 goes out
                    log.info("request %s: %s; no other worker is free", rid, last_error)
                    break
                log.info("request %s: %s; retrying elsewhere", rid, last_error)
            finally:
                self._note_decision(pick)  # when the request was never written (else a no-op)
                # failed and retried, client left, or an error answer (or a timeout) before the first token
                if not prefilled[0]:
                    self._withdraw_send(worker.worker_id, chain[pick.matched_blocks :], wall, shared)
                self.view.record_done(worker.worker_id, handle, time.time())
        kind = "no_worker" if not excluded else "upstream"
        self.metrics.errors.labels(kind).inc()
        return unavailable(last_error) if refused is None else refused

    def _unsuspected_left(self, excluded: set[str], model: str | None) -> bool:
        """Whether a routable worker for ``model`` not tried yet has not failed nor refused work lately."""
        now = time.monotonic()
        return any(
            w.suspect_until <= now and w.worker_id not in excluded for w in self.view.routable(now, model)
        )

    def _origin(self, url: str) -> tuple[Origin, str]:
        found = self._origins.get(url)
        if found is None:
            found = split_url(url)
            if len(self._origins) > 4096:  # worker URLs churn with the fleet: keep the cache bounded
                self._origins.clear()
            self._origins[url] = found
        return found

    async def _forward(self, inbound: _Inbound, pick: _Pick, prefilled: list[bool]) -> Answer:
        worker = pick.worker
        if self.config.upstream_timeout_s is None:
            return await self._exchange(inbound, pick, prefilled)
        try:
            async with asyncio.timeout(self.config.upstream_timeout_s):
                return await self._exchange(inbound, pick, prefilled)
        except TimeoutError as exc:
            if isinstance(exc, ConnectionError):
                raise _Retryable(failure_text(exc)) from exc
            self.metrics.errors.labels("timeout").inc()
            log.warning(
                "request %s: worker %s did not answer within %g s; answered 504",
                inbound.rid,
                worker.worker_id,
                self.config.upstream_timeout_s,
            )
            return json_error(504, f"worker {worker.worker_id} timed out", kind="timeout")

    async def _exchange(self, inbound: _Inbound, pick: _Pick, prefilled: list[bool]) -> Answer:
        assert self.upstream is not None
        request, rid, worker = inbound.request, inbound.rid, pick.worker
        try:
            origin, prefix = self._origin(worker.url)
        except ValueError as exc:
            raise _Retryable(str(exc)) from None
        try:
            exchange = await self.upstream.send(
                origin,
                "POST",
                prefix + request_target(request),
                self._upstream_headers(request, rid),
                inbound.body,
            )
        except _RETRY_ERRORS as exc:
            raise _Retryable(failure_text(exc)) from exc
        self._note_decision(pick)  # the worker has the request: its answer is not waiting for this
        async with exchange:
            try:
                upstream = await exchange.response()
            except UpstreamTimeout as exc:
                return self._silent(worker, exc, rid)
            except _RETRY_ERRORS as exc:
                raise _failed_after_send(exc) from exc
            headers = answer_headers(upstream.headers)
            headers[WORKER_HEADER] = worker.worker_id
            headers[REQUEST_ID_HEADER] = rid  # the gateway's, whatever the worker answered
            is_stream = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
            if not is_stream:
                try:
                    data = await upstream.read()
                except UpstreamTimeout as exc:
                    return self._silent(worker, exc, rid)
                except _RETRY_ERRORS as exc:
                    raise _failed_after_send(exc) from exc
                if worker_refused(upstream.status, upstream.headers):
                    why = error_message(data)
                    # a sidecar's retryable answer speaks of its engine's failure: the gateway's own
                    # 503 names it; an engine's 503 (its Retry-After, its error) goes out as it came
                    own = (
                        None
                        if upstream.headers.get(RETRYABLE_HEADER)
                        else web.Response(status=upstream.status, body=data, headers=headers)
                    )
                    raise _Retryable(
                        f"HTTP {upstream.status}" + (f" ({why})" if why else ""),
                        own,
                        received=worker_received(upstream.headers),
                    )
                prefilled[0] = upstream.status == 200
                if upstream.status >= 500:
                    self.metrics.errors.labels("upstream").inc()
                response = web.Response(status=upstream.status, body=data, headers=headers)
                if isinstance(request, HotRequest):
                    # written now: giving the connection back, the bookkeeping and the metrics of the
                    # request's end (all synchronous from here) need not precede the client's answer
                    request.send_response(response)
                return response
            return await self._stream(inbound, upstream, headers, prefilled, worker)

    async def _stream(
        self,
        inbound: _Inbound,
        upstream: UpstreamResponse,
        headers: CIMultiDict[str],
        prefilled: list[bool],
        worker: WorkerView,
    ) -> Answer:
        request, rid = inbound.request, inbound.rid
        chunks = whole_events(upstream.iter_chunks())  # an error event lands between events
        # the worker answered with a head: it has the request, so a failure now is one after receipt
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            raise _Retryable("stream closed before its first byte", received=True) from None
        except UpstreamTimeout as exc:
            return self._silent(worker, exc, rid)
        except _RETRY_ERRORS as exc:
            raise _Retryable(failure_text(exc), received=True) from exc
        error_first = is_error_event(first)  # an error event before any token
        if error_first and b"upstream_disconnected" in first:
            # the sidecar's error event: its engine broke off (or went silent) after taking it
            raise _Retryable("engine died before its first byte", received=True)
        prefilled[0] = upstream.status == 200 and not error_first
        try:
            response = await open_stream(request, upstream.status, headers)
            write = stream_writer(request, response, self.timeouts.write_s)
            await write(first)
        except ConnectionError:
            return web.Response(status=upstream.status)  # the client left before the stream began
        except ClientStalled:
            raise _StreamAbandoned(response) from None
        self.metrics.ttft.observe(time.perf_counter() - inbound.started)
        try:
            async for chunk in chunks:
                try:
                    await write(chunk)
                except ConnectionError:
                    return response  # the client left; leaving the upstream context aborts the request
                except ClientStalled:
                    raise _StreamAbandoned(response) from None  # leaving the upstream context aborts it
        except _RETRY_ERRORS as exc:
            self.metrics.errors.labels("stream_cut").inc()
            log.warning(
                "request %s: worker %s's stream ended early (%s); the client got an error event",
                rid,
                worker.worker_id,
                failure_text(exc),
            )
            with contextlib.suppress(ConnectionError):
                try:
                    await write(sse_error_event(f"worker stream ended early: {exc.__class__.__name__}"))
                except ClientStalled:
                    # stalled on the last event as on any other: counted as a client that left
                    raise _StreamAbandoned(response) from None
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
        return response

    def _silent(self, worker: WorkerView, exc: UpstreamTimeout, rid: str) -> web.Response:
        """A worker that took the request and then sent nothing for the read-idle limit: hung (alive to
        TCP, so keepalive does not end it). Not re-sent: the next worker would wait as long, or hang
        on the same request; it sits out as a failed worker."""
        self.view.mark_failed(worker.worker_id, time.monotonic())
        self.metrics.errors.labels("timeout").inc()
        log.warning("request %s: worker %s: %s; answered 504", rid, worker.worker_id, exc)
        return json_error(504, f"worker {worker.worker_id} timed out: {exc}", kind="timeout")

    async def handle_models(self, request: web.Request) -> web.StreamResponse:
        """One of :data:`INFO_PATHS` or :data:`INFO_POST_PATHS`, answered by the first live worker that
        answers below 500 (a POST's body sent to each it asks: they change nothing on the engine)."""
        started = time.perf_counter()
        assert self.session is not None
        body = await request.read() if request.body_exists else None  # within the limit (body_deadline)
        # labelled by its route's template: a model named in the path is no label value
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "other"
        # the client's headers (an engine's API key) as for generation; identity, since the answer's
        # Content-Encoding is not passed on
        sent = [*self._upstream_headers(request, self._request_id(request)), ("Accept-Encoding", "identity")]
        # /v1/models/{model}: the workers serving it (another would 404), matched before suspects
        # are set aside as for generation (its only worker just failed: not asked of another)
        workers = self.view.routable(time.monotonic(), request.match_info.get("model"))
        for w in workers:
            got = await self._ask_info(w, request, sent, body)
            if got is None or got[0] >= 500:
                continue
            status, data, headers = got
            if endpoint == "/v1/models" and status == 200:
                # a fleet serving several models (a rollout, two served names) lists them all
                data = await self._all_models(data, [o for o in workers if o is not w], request, sent)
                headers.pop("Content-Length", None)
            headers[WORKER_HEADER] = w.worker_id
            return self._answer(endpoint, web.Response(status=status, body=data, headers=headers), started)
        self.metrics.errors.labels("no_worker").inc()
        return self._answer(endpoint, unavailable("no worker is available"), started)

    async def _ask_info(
        self, w: WorkerView, request: web.Request, sent: list[tuple[str, str]], body: bytes | None
    ) -> tuple[int, bytes, CIMultiDict[str]] | None:
        """A worker's answer to an information request; None if it gave none."""
        assert self.session is not None
        try:
            async with self.session.request(
                request.method,
                yarl.URL(w.url + request_target(request), encoded=True),
                headers=sent,
                data=body,
                timeout=aiohttp.ClientTimeout(total=5),
            ) as up:
                return up.status, await up.read(), answer_headers(up.headers)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None

    async def _all_models(
        self, first: bytes, others: list[WorkerView], request: web.Request, sent: list[tuple[str, str]]
    ) -> bytes:
        """``first`` (a worker's model list) with the models other workers serve and it lacks, asked
        of one worker each (none when every worker serves the same names)."""
        listed = model_list_ids(first)
        if listed is None:
            return first
        asked = workers_to_ask(listed, others)
        answers = await asyncio.gather(*(self._ask_info(w, request, sent, None) for w in asked))
        return merge_model_lists(first, [a[1] for a in answers if a is not None and a[0] == 200])

    async def handle_health(self, _request: web.Request) -> web.Response:
        routable = len(self.view.routable(time.monotonic()))
        body = {
            "status": "ok" if routable else "no_workers",
            "routable_workers": routable,
            "workers": len(self.view.workers),
            "redis_ok": self.redis_ok if self.redis else None,
        }
        if routable:
            return web.json_response(body)
        return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})

    async def handle_livez(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_view(self, _request: web.Request) -> web.Response:
        """The gateway's fleet view as JSON (no hashes, no prompts): for operators and tests."""
        now = time.monotonic()
        wall = time.time()
        routable = {w.worker_id for w in self.view.routable(now)}
        out = []
        for w in self.view.workers.values():
            out.append(
                {
                    "worker_id": w.worker_id,
                    "url": w.url,
                    "static": w.static,
                    "state": w.state,
                    "served_models": list(w.served_models),
                    "adapters": list(w.member.adapters) if w.member is not None else [],
                    "routable": w.worker_id in routable,
                    "healthy": w.healthy,
                    "in_flight": w.load.in_flight if w.load else None,
                    "pending_prefill_tokens": w.load.pending_prefill_tokens if w.load else None,
                    "summary_version": w.summary.version if w.summary else None,
                    "summary_blocks": len(w.summary.blocks) if w.summary else 0,
                    "summary_age_s": round(wall - w.summary.generated_at, 3) if w.summary else None,
                    "overlay_blocks": len(w.overlay),
                }
            )
        return web.json_response({"policy": self.policy.name, "redis_ok": self.redis_ok, "workers": out})


@dataclass(frozen=True, slots=True)
class Listening(FrontServing):
    """A gateway serving on its socket (see :func:`listening`), with its ``.gateway``."""

    gateway: Gateway


@contextlib.asynccontextmanager
async def listening(config: GatewayConfig) -> AsyncIterator[Listening]:
    """Serve ``config`` until the block ends (port 0: a free port, see :attr:`Listening.port`)."""
    gateway = Gateway(config)
    # Generation requests take the lean front; everything else (and anything unusual) aiohttp.
    async with serving_front(
        gateway.app(),
        config.host,
        config.port,
        dict.fromkeys(GENERATE_PATHS, gateway.handle_generate),
        gateway._body_error,
        timeouts=gateway.timeouts,
        max_body_bytes=config.max_body_bytes,
        # the answers aiohttp's parser gives itself (a malformed head's 400), and the front's own 500
        # after a handler failed, name the request too
        refusal_headers=lambda request: {REQUEST_ID_HEADER: gateway._request_id(request)},
    ) as serving:
        yield Listening(server=serving.server, front=serving.front, gateway=gateway)


async def serve(config: GatewayConfig) -> None:
    async with listening(config):
        log.info(
            "gateway on %s:%d, policy %s, fleet %s", config.host, config.port, config.policy, config.fleet
        )
        await asyncio.Event().wait()


def _channel(message: dict) -> str:
    channel = message.get("channel")
    return channel.decode("utf-8", "replace") if isinstance(channel, bytes) else str(channel)
