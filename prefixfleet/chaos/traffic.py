"""Fixed-rate traffic for fault experiments: every request's fate, classified.

Open loop: request ``i`` is sent at ``i / rate`` seconds whatever happened to the others, so a fault
shows up as failed or slow requests instead of a client that politely waits. Each request ends in
exactly one :data:`RESULTS` class; streams are read to the end so a cut stream is told apart from a
clean one (``[DONE]``), from one closed with an SSE error event, and from one that hangs (client
timeout). A client may retry on connection errors (another gateway), as a real HTTP client with a
list of endpoints would.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

# ok: a complete answer. stream_error_event: a stream that ended with an SSE error event (a clean,
# visible cut). stream_truncated: a stream that ended with neither [DONE] nor an error event.
# http_NNN: an error status. timeout: no complete answer within the client timeout (a hang).
# connection: the connection failed and no retry was left.
RESULTS = ("ok", "stream_error_event", "stream_truncated", "timeout", "connection")


@dataclass(frozen=True, slots=True)
class TrafficPlan:
    rate_per_s: float
    duration_s: float
    stream_fraction: float = 0.3
    max_tokens: int = 24
    prefixes: int = 8  # shared "system prompts"; each request is one of them + a unique question
    prefix_words: int = 200
    suffix_words: int = 8
    unique_prefixes: bool = False  # every request a fresh prefix: grows any uncapped index
    timeout_s: float = 30.0
    max_in_flight: int = 512
    client_retries: int = 0  # re-sends to the next target after a connection error
    seed: int = 0

    def problems(self) -> list[str]:
        out = []
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            out.append(f"--rate must be a positive number, got {self.rate_per_s}")
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            out.append(f"--duration must be a positive number, got {self.duration_s}")
        if not 0.0 <= self.stream_fraction <= 1.0:
            out.append(f"--stream-fraction must be in [0, 1], got {self.stream_fraction}")
        if self.max_tokens < 1:
            out.append(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if self.prefixes < 1:
            out.append(f"--prefixes must be at least 1, got {self.prefixes}")
        return out

    @property
    def total_requests(self) -> int:
        return max(1, int(self.rate_per_s * self.duration_s))


@dataclass(slots=True)
class Outcome:
    index: int
    stream: bool
    sent_at: float  # seconds after the traffic started (scheduled send time)
    # seconds after the traffic started when it really went out (None: never did); later than
    # sent_at when the client fell behind or waited for a free slot (plan.max_in_flight)
    started_s: float | None = None
    result: str = "connection"
    status: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    attempts: int = 0
    worker: str | None = None
    gateway: str | None = None  # the target that gave the final answer
    first_gateway: str | None = None  # the target tried first
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.result == "ok"


@dataclass(slots=True)
class TrafficRun:
    plan: TrafficPlan
    outcomes: list[Outcome] = field(default_factory=list)
    started_at: float = 0.0  # time.monotonic() of the first scheduled send
    wall_s: float = 0.0


def request_body(plan: TrafficPlan, index: int, stream: bool) -> dict[str, Any]:
    """The /v1/completions body of request ``index``: a shared or unique prefix plus a question."""
    group = f"u{index}" if plan.unique_prefixes else f"p{index % plan.prefixes}"
    prefix = " ".join(f"{group}w{i}" for i in range(plan.prefix_words))
    question = " ".join(f"q{index}x{i}" for i in range(plan.suffix_words))
    body: dict[str, Any] = {"prompt": f"{prefix} {question}", "max_tokens": plan.max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def _usage(outcome: Outcome, payload: Any) -> None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return
    if isinstance(usage.get("prompt_tokens"), int):
        outcome.prompt_tokens = usage["prompt_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        outcome.cached_tokens = details["cached_tokens"]


# How a started stream can end; the result is kept up to date while reading, so a connection that
# dies mid-stream leaves the classification of what the client had seen by then.
STREAM_ENDINGS = ("ok", "stream_error_event", "stream_truncated")


async def _read_stream(resp: aiohttp.ClientResponse, outcome: Outcome, t_send: float) -> None:
    """Read SSE events to the end and classify how the stream ended."""
    outcome.result = "stream_truncated"  # until [DONE] or an error event arrives
    async for line in resp.content:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            outcome.result = "ok"
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if isinstance(event, dict) and "error" in event:
            outcome.result = "stream_error_event"
            err = event["error"]
            outcome.error_message = str(err.get("message") if isinstance(err, dict) else err)[:200]
            continue
        if outcome.ttft_s is None:
            outcome.ttft_s = time.monotonic() - t_send
        _usage(outcome, event)


async def send(
    session: aiohttp.ClientSession,
    targets: Sequence[str],
    plan: TrafficPlan,
    index: int,
    outcome: Outcome,
) -> None:
    """Send request ``index`` to ``targets[index % n]``, retrying on the next target after a
    connection error while ``plan.client_retries`` allows."""
    body = request_body(plan, index, outcome.stream)
    t_send = time.monotonic()
    outcome.first_gateway = targets[index % len(targets)]
    for attempt in range(plan.client_retries + 1):
        target = targets[(index + attempt) % len(targets)]
        outcome.attempts = attempt + 1
        outcome.gateway = target
        outcome.ttft_s = outcome.latency_s = outcome.status = None
        outcome.result = "connection"  # until this attempt gets further
        try:
            async with session.post(
                f"{target}/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=plan.timeout_s)
            ) as resp:
                outcome.status = resp.status
                outcome.worker = resp.headers.get("X-Prefixfleet-Worker")
                if resp.status != 200:
                    raw = await resp.read()
                    outcome.result = f"http_{resp.status}"
                    outcome.error_message = raw[:200].decode(errors="replace")
                elif outcome.stream:
                    await _read_stream(resp, outcome, t_send)
                else:
                    payload = await resp.json(content_type=None)
                    outcome.ttft_s = time.monotonic() - t_send
                    _usage(outcome, payload)
                    outcome.result = "ok"
            outcome.latency_s = time.monotonic() - t_send
            return
        except TimeoutError:
            outcome.result = "timeout"
            return
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError) as exc:
            if outcome.result in STREAM_ENDINGS:
                # the stream had started: a connection dying now is a cut stream as the client saw
                # it (silent unless an error event came first), not a connection that never served
                outcome.latency_s = time.monotonic() - t_send
                if outcome.result == "ok":  # [DONE] had arrived: the answer was whole
                    return
                if outcome.result == "stream_truncated":
                    outcome.error_message = type(exc).__name__
            else:
                outcome.result = "connection"
                outcome.error_message = type(exc).__name__
            continue  # the next target, if a retry is left


async def drive(
    targets: Sequence[str],
    plan: TrafficPlan,
    *,
    on_tick: Callable[[float], Awaitable[None] | None] | None = None,
) -> TrafficRun:
    """Run ``plan`` against ``targets`` (base URLs, used round-robin); ``on_tick(elapsed_s)`` is
    called about every 0.25 s (progress bars, samplers)."""
    if not targets:
        raise ValueError("no targets to send traffic to")
    rng = random.Random(plan.seed)
    run = TrafficRun(plan)
    limit = asyncio.Semaphore(plan.max_in_flight)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks: list[asyncio.Task[None]] = []
        run.started_at = t0 = time.monotonic()
        next_tick = 0.0

        async def one(outcome: Outcome) -> None:
            async with limit:
                outcome.started_s = time.monotonic() - t0
                await send(session, targets, plan, outcome.index, outcome)

        for i in range(plan.total_requests):
            at = i / plan.rate_per_s
            while True:
                now = time.monotonic() - t0
                if now >= next_tick and on_tick is not None:
                    maybe = on_tick(now)
                    if maybe is not None:
                        await maybe
                    next_tick = now + 0.25
                if now >= at:
                    break
                await asyncio.sleep(min(at - now, max(next_tick - now, 0.001)))
            outcome = Outcome(index=i, stream=rng.random() < plan.stream_fraction, sent_at=at)
            run.outcomes.append(outcome)
            tasks.append(asyncio.create_task(one(outcome)))
        pending = {t for t in tasks if not t.done()}
        while pending:
            _done, pending = await asyncio.wait(pending, timeout=0.25)
            if on_tick is not None:
                maybe = on_tick(time.monotonic() - t0)
                if maybe is not None:
                    await maybe
        run.wall_s = time.monotonic() - t0
    return run


def achieved_rate(outcomes: Sequence[Outcome]) -> float | None:
    """Requests per second as they really went out: (n - 1) over the span of the start times (a
    perfectly kept plan gives its rate back); None below two started requests."""
    starts = [o.started_s for o in outcomes]
    if len(starts) < 2 or None in starts:
        return None
    span = max(starts) - min(starts)  # type: ignore[type-var]
    return (len(starts) - 1) / span if span > 0 else None


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def tally(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Counts by result and kind, latency percentiles (ms) and the prompt-token hit rate."""
    results = Counter(o.result for o in outcomes)
    nonstream = [o for o in outcomes if not o.stream]
    streams = [o for o in outcomes if o.stream]
    lat = [o.latency_s * 1000 for o in outcomes if o.ok and o.latency_s is not None]
    prompt = sum(o.prompt_tokens for o in outcomes if o.ok)
    cached = sum(o.cached_tokens for o in outcomes if o.ok)
    return {
        "requests": len(outcomes),
        "ok": results.get("ok", 0),
        "results": dict(sorted(results.items())),
        "non_streaming": len(nonstream),
        "non_streaming_lost": sum(1 for o in nonstream if not o.ok),
        "streams": len(streams),
        "streams_cut_with_error_event": sum(1 for o in streams if o.result == "stream_error_event"),
        "streams_truncated_silently": sum(1 for o in streams if o.result == "stream_truncated"),
        "hangs": results.get("timeout", 0),
        # no answer at all: refused, reset or dropped before a stream began, after any retries
        "connection_errors": results.get("connection", 0),
        "http_5xx": sum(n for r, n in results.items() if r.startswith("http_5")),
        "http_4xx": sum(n for r, n in results.items() if r.startswith("http_4")),
        "client_retried": sum(1 for o in outcomes if o.attempts > 1),
        "p50_latency_ms": percentile(lat, 0.50),
        "p99_latency_ms": percentile(lat, 0.99),
        "hit_rate": cached / prompt if prompt else 0.0,
    }


def outcomes_as_dicts(outcomes: Sequence[Outcome]) -> list[dict[str, Any]]:
    return [asdict(o) for o in outcomes]
