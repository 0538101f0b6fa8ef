"""Autoscaling scenarios: minutes of traffic whose rate and prefix mix change over time.

A routing comparison needs a steady stream; a scaler needs load that rises and falls, and a prefix
mix that moves. Each scenario returns a :class:`~prefixfleet.sim.workloads.Workload` (deterministic
by seed) with the fleet it is judged at in ``recommended``:

* ``viral`` — steady multi-tenant traffic; at ``viral_start_s`` a new prefix (a long shared prompt:
  a launched agent's tool schemas, a document everyone asks about) ramps over ``ramp_s`` from 0 to
  ``viral_share`` of requests while total traffic grows ``surge``×, holds, then fades back over
  ``fade_s``. The hot-subtree case.
* ``diurnal`` — Zipf tenants under a slow day curve (trough → peak → trough) compressed into
  ``duration_s``. The uniform-growth case, where prefix awareness matters for *which* replica goes.
* ``trace:PATH`` — a Mooncake trace replayed at ``speedup`` (see :func:`workloads.trace_workload`).

Arrivals are a non-homogeneous Poisson process, sampled by thinning against the peak rate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

from .workloads import (
    TRACE_DEFAULTS,
    TokenSpace,
    Workload,
    WorkloadRequest,
    _merge,
    _require_share,
    _zipf_weights,
    check_prompt_tokens,
    check_request_count,
    mean_size,
    replay_trace,
    typed,
    within_span,
)

# One fleet for every scenario (so the numbers compare): an 8B-class model on one GPU per replica,
# 20k prefill tokens/s, a 256k-token KV pool (~32 GiB at 128 KiB/token), continuous batching.
# The pool holds the running batch many times over, so the batched model is compute-bound, never
# memory-bound.
SCENARIO_FLEET: dict[str, Any] = {
    "cache_tokens": 256_000,
    "service": "batched",
    "prefill_s_per_token": 0.00005,
    "cached_s_per_token": 0.0,
    "max_running": 128,
    "step_token_budget": 2048,
    "min_replicas": 2,
    "max_replicas": 12,
    "target_ttft_s": 1.0,
    # A scenario compresses hours of traffic into minutes, so the scaler's timers are compressed
    # too (the operator's defaults, 60 s and 300 s, suit real traffic); every other scaler knob is
    # the operator's default.
    "scale_up_cooldown_s": 15.0,
    "scale_down_stabilization_s": 60.0,
}

VIRAL_SCENARIO: dict[str, Any] = {
    "duration_s": 600.0,
    "tenants": 48,
    "zipf_exponent": 1.0,
    "prefix_tokens_min": 2000,
    "prefix_tokens_max": 6000,
    "unique_tokens_min": 300,
    "unique_tokens_max": 1500,
    "output_tokens": 128,
    "rate_rps": 12.0,
    "viral_start_s": 120.0,
    "ramp_s": 60.0,
    "hold_s": 180.0,
    "fade_s": 120.0,
    "viral_prefix_tokens": 8000,
    "viral_share": 0.7,
    "surge": 3.0,
}

DIURNAL_SCENARIO: dict[str, Any] = {
    "duration_s": 1500.0,
    "tenants": 48,
    "zipf_exponent": 1.1,
    "prefix_tokens_min": 2000,
    "prefix_tokens_max": 8000,
    "unique_tokens_min": 300,
    "unique_tokens_max": 1500,
    "output_tokens": 128,
    "trough_rps": 6.0,
    "peak_rps": 40.0,
    "drift": 0.5,  # how far tenant popularity rotates over the day (0: fixed ranking)
}

# The Mooncake trace at 4× (~255 s, ~16 req/s): prompts shrunk 4× (128 tokens per hash id, ~3.8k
# tokens on average) so it loads the same fleet to ~5 replicas; prefix structure is kept exactly.
TRACE_SCENARIO: dict[str, Any] = {"speedup": 4.0, "block_tokens": 128, "limit": 0}

SCENARIOS: tuple[str, ...] = ("viral", "diurnal", "trace:PATH")
# Each scenario's settings (a trace takes every trace workload setting, TRACE_SCENARIO's defaults first).
SCENARIO_SETTINGS: dict[str, dict[str, Any]] = {
    "viral": VIRAL_SCENARIO,
    "diurnal": DIURNAL_SCENARIO,
    "trace:PATH": {**TRACE_DEFAULTS, **TRACE_SCENARIO},
}


def _arrivals(
    rng: random.Random, rate: Callable[[float], float], peak: float, duration: float
) -> list[float]:
    """Non-homogeneous Poisson arrivals with intensity ``rate(t) <= peak`` on [0, duration)."""
    out: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return out
        if rng.random() * peak < rate(t):
            out.append(t)


def _envelope(t: float, start: float, ramp: float, hold: float, fade: float) -> float:
    """0 before ``start``, linear up over ``ramp``, 1 for ``hold``, linear down over ``fade``."""
    if t < start:
        return 0.0
    t -= start
    if t < ramp:
        return t / ramp if ramp > 0 else 1.0
    t -= ramp
    if t < hold:
        return 1.0
    t -= hold
    if t < fade:
        return 1.0 - t / fade
    return 0.0


def _tenant_prompts(rng: random.Random, space: TokenSpace, s: dict[str, Any]) -> list[bytes]:
    return [
        space.fresh(rng.randint(s["prefix_tokens_min"], s["prefix_tokens_max"])) for _ in range(s["tenants"])
    ]


def viral_scenario(seed: int = 0, **overrides: Any) -> Workload:
    positive = ("duration_s", "tenants", "rate_rps", "viral_prefix_tokens", "surge")
    s = _merge(VIRAL_SCENARIO, overrides, "viral", "scenario", positive=positive)
    _require_share(s, overrides, "viral", "scenario")
    # thinning draws about peak rate × duration candidates, however few it keeps
    peak = s["rate_rps"] * max(s["surge"], 1.0)
    check_request_count("viral", peak * s["duration_s"], "'rate_rps' × 'surge' × 'duration_s'", "scenario")
    prompt = max(mean_size(s, "prefix_tokens"), s["viral_prefix_tokens"]) + mean_size(s, "unique_tokens")
    size = "the requests × the prompt sizes"
    check_prompt_tokens("viral", peak * s["duration_s"] * prompt, size, "scenario")
    rng = random.Random(seed)
    space = TokenSpace()
    prefixes = _tenant_prompts(rng, space, s)
    viral = space.fresh(s["viral_prefix_tokens"])
    weights = _zipf_weights(s, overrides, "viral", "scenario")

    def level(t: float) -> float:
        return _envelope(t, s["viral_start_s"], s["ramp_s"], s["hold_s"], s["fade_s"])

    def rate(t: float) -> float:
        return s["rate_rps"] * (1.0 + (s["surge"] - 1.0) * level(t))

    requests = []
    for t in _arrivals(rng, rate, peak, s["duration_s"]):
        unique = space.fresh(rng.randint(s["unique_tokens_min"], s["unique_tokens_max"]))
        if rng.random() < s["viral_share"] * level(t):
            requests.append(WorkloadRequest(t, viral + unique, s["output_tokens"], "viral"))
        else:
            tenant = rng.choices(range(s["tenants"]), weights=weights)[0]
            requests.append(WorkloadRequest(t, prefixes[tenant] + unique, s["output_tokens"], f"t{tenant}"))
    return Workload("viral", requests, s, dict(SCENARIO_FLEET))


def diurnal_scenario(seed: int = 0, **overrides: Any) -> Workload:
    positive = ("duration_s", "tenants", "trough_rps", "peak_rps")
    s = _merge(DIURNAL_SCENARIO, overrides, "diurnal", "scenario", positive=positive)
    if s["peak_rps"] < s["trough_rps"]:
        raise ValueError(
            f"scenario 'diurnal' setting 'peak_rps' ({typed(overrides, s, 'peak_rps')}) must be >= "
            f"'trough_rps' ({typed(overrides, s, 'trough_rps')})"
        )
    # The rotation below is int(drift × tenants × t / duration), t up to the duration: drift × tenants
    # finite is not enough (1e306 × 48 × t overflows once t > 4 s). Checked at t = duration, the
    # product's largest value, computed in the same order.
    if not math.isfinite(s["drift"] * s["tenants"] * s["duration_s"]):
        raise ValueError(
            f"scenario 'diurnal' setting 'drift' ({typed(overrides, s, 'drift')}) is too large "
            f"for {s['tenants']} tenants over {s['duration_s']:g} s "
            "(the ranking's rotation overflows a float)"
        )
    check_request_count("diurnal", s["peak_rps"] * s["duration_s"], "'peak_rps' × 'duration_s'", "scenario")
    requests = (s["trough_rps"] + s["peak_rps"]) / 2 * s["duration_s"]  # the day's mean rate
    prompt = mean_size(s, "prefix_tokens") + mean_size(s, "unique_tokens")
    check_prompt_tokens("diurnal", requests * prompt, "the requests × the prompt sizes", "scenario")
    rng = random.Random(seed)
    space = TokenSpace()
    prefixes = _tenant_prompts(rng, space, s)
    n = s["tenants"]
    base = _zipf_weights(s, overrides, "diurnal", "scenario")
    order = list(range(n))
    rng.shuffle(order)  # which tenant is popular is not its creation order
    duration = s["duration_s"]

    def rate(t: float) -> float:  # one day: trough at both ends, peak at noon
        return s["trough_rps"] + (s["peak_rps"] - s["trough_rps"]) * 0.5 * (
            1 - math.cos(2 * math.pi * t / duration)
        )

    requests = []
    for t in _arrivals(rng, rate, s["peak_rps"], duration):
        # popularity drifts: the ranking rotates by up to drift × tenants over the day (time zones)
        shift = int(s["drift"] * n * t / duration)
        rank = rng.choices(range(n), weights=base)[0]
        tenant = order[(rank + shift) % n]
        unique = space.fresh(rng.randint(s["unique_tokens_min"], s["unique_tokens_max"]))
        requests.append(WorkloadRequest(t, prefixes[tenant] + unique, s["output_tokens"], f"t{tenant}"))
    return Workload("diurnal", requests, s, dict(SCENARIO_FLEET))


def build_scenario(spec: str, /, *, seed: int = 0, **overrides: Any) -> Workload:
    """``viral``, ``diurnal`` or ``trace:PATH``; ``ValueError`` with one line for anything else."""
    if spec.startswith("trace:"):
        path = spec[len("trace:") :]
        if not path:
            raise ValueError("trace scenario needs a path: trace:PATH")
        workload = replay_trace(path, {**TRACE_SCENARIO, **overrides}, "scenario")
        trace = Workload(workload.name, workload.requests, workload.settings, dict(SCENARIO_FLEET))
        return within_span(trace, "scenario")
    if spec == "viral":
        return within_span(viral_scenario(seed, **overrides), "scenario")
    if spec == "diurnal":
        return within_span(diurnal_scenario(seed, **overrides), "scenario")
    raise ValueError(f"unknown scenario {spec!r}; choose from {', '.join(SCENARIOS)}")
