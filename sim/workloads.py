"""Request streams for the fleet simulator (and the live load generator), deterministic by seed.

Every generator returns a :class:`Workload`: requests sorted by arrival, each with its prompt as
encoded token bytes (:func:`prefixfleet.router.radix.as_token_bytes`), plus the generator's settings
and the fleet settings it is meant to be judged at (``recommended``).

Token ids are drawn from a counter pushed through a bijection of [0, 2**32), so two segments share a
token only when a generator reuses the segment on purpose: the prefix structure is exactly the one
described, never an accident of random ids.
"""

from __future__ import annotations

import json
import math
import os
import random
import stat
from array import array
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prefixfleet.router.radix import TOKEN_BYTES, as_token_bytes
from prefixfleet.sglang_fields import lax_bool

_MASK32 = 0xFFFFFFFF
_MIX = 0x9E3779B1  # odd, so multiplication is a bijection mod 2**32
_SALT = 0x5BD1E995


def _token_id(counter: int) -> int:
    return ((counter * _MIX) & _MASK32) ^ _SALT


def token_ids(start: int, count: int) -> array:
    """``count`` distinct token ids for counter values ``start .. start+count-1``."""
    return array("I", [_token_id(c) for c in range(start, start + count)])


class TokenSpace:
    """Hands out fresh, never-repeating token segments (one counter per workload)."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def fresh(self, count: int) -> bytes:
        ids = token_ids(self._next, count)
        self._next += count
        return as_token_bytes(ids)


@dataclass(frozen=True, slots=True)
class WorkloadRequest:
    arrival_s: float  # seconds from the start of the workload
    tokens: bytes  # prompt, little-endian uint32 token ids
    output_tokens: int
    group: str  # tenant / session / prefix group, for per-group statistics

    @property
    def num_tokens(self) -> int:
        return len(self.tokens) // TOKEN_BYTES


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[WorkloadRequest]  # sorted by arrival
    settings: dict[str, Any] = field(default_factory=dict)  # generator parameters, for the record
    recommended: dict[str, Any] = field(default_factory=dict)  # fleet settings it is judged at

    @property
    def total_prompt_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)


def _poisson_arrivals(rng: random.Random, count: int, rate_rps: float) -> list[float]:
    t = 0.0
    out = []
    for _ in range(count):
        t += rng.expovariate(rate_rps)
        out.append(t)
    return out


def _zipf_weights(
    settings: Mapping[str, Any], overrides: Mapping[str, Any], name: str, kind: str = "workload"
) -> list[float]:
    """Zipf weights over ``settings``' tenants by its 'zipf_exponent' (refused as ``overrides``
    typed it)."""
    n, exponent = settings["tenants"], settings["zipf_exponent"]
    try:
        return [1.0 / (rank**exponent) for rank in range(1, n + 1)]
    except (OverflowError, ZeroDivisionError):  # rank**exponent beyond a float, or rounded to 0
        raise ValueError(
            f"{kind} {name!r} setting 'zipf_exponent' {typed(overrides, settings, 'zipf_exponent')} "
            f"is too far from 0 for {n} ranks (weights overflow)"
        ) from None


def typed(overrides: Mapping[str, Any], settings: Mapping[str, Any], key: str) -> str:
    """``key``'s value as a refusal quotes it: as the user gave it (``--set speedup=0`` is '0',
    not the 0.0 it was read as), or ``settings``' own value when they did not set it. Quoted
    (repr): a quoted value is what was typed, like every other --set refusal's "got '-1'"."""
    return repr(overrides[key] if key in overrides else settings[key])


def whole_number(value: Any) -> int | None:
    """A count setting as an int, however it is written ('100', '1e2', 100.0); None when it is not
    a whole number (2.5, 'inf', 'abc')."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass  # '1e2', '100.0': read as a float below
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) and number.is_integer() else None


def count_refusal(value: Any, *, floor: str = ">= 0", limit: str | None = None) -> str:
    """Why ``value`` is no count (:func:`whole_number` gave None), as the end of a sentence that
    names the setting. 1e400 is a whole number as written, only too large (a float reads it as
    infinity): "must be a whole number" named the wrong rule. ``floor`` is the setting's lower
    bound as its other refusals word it, ``limit`` its cap when it has one ("10,000,000 tokens")."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if number == math.inf:
        cap = f"; at most {limit}" if limit else " (beyond what a float holds)"
        return f"is too large, got {value!r}{cap}"
    if number == -math.inf:
        return f"must be {floor}, got {value!r}"
    return f"must be a whole number, got {value!r}"


def _count_limit(key: str) -> str | None:
    """The cap a count setting is held to on its own, as :func:`count_refusal` names it (others,
    such as 'sessions', are capped only by the requests they make together)."""
    if key == "num_requests":
        return f"{MAX_WORKLOAD_REQUESTS:,} requests"
    if key in PREFIX_COUNTS:
        return f"{MAX_PREFIXES:,} {PREFIX_COUNTS[key][0]}"
    if "tokens" in key:
        return f"{MAX_SETTING_TOKENS:,} tokens"
    return None


def _merge(
    base: dict[str, Any],
    overrides: dict[str, Any],
    workload: str,
    kind: str = "workload",
    *,
    positive: Collection[str] = (),
) -> dict[str, Any]:
    """``base`` with ``overrides`` (strings from ``--set``) read as its values' types and checked:
    numbers >= 0, the ``positive`` ones > 0 (one check, so 'sessions=-1' names the rule 'sessions=0'
    is also held to). Refusals name the ``kind`` ("workload", "scenario") and the ``workload`` as
    the user wrote them."""
    who = f"{kind} {workload!r}"
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise ValueError(f"{who} has no setting {unknown[0]!r}; settings: {', '.join(sorted(base))}")
    merged = dict(base)
    for key, value in overrides.items():
        default = base[key]
        floor = "positive" if key in positive else ">= 0"
        if isinstance(default, bool):
            flag = lax_bool(value.strip() if isinstance(value, str) else value)
            if flag is None:
                raise ValueError(f"{who} setting {key!r} must be true or false, got {value!r}")
            merged[key] = flag
            continue
        if isinstance(default, int):
            # a count: 2.5 tenants is no count, and '1e3' requests is one (a finite number, refused as
            # not finite before)
            count = whole_number(value)
            if count is None:
                refusal = count_refusal(value, floor=floor, limit=_count_limit(key))
                raise ValueError(f"{who} setting {key!r} {refusal}")
            merged[key] = count
        elif isinstance(default, float):
            try:
                merged[key] = float(value)
            except (TypeError, ValueError):
                merged[key] = math.nan
            if not math.isfinite(merged[key]):  # inf rates/durations never end a generator loop
                raise ValueError(f"{who} setting {key!r} must be a finite number, got {value!r}")
        else:
            merged[key] = value
        number = merged[key]
        if isinstance(number, int | float) and (number <= 0 if key in positive else number < 0):
            # counts, sizes, rates, durations; a positive one divides or sizes something
            raise ValueError(f"{who} setting {key!r} must be {floor}, got {value!r}")
        if "tokens" in key and isinstance(merged[key], int) and merged[key] > MAX_SETTING_TOKENS:
            raise ValueError(
                f"{who} setting {key!r} must be at most {MAX_SETTING_TOKENS:,} tokens "
                f"(longer than any model's context), got {value!r}"
            )
        if key in PREFIX_COUNTS and merged[key] > MAX_PREFIXES:
            raise ValueError(
                f"{who} setting {key!r} is too large, got {value!r}; at most {_count_limit(key)}"
            )
    for key in merged:
        upper = f"{key[: -len('_min')]}_max"
        if key.endswith("_min") and upper in merged and merged[key] > merged[upper]:
            raise ValueError(
                f"{who} setting {key!r} ({typed(overrides, merged, key)}) must be <= "
                f"{upper!r} ({typed(overrides, merged, upper)})"
            )
    for key, (_, size_key) in PREFIX_COUNTS.items():
        if key in merged and size_key in merged:
            _check_prefix_tokens(who, key, size_key, merged[key] * merged[size_key])
    return merged


def _check_prefix_tokens(who: str, count_key: str, size_key: str, built: int) -> None:
    """Refuse settings whose shared prefixes alone (each built in memory before the first request)
    would exceed :data:`MAX_PREFIX_TOKENS`."""
    if built > MAX_PREFIX_TOKENS:
        raise ValueError(
            f"{who}: {count_key!r} × {size_key!r} would build {built:,} prefix tokens; "
            f"at most {MAX_PREFIX_TOKENS:,}"
        )


# Token sizes are generated as real token ids: 1e11 would try to allocate 400 GB before anything runs.
MAX_SETTING_TOKENS = 10_000_000
# A workload is generated in memory request by request: more would take hours before anything runs
# (and a rate so high that arrival gaps fall below a float's resolution never ended at all).
MAX_WORKLOAD_REQUESTS = 10_000_000
# Settings that each get a shared prefix of their own (and a Zipf weight), with the noun a refusal
# names and the setting that sizes one prefix. Every prefix is generated in memory before the first
# request, and viral/diurnal draw a tenant from all the weights per request: 'tenants=1e20' never
# finished. The largest shipped value is 64 (gsp's groups; the scenarios run 48 tenants).
PREFIX_COUNTS: dict[str, tuple[str, str]] = {
    "tenants": ("tenants", "prefix_tokens_max"),
    "system_prompts": ("system prompts", "system_prompt_tokens"),
    "groups": ("groups", "system_prompt_tokens"),
}
MAX_PREFIXES = 10_000
# All shared prefixes together, count × largest size: ~400 MB of token bytes, some minutes to build
# at about 1 µs a token. The largest shipped set is the diurnal scenario's 48 × 8000 = 384,000.
MAX_PREFIX_TOKENS = 100_000_000
# Arrival times are float seconds: at 1e8 s (about 3 years) a float still resolves 15 ns; at 1e300
# the service times vanish beside them (every TTFT read 0) and a live replay never ends.
MAX_WORKLOAD_SPAN_S = 1e8
# Every request holds its whole prompt as token bytes (4 a token; a shared prefix is copied into each
# request), all in memory before the first is simulated: 1e7 requests of prefixroute's ~1,100 tokens
# were 45 GB. 2e9 tokens is 8 GB; the largest shipped workload, the diurnal scenario, makes 214M
# (about 37 s to build), the Mooncake trace 61M.
MAX_WORKLOAD_TOKENS = 2_000_000_000
# Every cap above, for the --set help of every command that builds a workload or scenario.
SIZE_CAP_HELP = (
    f"at most {MAX_WORKLOAD_REQUESTS:,} requests, arriving within {MAX_WORKLOAD_SPAN_S:.0e} s,"
    f" {MAX_WORKLOAD_TOKENS:,} prompt tokens in all; at most {MAX_PREFIXES:,} tenants, system prompts"
    f" or groups, their prefixes {MAX_PREFIX_TOKENS:,} tokens together; a token size at most"
    f" {MAX_SETTING_TOKENS:,}"
)


def settings_help(kind: str, examples: Mapping[str, str]) -> str:
    """The ``--set KEY=VALUE`` help of every command that builds a workload or scenario: examples
    (``{spec: "key=value, ..."}``, each naming the workload or scenario it applies to: a trace's keys
    are no generator's), where the keys are and the caps they are held to (:data:`SIZE_CAP_HELP`,
    from the caps themselves). An example key that ``spec`` does not have is refused here, when the
    parser is built, so a renamed setting cannot leave a help example behind."""
    if kind == "scenario":
        from .scenarios import SCENARIO_SETTINGS as known  # scenarios imports this module
    else:
        known = WORKLOAD_SETTINGS
    for spec, pairs in examples.items():
        keys = [pair.partition("=")[0].strip() for pair in pairs.split(",")]
        if missing := [key for key in keys if key not in known[spec]]:
            raise ValueError(f"--set help example: {kind} {spec!r} has no setting {missing[0]!r}")
    shown = "; ".join(f"for {spec}: {pairs}" for spec, pairs in examples.items())
    described = "docs/autoscaling.md (Scenarios)" if kind == "scenario" else "docs/simulator.md (Workloads)"
    return (
        f"{kind} setting, repeatable (e.g. {shown}). An unknown KEY lists the {kind}'s keys;"
        f" {described} describes them. Limits (docs/simulator.md): {SIZE_CAP_HELP}"
    )


def _check_size(name: str, expected: float, settings: str, what: str, cap: int, kind: str) -> None:
    if not expected <= cap:  # also refuses nan
        # settings whose product overflows a float: "about inf requests" named no number
        amount = f"about {expected:.3g} {what}" if math.isfinite(expected) else f"too many {what} to count"
        raise ValueError(f"{kind} {name!r}: {settings} would make {amount}; at most {cap:,}")


def check_request_count(name: str, expected: float, settings: str, kind: str = "workload") -> None:
    """Refuse settings that would make more than :data:`MAX_WORKLOAD_REQUESTS` requests."""
    _check_size(name, expected, settings, "requests", MAX_WORKLOAD_REQUESTS, kind)


def check_prompt_tokens(name: str, expected: float, settings: str, kind: str = "workload") -> None:
    """Refuse settings whose prompts would hold more than :data:`MAX_WORKLOAD_TOKENS` tokens in all
    (``expected`` estimated from the settings' means, before anything is generated)."""
    _check_size(name, expected, settings, "prompt tokens", MAX_WORKLOAD_TOKENS, kind)


def mean_size(settings: dict[str, Any], key: str) -> float:
    """The mean of a uniform ``key_min .. key_max`` size setting."""
    return (settings[f"{key}_min"] + settings[f"{key}_max"]) / 2


def within_span(workload: Workload, kind: str = "workload") -> Workload:
    """``workload`` if its last arrival is at most :data:`MAX_WORKLOAD_SPAN_S`; ValueError otherwise."""
    last = workload.requests[-1].arrival_s if workload.requests else 0.0
    if not last <= MAX_WORKLOAD_SPAN_S:
        # a rate of 1e-308 puts the second arrival at infinity: "spans inf s" named no time
        span = f"spans {last:.3g} s of arrivals" if math.isfinite(last) else "spans too long to count"
        raise ValueError(
            f"{kind} {workload.name!r} {span} with these settings; at most "
            f"{MAX_WORKLOAD_SPAN_S:.0e} s (raise a rate or speedup, or shorten a gap)"
        )
    return workload


def _require_share(settings: dict[str, Any], overrides: Mapping[str, Any], workload: str, kind: str) -> None:
    """Refuse a 'viral_share' outside [0, 1], quoting it as ``overrides`` (the user) gave it."""
    if not 0.0 <= settings["viral_share"] <= 1.0:
        shown = typed(overrides, settings, "viral_share")
        raise ValueError(f"{kind} {workload!r} setting 'viral_share' must be in [0, 1], got {shown}")


# -- prefixroute ------------------------------------------------------------------------------------

# Calibrated so our fifo simulation lands in the neighbourhood of prefixroute's published table
# (RR 182.9 ms mean / 56.3% hit; affinity 17.7 ms / 85.7%) at 4 replicas × 4000-token caches and
# 10k prefill tokens/s: twelve tenant prefixes of 600-1000 tokens (~9.6k tokens, 2.4× one cache),
# 50-130-token user turns, Zipf exponent 1.3, 85 requests/s (round robin keeps replicas ~80% busy).
PREFIXROUTE_DEFAULTS: dict[str, Any] = {
    "num_requests": 4000,
    "tenants": 12,
    "zipf_exponent": 1.3,
    "rate_rps": 85.0,
    "prefix_tokens_min": 600,
    "prefix_tokens_max": 1000,
    "turn_tokens_min": 50,
    "turn_tokens_max": 130,
    "output_tokens": 64,
}
PREFIXROUTE_FLEET: dict[str, Any] = {
    "replicas": 4,
    "cache_tokens": 4000,
    "service": "fifo",
    "prefill_s_per_token": 0.0001,
    "cached_s_per_token": 0.0,
}


def prefixroute_workload(seed: int = 0, **overrides: Any) -> Workload:
    """Multi-tenant trace: Zipf tenant popularity, Poisson arrivals, per-tenant prefix + unique turn."""
    positive = ("num_requests", "tenants", "rate_rps", "prefix_tokens_min")
    s = _merge(PREFIXROUTE_DEFAULTS, overrides, "prefixroute", positive=positive)
    check_request_count("prefixroute", s["num_requests"], "'num_requests'")
    prefix = mean_size(s, "prefix_tokens")
    prompts = s["num_requests"] * (prefix + mean_size(s, "turn_tokens")) + s["tenants"] * prefix
    check_prompt_tokens("prefixroute", prompts, "'num_requests' × the prompt sizes")
    rng = random.Random(seed)
    space = TokenSpace()
    prefixes = [
        space.fresh(rng.randint(s["prefix_tokens_min"], s["prefix_tokens_max"])) for _ in range(s["tenants"])
    ]
    weights = _zipf_weights(s, overrides, "prefixroute")
    arrivals = _poisson_arrivals(rng, s["num_requests"], s["rate_rps"])
    tenants = rng.choices(range(s["tenants"]), weights=weights, k=s["num_requests"])
    requests = [
        WorkloadRequest(
            t,
            prefixes[tenant] + space.fresh(rng.randint(s["turn_tokens_min"], s["turn_tokens_max"])),
            s["output_tokens"],
            f"tenant{tenant}",
        )
        for t, tenant in zip(arrivals, tenants, strict=True)
    ]
    return Workload("prefixroute", requests, s, dict(PREFIXROUTE_FLEET))


# -- lab burst --------------------------------------------------------------------------------------

LAB_BURST_DEFAULTS: dict[str, Any] = {
    "prefix_tokens": 4096,
    "suffix_tokens": 256,
    "interleaved_requests": 16,
    "burst_requests": 16,
    # The lab's queues drain 14 ms per arrival, i.e. one arrival every 14 ms.
    "interarrival_s": 0.014,
    "output_tokens": 32,
}
LAB_BURST_FLEET: dict[str, Any] = {
    "replicas": 4,
    "cache_tokens": 9216,
    "service": "fifo",
    "prefill_s_per_token": 0.000025,
    "cached_s_per_token": 0.0000015,
}


def _lab_burst_layout(suffix_tokens: int, interleaved: int, burst: int) -> list[tuple[int, int]]:
    """(tenant, first suffix token id) of each of the lab's requests, in order."""
    return [((step * 3 + 1) % 4, 100_000 + step * suffix_tokens) for step in range(interleaved)] + [
        (0, 200_000 + b * suffix_tokens) for b in range(burst)
    ]


def lab_burst_token_lists(
    prefix_tokens: int = 4096, suffix_tokens: int = 256, interleaved: int = 16, burst: int = 16
) -> list[list[int]]:
    """The seed lab's prompts with its own token ids: tenant t's prefix is 10000(t+1) + i."""
    return [
        [*range(10_000 * (t + 1), 10_000 * (t + 1) + prefix_tokens), *range(start, start + suffix_tokens)]
        for t, start in _lab_burst_layout(suffix_tokens, interleaved, burst)
    ]


def lab_burst_workload(seed: int = 0, **overrides: Any) -> Workload:
    """4 tenant prefixes, 16 interleaved requests (tenant (step*3+1)%4), then 16 on tenant 0.

    Deterministic regardless of ``seed`` (the lab's workload has no randomness).
    """
    positive = ("prefix_tokens", "suffix_tokens", "interarrival_s")
    s = _merge(LAB_BURST_DEFAULTS, overrides, "lab-burst", positive=positive)
    count = s["interleaved_requests"] + s["burst_requests"]
    check_request_count("lab-burst", count, "'interleaved_requests' + 'burst_requests'")
    prefix, suffix = s["prefix_tokens"], s["suffix_tokens"]
    size = "the requests × the prompt sizes"
    check_prompt_tokens("lab-burst", count * (prefix + suffix) + 4 * prefix, size)
    # the ids of lab_burst_token_lists, encoded range by range: a list holds 36 bytes a token, not 4
    prefixes = [as_token_bytes(range(10_000 * (t + 1), 10_000 * (t + 1) + prefix)) for t in range(4)]
    layout = _lab_burst_layout(suffix, s["interleaved_requests"], s["burst_requests"])
    requests = [
        WorkloadRequest(
            i * s["interarrival_s"],
            prefixes[t] + as_token_bytes(range(start, start + suffix)),
            s["output_tokens"],
            f"tenant{t}",
        )
        for i, (t, start) in enumerate(layout)
    ]
    return Workload("lab-burst", requests, s, dict(LAB_BURST_FLEET))


# -- SGLang generated-shared-prefix ----------------------------------------------------------------

GSP_DEFAULTS: dict[str, Any] = {
    "groups": 64,
    "prompts_per_group": 16,
    "system_prompt_tokens": 2048,
    "question_tokens": 128,
    "output_tokens": 256,
    "rate_rps": 48.0,
}
# 64 × 2048 = 131k tokens of system prompts: 3.3× one 40k-token cache, 0.8× the fleet's. At 48
# requests/s and 25k prefill tokens/s per replica, cache-blind routing keeps replicas ~80% busy.
GSP_FLEET: dict[str, Any] = {
    "replicas": 4,
    "cache_tokens": 40_000,
    "service": "fifo",
    "prefill_s_per_token": 0.00004,
    "cached_s_per_token": 0.0,
}


def gsp_workload(seed: int = 0, **overrides: Any) -> Workload:
    """SGLang bench_serving's generated-shared-prefix: groups share a system prompt, unique questions."""
    s = _merge(GSP_DEFAULTS, overrides, "gsp", positive=("groups", "prompts_per_group", "rate_rps"))
    check_request_count("gsp", s["groups"] * s["prompts_per_group"], "'groups' × 'prompts_per_group'")
    system = s["system_prompt_tokens"]
    prompts = s["groups"] * (s["prompts_per_group"] * (system + s["question_tokens"]) + system)
    check_prompt_tokens("gsp", prompts, "'groups' × 'prompts_per_group' × the prompt sizes")
    rng = random.Random(seed)
    space = TokenSpace()
    systems = [space.fresh(s["system_prompt_tokens"]) for _ in range(s["groups"])]
    prompts = [
        (g, systems[g] + space.fresh(s["question_tokens"]))
        for g in range(s["groups"])
        for _ in range(s["prompts_per_group"])
    ]
    rng.shuffle(prompts)  # groups interleaved at random, as bench_serving sends them
    arrivals = _poisson_arrivals(rng, len(prompts), s["rate_rps"])
    requests = [
        WorkloadRequest(t, tokens, s["output_tokens"], f"group{g}")
        for t, (g, tokens) in zip(arrivals, prompts, strict=True)
    ]
    return Workload("gsp", requests, s, dict(GSP_FLEET))


# -- multi-turn chat --------------------------------------------------------------------------------

CHAT_DEFAULTS: dict[str, Any] = {
    "sessions": 240,
    "system_prompts": 4,
    "system_prompt_tokens": 1024,
    "turns_min": 2,
    "turns_max": 10,
    "user_tokens_min": 32,
    "user_tokens_max": 256,
    "answer_tokens_min": 64,
    "answer_tokens_max": 384,
    "session_rate_rps": 1.5,
    "think_time_s": 6.0,
}
CHAT_FLEET: dict[str, Any] = {
    "replicas": 4,
    "cache_tokens": 32_000,
    "service": "fifo",
    "prefill_s_per_token": 0.00004,
    "cached_s_per_token": 0.0,
}


def _chat_prompt_tokens(s: dict[str, Any]) -> float:
    """Expected tokens of all the prompts: turn k of T carries the system prompt, k earlier user
    messages and answers, and its own message, so a session holds T × (system + user) +
    (user + answer) × T(T-1)/2 (T uniform in turns_min..turns_max: quadratic in the turns)."""
    low, high = s["turns_min"], s["turns_max"]
    turns = (low + high) / 2
    pairs = ((high - low + 1) ** 2 - 1) / 12 + turns * turns - turns  # E[T(T-1)] = Var + E[T]² - E[T]
    user, answer = mean_size(s, "user_tokens"), mean_size(s, "answer_tokens")
    session = turns * (s["system_prompt_tokens"] + user) + (user + answer) * pairs / 2
    return s["sessions"] * session + s["system_prompts"] * s["system_prompt_tokens"]


def chat_workload(seed: int = 0, **overrides: Any) -> Workload:
    """Interleaved multi-turn sessions; each turn's prompt = previous prompt + answer + new message."""
    positive = ("sessions", "system_prompts", "session_rate_rps", "turns_min")
    s = _merge(CHAT_DEFAULTS, overrides, "chat", positive=positive)
    check_request_count("chat", s["sessions"] * s["turns_max"], "'sessions' × 'turns_max'")
    check_prompt_tokens("chat", _chat_prompt_tokens(s), "'sessions' × the turns' growing prompts")
    rng = random.Random(seed)
    space = TokenSpace()
    systems = [space.fresh(s["system_prompt_tokens"]) for _ in range(s["system_prompts"])]
    starts = _poisson_arrivals(rng, s["sessions"], s["session_rate_rps"])
    requests = []
    for session, start in enumerate(starts):
        history = systems[rng.randrange(s["system_prompts"])]
        t = start
        for _turn in range(rng.randint(s["turns_min"], s["turns_max"])):
            prompt = history + space.fresh(rng.randint(s["user_tokens_min"], s["user_tokens_max"]))
            answer = rng.randint(s["answer_tokens_min"], s["answer_tokens_max"])
            requests.append(WorkloadRequest(t, prompt, answer, f"session{session}"))
            history = prompt + space.fresh(answer)  # the answer becomes part of the next prompt
            t += rng.expovariate(1.0 / s["think_time_s"]) if s["think_time_s"] > 0 else 0.0
    requests.sort(key=lambda r: r.arrival_s)
    return Workload("chat", requests, s, dict(CHAT_FLEET))


# -- viral new prefix ------------------------------------------------------------------------------

VIRAL_DEFAULTS: dict[str, Any] = {
    "duration_s": 60.0,
    "tenants": 8,
    "zipf_exponent": 1.0,
    "prefix_tokens_min": 1000,
    "prefix_tokens_max": 2000,
    "turn_tokens_min": 50,
    "turn_tokens_max": 150,
    "rate_rps": 25.0,
    "viral_start_s": 20.0,
    "viral_prefix_tokens": 3000,
    "viral_share": 0.6,  # of requests after the start
    "surge": 3.0,  # total arrival rate multiplier after the start
    "output_tokens": 128,
}
# Eight tenant prefixes (~12k tokens) plus the 3k viral one against 8k-token caches; after the surge
# cache-blind routing saturates the fleet while the viral prefix's holders run hot.
VIRAL_FLEET: dict[str, Any] = {
    "replicas": 4,
    "cache_tokens": 8_000,
    "service": "fifo",
    "prefill_s_per_token": 0.0001,
    "cached_s_per_token": 0.0,
}


def viral_workload(seed: int = 0, **overrides: Any) -> Workload:
    """Steady multi-tenant traffic until ``viral_start_s``; then a new prefix appears, takes
    ``viral_share`` of requests and total traffic grows ``surge``× — the hot-subtree scale-up case."""
    positive = ("duration_s", "tenants", "rate_rps", "viral_prefix_tokens", "surge")
    s = _merge(VIRAL_DEFAULTS, overrides, "viral", positive=positive)
    _require_share(s, overrides, "viral", "workload")
    before = min(s["viral_start_s"], s["duration_s"])
    expected = s["rate_rps"] * (before + s["surge"] * (s["duration_s"] - before))
    check_request_count("viral", expected, "'rate_rps', 'surge' and 'duration_s'")
    prefix = max(mean_size(s, "prefix_tokens"), s["viral_prefix_tokens"])  # the larger, for a bound
    prompts = expected * (prefix + mean_size(s, "turn_tokens")) + s["tenants"] * prefix
    check_prompt_tokens("viral", prompts, "'rate_rps', 'surge', 'duration_s' × the prompt sizes")
    rng = random.Random(seed)
    space = TokenSpace()
    prefixes = [
        space.fresh(rng.randint(s["prefix_tokens_min"], s["prefix_tokens_max"])) for _ in range(s["tenants"])
    ]
    viral_prefix = space.fresh(s["viral_prefix_tokens"])
    weights = _zipf_weights(s, overrides, "viral")
    requests = []
    t = 0.0
    while True:
        after = t >= s["viral_start_s"]
        t += rng.expovariate(s["rate_rps"] * (s["surge"] if after else 1.0))
        if t >= s["duration_s"]:
            break
        turn = space.fresh(rng.randint(s["turn_tokens_min"], s["turn_tokens_max"]))
        if t >= s["viral_start_s"] and rng.random() < s["viral_share"]:
            requests.append(WorkloadRequest(t, viral_prefix + turn, s["output_tokens"], "viral"))
        else:
            tenant = rng.choices(range(s["tenants"]), weights=weights)[0]
            requests.append(
                WorkloadRequest(t, prefixes[tenant] + turn, s["output_tokens"], f"tenant{tenant}")
            )
    return Workload("viral", requests, s, dict(VIRAL_FLEET))


# -- Mooncake trace replay --------------------------------------------------------------------------

TRACE_DEFAULTS: dict[str, Any] = {
    "speedup": 1.0,  # divide timestamps by this
    "limit": 0,  # first N requests; 0 = all
    "block_tokens": 512,  # tokens each hash id expands to (shrink to scale prompts down)
    "trace_block_tokens": 512,  # the block size the file was written with
}
# The Mooncake synthetic trace: 3,993 requests over 1,022 s, mean input 15.3k tokens, ~65% of tokens
# reusable with an infinite cache (21.3M distinct tokens). 8 replicas × 1M-token caches hold ~40% of
# them; at 10k prefill tokens/s per replica round robin keeps the fleet ~2/3 busy.
TRACE_FLEET: dict[str, Any] = {
    "replicas": 8,
    "cache_tokens": 1_000_000,
    "service": "fifo",
    "prefill_s_per_token": 0.0001,
    "cached_s_per_token": 0.0,
}


def _block_tokens(block_id: int, block_tokens: int) -> bytes:
    """Same ids as :func:`token_ids` for the block's counter range, vectorised (traces are large)."""
    counters = np.arange(block_id * block_tokens, (block_id + 1) * block_tokens, dtype=np.uint64)
    ids = ((counters * np.uint64(_MIX)) & np.uint64(_MASK32)) ^ np.uint64(_SALT)
    return ids.astype("<u4").tobytes()


def _trace_error(path: str, lineno: int, what: str) -> ValueError:
    return ValueError(f"trace {path} line {lineno}: {what}")


def _parse_trace_line(
    path: str, lineno: int, line: str, max_block_id: int
) -> tuple[float, int, int, list[int]]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise _trace_error(path, lineno, f"not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise _trace_error(path, lineno, "expected a JSON object")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in obj:
            raise _trace_error(path, lineno, f"missing {key!r}")
    ts, n_in, n_out, ids = obj["timestamp"], obj["input_length"], obj["output_length"], obj["hash_ids"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise _trace_error(path, lineno, f"timestamp must be a non-negative number of ms, got {ts!r}")
    if isinstance(n_in, bool) or not isinstance(n_in, int) or n_in <= 0:
        raise _trace_error(path, lineno, f"input_length must be a positive integer, got {n_in!r}")
    if isinstance(n_out, bool) or not isinstance(n_out, int) or n_out < 0:
        raise _trace_error(path, lineno, f"output_length must be a non-negative integer, got {n_out!r}")
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= max_block_id for h in ids
    ):
        raise _trace_error(path, lineno, f"hash_ids must be a list of integers in [0, {max_block_id}]")
    return float(ts), n_in, n_out, ids


def trace_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a trace ("not found", "is a directory", ...), or None.

    ``is_file()`` alone said "not found" for a directory, a device or a file nobody may read."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "not found"
    except NotADirectoryError:
        return "a part of the path is not a directory"
    except OSError as exc:  # a parent that is a file, a directory we may not enter, ...
        return (exc.strerror or str(exc)).lower()
    if stat.S_ISDIR(mode):
        return "is a directory, not a trace file"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if not os.access(path, os.R_OK):
        return "permission denied"
    return None


def trace_workload(path: str, /, seed: int = 0, **overrides: Any) -> Workload:
    """Replay a Mooncake-format JSONL trace (timestamp ms, input_length, output_length, hash_ids).

    Each hash id expands to ``block_tokens`` deterministic token ids derived from the id (the last
    block truncated in proportion), so two requests share exactly as many tokens as their hash_ids
    agree from the start × ``block_tokens``. ``seed`` is unused: a trace is already one sample.
    """
    return replay_trace(path, overrides)


def replay_trace(path: str, overrides: dict[str, Any], kind: str = "workload") -> Workload:
    """:func:`trace_workload`, its refusals naming the ``kind`` ("workload", "scenario") and
    ``trace:PATH`` as the user wrote it."""
    name = f"trace:{path}"
    if "path" in overrides:  # (it was silently replaced by the one in the name)
        raise ValueError(
            f"{kind} {name!r} takes its path from its name (trace:PATH), not from a setting 'path'"
        )
    positive = ("speedup", "block_tokens", "trace_block_tokens")
    s = {**_merge(TRACE_DEFAULTS, overrides, name, kind, positive=positive), "path": path}
    file = Path(path)
    if (problem := trace_file_problem(file)) == "not found":
        raise ValueError(f"trace file not found: {path}")
    if problem is not None:
        raise ValueError(f"trace {path}: {problem}")
    block, file_block = s["block_tokens"], s["trace_block_tokens"]
    max_block_id = (2**32 // block) - 1  # keeps every block's counter range disjoint
    blocks: dict[int, bytes] = {}
    rows = []
    try:  # a read can still fail (an I/O error, a file that vanished): one line, not a traceback
        with file.open("rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _trace_error(path, lineno, "not UTF-8 text") from None
                if not line.strip():
                    continue
                ts, n_in, n_out, ids = _parse_trace_line(path, lineno, line, max_block_id)
                if len(ids) != math.ceil(n_in / file_block):
                    raise _trace_error(
                        path,
                        lineno,
                        f"{len(ids)} hash_ids do not cover input_length {n_in} in {file_block}-token blocks "
                        f"(expected {math.ceil(n_in / file_block)})",
                    )
                rows.append((ts, n_in, n_out, ids))
                if s["limit"] and len(rows) >= s["limit"]:
                    break
    except OSError as exc:
        raise ValueError(f"trace {path}: cannot read: {exc.strerror or exc}") from None
    if not rows:
        raise ValueError(f"trace {path} has no requests")
    rows.sort(key=lambda r: r[0])  # stable: equal timestamps keep file order
    # each row's last block, scaled as its input_length ends it part-way
    lasts = [
        max(1, round((n_in - (len(ids) - 1) * file_block) * block / file_block)) for _, n_in, _, ids in rows
    ]
    # what the prompts will hold, counted before any is built: a larger block_tokens scales them all
    tokens = sum((len(row[3]) - 1) * block + last for row, last in zip(rows, lasts, strict=True))
    requests_read = f"{len(rows):,} request{'' if len(rows) == 1 else 's'}"
    check_prompt_tokens(name, tokens, f"the hash ids of {requests_read} × 'block_tokens'", kind)
    t0 = rows[0][0]
    requests = []
    for (ts, _, n_out, ids), last_scaled in zip(rows, lasts, strict=True):
        parts = []
        for h in ids:
            data = blocks.get(h)
            if data is None:
                data = blocks[h] = _block_tokens(h, block)
            parts.append(data)
        parts[-1] = parts[-1][: last_scaled * TOKEN_BYTES]
        requests.append(
            WorkloadRequest(
                (ts - t0) / 1000.0 / s["speedup"], b"".join(parts), max(n_out, 1), f"root{ids[0]}"
            )
        )
    return Workload(name, requests, s, dict(TRACE_FLEET))


# -- registry ---------------------------------------------------------------------------------------

GENERATORS: dict[str, Callable[..., Workload]] = {
    "prefixroute": prefixroute_workload,
    "lab-burst": lab_burst_workload,
    "gsp": gsp_workload,
    "chat": chat_workload,
    "viral": viral_workload,
}
WORKLOADS: list[str] = [*GENERATORS, "trace:PATH"]
# Each workload's settings and their defaults: the keys ``--set`` takes for it.
WORKLOAD_SETTINGS: dict[str, dict[str, Any]] = {
    "prefixroute": PREFIXROUTE_DEFAULTS,
    "lab-burst": LAB_BURST_DEFAULTS,
    "gsp": GSP_DEFAULTS,
    "chat": CHAT_DEFAULTS,
    "viral": VIRAL_DEFAULTS,
    "trace:PATH": TRACE_DEFAULTS,
}


def input_files(spec: str) -> list[str]:
    """The files a workload or scenario spec reads (a trace's path), which no output may replace."""
    return [spec[len("trace:") :]] if spec.startswith("trace:") else []


def build_workload(spec: str, /, *, seed: int = 0, **overrides: Any) -> Workload:
    """Build a workload by name: ``prefixroute``, ``lab-burst``, ``gsp``, ``chat``, ``viral``, ``trace:PATH``.

    Raises ``ValueError`` with a one-line message for an unknown name or setting, a missing trace
    file or a malformed trace line.
    """
    if spec.startswith("trace:"):
        path = spec[len("trace:") :]
        if not path:
            raise ValueError("trace workload needs a path: trace:PATH")
        return within_span(trace_workload(path, seed=seed, **overrides))
    generator = GENERATORS.get(spec)
    if generator is None:
        raise ValueError(f"unknown workload {spec!r}; choose from {', '.join(WORKLOADS)}")
    return within_span(generator(seed=seed, **overrides))
