"""Open-loop load generator: replays a workload's requests at their arrival times over HTTP.

Each request is sent at ``arrival_s / speedup`` after the start whether or not earlier ones have
answered (open loop, so a slow router is not flattered by a client that waits for it); a
concurrency cap only protects the client machine. Time to first token is measured from the
scheduled send time to the first SSE chunk that carries text, so client-side lag counts against
the target rather than hiding it. Cached prompt tokens come from the server's own report: the final
``usage`` chunk of an OpenAI stream (``stream_options.include_usage``) or SGLang's ``meta_info``.
Failures are counted by kind, never raised.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
from tqdm import tqdm

Api = Literal["openai", "sglang"]
APIS: tuple[str, ...] = ("openai", "sglang")


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """One request as the client sends it."""

    arrival_s: float
    prompt: str
    prompt_tokens: int
    max_tokens: int
    group: object = None


@dataclass(slots=True)
class RequestOutcome:
    index: int
    target: str
    ok: bool
    ttft_s: float | None = None
    latency_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_chunks: int = 0
    error: str | None = None
    lag_s: float = 0.0  # how late the client actually sent it (client saturation indicator)


@dataclass(frozen=True, slots=True)
class LoadSummary:
    requests: int
    completed: int
    errors: int
    mean_ttft_ms: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    hit_rate: float
    throughput_rps: float
    duration_s: float
    prompt_tokens: int
    cached_tokens: int
    mean_client_lag_ms: float
    error_kinds: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def requests_from_workload(
    workload: Any, *, limit: int | None = None, max_output_tokens: int | None = None
) -> list[LoadRequest]:
    """Turn a simulator :class:`Workload` into prompts (one word per token, as every hop tokenizes)."""
    from prefixfleet.router.radix import decode_tokens
    from prefixfleet.tokenizer import text_for_tokens

    out: list[LoadRequest] = []
    for req in workload.requests[: limit if limit is not None else None]:
        ids = decode_tokens(req.tokens)
        max_tokens = int(req.output_tokens)
        if max_output_tokens is not None:
            max_tokens = min(max_tokens, max_output_tokens)
        out.append(
            LoadRequest(
                arrival_s=float(req.arrival_s),
                prompt=text_for_tokens(ids),
                prompt_tokens=len(ids),
                max_tokens=max(1, max_tokens),
                group=getattr(req, "group", None),
            )
        )
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated ``q``-quantile (0..1) of ``values``; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(outcomes: Sequence[RequestOutcome], duration_s: float) -> LoadSummary:
    """Aggregate per-request outcomes (pure)."""
    done = [o for o in outcomes if o.ok]
    ttfts = [o.ttft_s * 1000.0 for o in done if o.ttft_s is not None]
    prompt = sum(o.prompt_tokens for o in done)
    cached = sum(o.cached_tokens for o in done)
    kinds = Counter(o.error or "unknown" for o in outcomes if not o.ok)
    lags = [o.lag_s * 1000.0 for o in outcomes]
    return LoadSummary(
        requests=len(outcomes),
        completed=len(done),
        errors=len(outcomes) - len(done),
        mean_ttft_ms=sum(ttfts) / len(ttfts) if ttfts else math.nan,
        p50_ttft_ms=percentile(ttfts, 0.50),
        p99_ttft_ms=percentile(ttfts, 0.99),
        hit_rate=cached / prompt if prompt else 0.0,
        throughput_rps=len(done) / duration_s if duration_s > 0 else 0.0,
        duration_s=duration_s,
        prompt_tokens=prompt,
        cached_tokens=cached,
        mean_client_lag_ms=sum(lags) / len(lags) if lags else 0.0,
        error_kinds=dict(kinds),
    )


def _request_body(req: LoadRequest, api: Api, stream: bool, model: str | None) -> tuple[str, dict[str, Any]]:
    if api == "openai":
        body: dict[str, Any] = {
            "prompt": req.prompt,
            "max_tokens": req.max_tokens,
            "temperature": 0.0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        if model:
            body["model"] = model
        return "/v1/completions", body
    body = {
        "text": req.prompt,
        "sampling_params": {"max_new_tokens": req.max_tokens, "temperature": 0.0},
        "stream": stream,
    }
    if model:
        body["model"] = model
    return "/generate", body


def _usage_counts(payload: Mapping[str, Any], api: Api) -> tuple[int | None, int | None]:
    """(prompt_tokens, cached_tokens) reported in one response object, if any."""
    if api == "openai":
        usage = payload.get("usage")
        if not isinstance(usage, Mapping):
            return None, None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
        return _as_int(usage.get("prompt_tokens")), _as_int(cached)
    meta = payload.get("meta_info")
    if not isinstance(meta, Mapping):
        return None, None
    return _as_int(meta.get("prompt_tokens")), _as_int(meta.get("cached_tokens"))


def _as_int(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _has_text(payload: Mapping[str, Any], api: Api) -> bool:
    if api == "sglang":
        return bool(payload.get("text"))
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if isinstance(choice, Mapping) and (
            choice.get("text")
            or (isinstance(choice.get("delta"), Mapping) and choice["delta"].get("content"))
        ):
            return True
    return False


async def send_one(
    session: aiohttp.ClientSession,
    target: str,
    req: LoadRequest,
    *,
    index: int,
    api: Api,
    stream: bool,
    model: str | None,
    t_scheduled: float,
    timeout_s: float,
) -> RequestOutcome:
    """Send one request and measure it; every failure becomes an outcome with ``error`` set."""
    path, body = _request_body(req, api, stream, model)
    outcome = RequestOutcome(index=index, target=target, ok=False, prompt_tokens=req.prompt_tokens)
    outcome.lag_s = max(0.0, time.perf_counter() - t_scheduled)
    try:
        async with session.post(
            target.rstrip("/") + path, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            if resp.status != 200:
                await resp.read()
                outcome.error = f"http_{resp.status}"
                return outcome
            if stream:
                await _read_stream(resp, api, outcome, t_scheduled)
            else:
                payload = await resp.json(content_type=None)
                outcome.ttft_s = time.perf_counter() - t_scheduled
                if isinstance(payload, Mapping):
                    _apply_usage(outcome, payload, api)
                    outcome.output_chunks = 1 if _has_text(payload, api) else 0
            outcome.latency_s = time.perf_counter() - t_scheduled
            if outcome.ttft_s is None:
                outcome.error = "no_output"
                return outcome
            outcome.ok = True
            return outcome
    except TimeoutError:
        outcome.error = "timeout"
    except aiohttp.ClientConnectionError:
        outcome.error = "connection"
    except (aiohttp.ClientError, ValueError) as exc:
        outcome.error = type(exc).__name__
    return outcome


def _apply_usage(outcome: RequestOutcome, payload: Mapping[str, Any], api: Api) -> None:
    prompt, cached = _usage_counts(payload, api)
    if prompt is not None:
        outcome.prompt_tokens = prompt
    if cached is not None:
        outcome.cached_tokens = cached


async def _read_stream(resp: aiohttp.ClientResponse, api: Api, outcome: RequestOutcome, t0: float) -> None:
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        try:
            payload = json.loads(data)
        except ValueError:
            continue
        if not isinstance(payload, Mapping):
            continue
        if "error" in payload and not payload.get("choices") and "text" not in payload:
            raise ValueError(f"stream error: {payload['error']}")
        if _has_text(payload, api):
            if outcome.ttft_s is None:
                outcome.ttft_s = time.perf_counter() - t0
            outcome.output_chunks += 1
        _apply_usage(outcome, payload, api)


async def discover_model(session: aiohttp.ClientSession, target: str) -> str | None:
    """The first model id a target lists at ``/v1/models`` (None if it does not say)."""
    try:
        async with session.get(
            target.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)
        ) as r:
            if r.status != 200:
                return None
            payload = await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
    data = payload.get("data") if isinstance(payload, Mapping) else None
    if (
        isinstance(data, list)
        and data
        and isinstance(data[0], Mapping)
        and isinstance(data[0].get("id"), str)
    ):
        return data[0]["id"]
    return None


@dataclass(frozen=True, slots=True)
class LoadRun:
    outcomes: list[RequestOutcome]
    duration_s: float

    @property
    def summary(self) -> LoadSummary:
        return summarize(self.outcomes, self.duration_s)


async def run_load(
    requests: Sequence[LoadRequest],
    targets: Sequence[str],
    *,
    api: Api = "openai",
    speedup: float = 1.0,
    concurrency: int = 256,
    timeout_s: float = 120.0,
    stream: bool = True,
    model: str | None = None,
    progress: bool = True,
    desc: str = "load",
) -> LoadRun:
    """Replay ``requests`` open-loop; request ``i`` goes to ``targets[i % len(targets)]``."""
    if not targets:
        raise ValueError("at least one target URL is needed")
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(requests), desc=desc, unit="req", disable=not progress, leave=False)
    outcomes: list[RequestOutcome | None] = [None] * len(requests)
    async with aiohttp.ClientSession(connector=connector) as session:
        if model is None:
            model = await discover_model(session, targets[0])
        t_start = time.perf_counter() + 0.05
        base = requests[0].arrival_s if requests else 0.0

        async def fire(i: int, req: LoadRequest) -> None:
            t_sched = t_start + (req.arrival_s - base) / speedup
            delay = t_sched - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                outcomes[i] = await send_one(
                    session,
                    targets[i % len(targets)],
                    req,
                    index=i,
                    api=api,
                    stream=stream,
                    model=model,
                    t_scheduled=t_sched,
                    timeout_s=timeout_s,
                )
            bar.update(1)

        try:
            await asyncio.gather(*(fire(i, r) for i, r in enumerate(requests)))
        finally:
            bar.close()
        duration = max(time.perf_counter() - t_start, 1e-9)
    done = [o for o in outcomes if o is not None]
    return LoadRun(done, duration)


def format_table(rows: Mapping[str, Mapping[str, Any]], title: str = "policy") -> str:
    """A plain-text table of per-row TTFT/hit-rate/error figures."""
    header = f"{title:<20} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'hit rate':>9} {'errors':>7}"
    lines = [header, "-" * len(header)]
    for name, r in rows.items():
        lines.append(
            f"{name:<20} {_fmt(r.get('mean_ttft_ms')):>9} {_fmt(r.get('p50_ttft_ms')):>9} "
            f"{_fmt(r.get('p99_ttft_ms')):>9} {_fmt(r.get('hit_rate'), pct=True):>9} {r.get('errors', 0):>7}"
        )
    return "\n".join(lines)


def _fmt(value: object, pct: bool = False) -> str:
    if not isinstance(value, int | float) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * 100:.1f}%" if pct else f"{value:.1f}"


def ttfts_ms(outcomes: Iterable[RequestOutcome]) -> list[float]:
    return [o.ttft_s * 1000.0 for o in outcomes if o.ok and o.ttft_s is not None]
