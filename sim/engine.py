"""Service models of one simulated replica: how long prefill takes and when a request's first token comes.

Two models behind one small interface (:class:`ReplicaModel`):

* ``fifo`` — prefixroute's model. One FIFO server per replica; a request's prefill takes
  ``uncached × prefill_s_per_token + cached × cached_s_per_token (+ overhead)`` and starts when the
  replica is free; TTFT = queue wait + prefill. As in prefixroute, the replica's cache is consulted and
  the full prompt inserted *when the request is routed* (its KV is committed to that replica), so a
  request queued behind another of its tenant already counts as a hit. Decode is not modelled.
* ``batched`` — continuous batching (vLLM/SGLang style). Each engine step runs decode for every
  request past prefill plus chunks of pending prefills within a token budget; the step takes
  ``decode_base_s + decode_s_per_seq × decoding + prefill tokens × prefill_s_per_token``. At most
  ``max_running`` requests run; admission matches and inserts the prompt *pinned*, so a running
  request's prefix is never evicted, and a request that cannot get cache room waits. TTFT = end of
  the step that finishes its prefill; the pin is released when its last output token is decoded.
  With ``cache_on_compute`` (this model and ``emulator``; SGLang-like) admission pins only the
  matched prefix and reserves cache room for the rest, a request is matched again when its first
  chunk is scheduled, the pinned path grows as each step computes a chunk (others see computed tokens
  only), and a request sharing an uncached prefix with one prefilled in the same step waits one step
  (as :class:`~prefixfleet.emulator.engine.EngineModel` does). Policies then see what a gateway
  knows, not the engine's tree: matches come from a mirror into which every prompt is inserted when
  it is routed (as a sidecar's mirror does when forwarding; answers are not added, the engine does
  not cache them either), floored to whole hash blocks; by default the engine's own tree, which
  holds each prompt from admission on, serves as that mirror. The load part of the view (pending
  prefill, waits) is the engine's queue with each waiting request counted at its routing-time
  uncached estimate.
* ``emulator`` — the local fleet's engine: the engine emulator's own scheduler
  (:class:`prefixfleet.emulator.engine.EngineModel`) driven on the simulator's clock, so a simulated
  replica admits, chunks, reserves KV room, evicts and times iterations exactly as an emulated engine
  does (an iteration is a prefill pass, ``prefill_pass_s`` + its tokens, then a decode step,
  ``decode_base_s`` + ``decode_s_per_seq`` per extra sequence; each only when it has work). Its
  :meth:`~ReplicaModel.view` shows what a live gateway knows of a sidecar-fronted engine: the
  sidecar's load record (requests forwarded and not finished, the predicted uncached tokens of those
  without a first token, the prefill rate measured over busy periods) — not the engine's internals.

The simulator reads each replica only through :meth:`ReplicaModel.view`, which builds the
:class:`~prefixfleet.router.policies.ReplicaState` a policy is allowed to see.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, fields, replace
from typing import Any

from prefixfleet.emulator.config import EmulatorConfig
from prefixfleet.emulator.engine import EngineModel, EngineRequest, Iteration, shares_uncached_prefix
from prefixfleet.emulator.text import generated_tokens, generated_words, generation_seed
from prefixfleet.router.blockhash import DEFAULT_BLOCK_TOKENS
from prefixfleet.router.loadtrack import LoadTracker
from prefixfleet.router.policies import CostModel, ReplicaState, RouteRequest
from prefixfleet.router.policies.base import RATE_WINDOW_S, DecayedRate
from prefixfleet.router.radix import (
    TOKEN_BYTES,
    CacheFullError,
    RadixTree,
    as_token_bytes,
    common_prefix_bytes,
)

SERVICE_MODELS = ("fifo", "batched", "emulator")
_EMULATOR_ONLY = (
    "prefill_pass_s",
    "report_gap_s",
    "report_delay_s",
    "summary_interval_s",
    "summary_delay_s",
    "overlay_slack_s",
    "forward_delay_s",
    "share_sends",
    "share_delay_s",
    "report_rates",
)


def _float_fields(config: ServiceConfig) -> list[str]:
    return [f.name for f in fields(config) if f.type in ("float", float)]


# The counts of a batched engine: at least one request running and one token per step.
_COUNT_FIELDS = ("max_running", "step_token_budget")


def field_floor(name: str) -> str:
    """The lower bound of a numeric :class:`ServiceConfig` field, as its refusal words it ("must be
    positive"): the one place these rules live, so the CLI's refusals say what the dataclass says."""
    # every float field is a duration or a cost per token; a count of zero runs nothing
    return "positive" if name in _COUNT_FIELDS else ">= 0"


class FieldRuleError(ValueError):
    """A numeric :class:`ServiceConfig` field below its floor. ``field`` and ``rule`` ("must be
    positive") are kept apart so a caller that read the value from text quotes that text instead."""

    def __init__(self, field: str, rule: str, value: float) -> None:
        super().__init__(f"{field} {rule}, got {value}")
        self.field = field
        self.rule = rule


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Engine timing and scheduling parameters shared by every replica of a simulated fleet."""

    service: str = "fifo"
    prefill_s_per_token: float = 0.0001
    cached_s_per_token: float = 0.0
    request_overhead_s: float = 0.0
    # batched only
    max_running: int = 128
    step_token_budget: int = 8192  # prefill-chunk + decode tokens per engine step
    decode_base_s: float = 0.008  # one forward pass with a tiny batch
    decode_s_per_seq: float = 0.00005  # extra per decoding sequence in the batch
    # batched and emulator: a prompt's tokens count as cached for others only once computed
    # (False: from admission on, the optimistic model; see EmulatorConfig.cache_on_compute)
    cache_on_compute: bool = False
    # emulator only: fixed cost of an iteration's prefill pass (its decode step costs decode_base_s)
    prefill_pass_s: float = 0.0
    # emulator only: a sidecar pushes its load at most once per report_gap_s and gateways see it
    # report_delay_s later (0, 0: every gateway sees each load change at once)
    report_gap_s: float = 0.0
    report_delay_s: float = 0.0
    # emulator only: the sidecar publishes a summary of its cache mirror every summary_interval_s
    # (when it changed), gateways adopt it summary_delay_s later and keep counting their own sends
    # made up to overlay_slack_s before it was generated (0: every gateway sees the mirror itself)
    summary_interval_s: float = 0.0
    summary_delay_s: float = 0.0
    overlay_slack_s: float = 0.0
    # emulator only: a routed request reaches its sidecar and engine this long after the gateway sent
    # it (until then no load record counts it, though one built meanwhile is newer than the send)
    forward_delay_s: float = 0.0
    # emulator only, with summaries: gateways also count each other's sends (send notices), seen
    # share_delay_s after them
    share_sends: bool = False
    share_delay_s: float = 0.0
    # emulator only: each sidecar counts its worker's arrivals and the uncached tokens they write to
    # its cache (every gateway's: policies.base.DecayedRate over RATE_WINDOW_S, as router/sidecar.py
    # does) and publishes both rates in its load records, which queue_aware reads as the whole
    # fleet's traffic plus its own sends since (False: no rates reported, each gateway counts its own)
    report_rates: bool = False

    def __post_init__(self) -> None:
        if self.service not in SERVICE_MODELS:
            raise ValueError(
                f"unknown service model {self.service!r}; choose from {', '.join(SERVICE_MODELS)}"
            )
        for name in [*_float_fields(self), *_COUNT_FIELDS]:
            value = getattr(self, name)
            floor = field_floor(name)
            if value < 0 or (floor == "positive" and value == 0):
                raise FieldRuleError(name, f"must be {floor}", value)
        if self.service == "emulator":
            if self.prefill_s_per_token <= 0:
                raise ValueError("the emulator service model needs prefill_s_per_token > 0")
            if self.request_overhead_s:
                raise ValueError(
                    "the emulator charges nothing per request: use prefill_pass_s (per prefill pass)"
                )
        elif self.service == "fifo" and self.cache_on_compute:
            raise ValueError("cache_on_compute applies to the batched and emulator service models only")
        elif given := [name for name in _EMULATOR_ONLY if getattr(self, name)]:
            # name only what was set: the full list left the user to find their own setting in it
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(
                f"{', '.join(sorted(given))} {verb} to the emulator service model only "
                f"(--service emulator), not {self.service}"
            )

    @property
    def cost(self) -> CostModel:
        return CostModel(self.prefill_s_per_token, self.cached_s_per_token, self.request_overhead_s)

    def compute_s(self, total: int, matched: int) -> float:
        return (
            self.request_overhead_s
            + (total - matched) * self.prefill_s_per_token
            + matched * self.cached_s_per_token
        )

    def unloaded_ttft_s(self, total: int, matched: int) -> float:
        """TTFT on an otherwise idle replica: the floor the ``ideal`` bound uses."""
        if self.service == "fifo":
            return self.compute_s(total, matched)
        steps = max(1, math.ceil((total - matched) / self.step_token_budget))
        per_step = self.prefill_pass_s if self.service == "emulator" else self.decode_base_s
        return self.compute_s(total, matched) + steps * per_step

    def scaled_time(self, factor: float) -> ServiceConfig:
        """The same engine on a clock ``factor`` times slower (every duration multiplied by it)."""
        if not factor > 0:
            raise ValueError(f"the time factor must be positive, got {factor}")
        # every float field is a duration or seconds per token (see __post_init__)
        return replace(self, **{name: getattr(self, name) * factor for name in _float_fields(self)})

    def emulator_config(self, cache_tokens: int) -> EmulatorConfig:
        """The engine emulator's configuration this model stands for (``emulator`` service)."""
        return EmulatorConfig(
            cache_tokens=cache_tokens,
            prefill_tokens_per_s=1.0 / self.prefill_s_per_token,
            cached_token_cost_s=self.cached_s_per_token,
            prefill_overhead_s=self.prefill_pass_s,
            decode_step_s=self.decode_base_s,
            decode_step_per_req_s=self.decode_s_per_seq,
            max_running=self.max_running,
            chunk_tokens=self.step_token_budget,
            cache_on_compute=self.cache_on_compute,
        )

    def as_dict(self) -> dict[str, Any]:
        keys = ["service", "prefill_s_per_token", "cached_s_per_token", "request_overhead_s"]
        if self.service in ("batched", "emulator"):
            keys += ["max_running", "step_token_budget", "decode_base_s", "decode_s_per_seq"]
            keys.append("cache_on_compute")
        if self.service == "emulator":
            keys += list(_EMULATOR_ONLY)
        return {k: getattr(self, k) for k in keys}


class Job:
    """One request inside the simulator (never shown to a policy)."""

    __slots__ = (
        "arrival_s",
        "began_prefill",
        "est_uncached",
        "finish_s",
        "index",
        "matched",
        "output_left",
        "pin_tokens",
        "prefill_left",
        "replica",
        "start_s",
        "tokens",
        "total",
        "ttft_s",
    )

    def __init__(self, index: int, arrival_s: float, tokens: bytes, output_tokens: int) -> None:
        self.index = index
        self.arrival_s = arrival_s
        self.tokens = tokens
        self.total = len(tokens) // TOKEN_BYTES
        self.output_left = max(1, output_tokens)
        self.matched = 0
        self.prefill_left = 0
        self.est_uncached = self.total
        self.replica = -1
        self.start_s = math.nan
        self.ttft_s = math.nan
        self.finish_s = math.nan
        self.pin_tokens = b""
        self.began_prefill = False  # a step has carried (part of) its prefill


def _cacheable(tokens: bytes, capacity: int) -> bytes:
    """A prompt longer than the whole cache keeps only its first ``capacity`` tokens."""
    return tokens if len(tokens) <= capacity * TOKEN_BYTES else tokens[: capacity * TOKEN_BYTES]


def _mirror_forward(mirror: RadixTree, tokens: bytes) -> int:
    """As the sidecar's ``CacheMirror.admit`` when it forwards a prompt: predict what is cached,
    then insert the prompt (a full hit only refreshes recency). Returns the predicted cached tokens."""
    matched = mirror.matched_tokens(tokens)
    if matched * TOKEN_BYTES == len(tokens):
        mirror.match_prefix(tokens)
    else:
        with contextlib.suppress(ValueError, CacheFullError):
            mirror.insert(tokens)
    return matched


class ReplicaModel(ABC):
    """Common part: identity, cache, counters. Subclasses implement the service discipline."""

    def __init__(self, replica_id: int, capacity_tokens: int, config: ServiceConfig) -> None:
        self.replica_id = replica_id
        self.tree = RadixTree(capacity_tokens)
        self.config = config
        self.routed = 0

    @abstractmethod
    def view(self, request: RouteRequest, gateway: int = 0) -> ReplicaState:
        """What a policy in gateway number ``gateway`` may see of this replica for ``request``."""

    def sidecar_tree(self) -> RadixTree:
        """What the replica's sidecar knows of its cache (summaries, pre-warm exports and routing
        matches read it): by default the engine's own tree; models that keep a sidecar-like mirror
        (one insert per routed prompt) return that."""
        return self.tree

    @abstractmethod
    def accept(self, job: Job, now: float, gateway: int = 0) -> None:
        """Take a request routed by gateway number ``gateway``."""

    def next_event_s(self) -> float | None:
        """Time of this replica's next internal event, or None when it has none pending."""
        return None

    def on_event(self, now: float) -> list[Job]:
        """Process the internal event due at ``now``; return jobs that finished."""
        return []

    @abstractmethod
    def prefill_backlog(self, now: float) -> int:
        """Requests here whose prefill has not finished (what ``sglang:num_queue_reqs`` counts)."""


class FifoReplica(ReplicaModel):
    def __init__(self, replica_id: int, capacity_tokens: int, config: ServiceConfig) -> None:
        super().__init__(replica_id, capacity_tokens, config)
        self.free_at = 0.0
        self._active: deque[Job] = deque()  # routed, prefill not finished, in start order
        self._active_uncached = 0

    def _expire(self, now: float) -> None:
        active = self._active
        while active and active[0].finish_s <= now:
            self._active_uncached -= active.popleft().prefill_left

    def view(self, request: RouteRequest, gateway: int = 0) -> ReplicaState:
        now = request.now
        self._expire(now)
        queued = sum(1 for j in self._active if j.start_s > now) if self._active else 0
        pending = self._active_uncached
        if self._active and self._active[0].start_s <= now:  # the head is part-way through prefill
            head = self._active[0]
            span = head.finish_s - head.start_s
            if span > 0:
                pending -= int(head.prefill_left * (now - head.start_s) / span)
        return ReplicaState(
            replica_id=self.replica_id,
            matched_tokens=self.tree.matched_tokens(request.tokens),
            cached_tokens=self.tree.cached_tokens,
            capacity_tokens=self.tree.capacity_tokens,
            in_flight=len(self._active),
            queued=queued,
            pending_prefill_tokens=pending,
            wait_s=max(0.0, self.free_at - now),
        )

    def prefill_backlog(self, now: float) -> int:
        self._expire(now)
        return len(self._active)

    def accept(self, job: Job, now: float, gateway: int = 0) -> None:
        self._expire(now)
        cfg = self.config
        result = self.tree.insert(_cacheable(job.tokens, self.tree.capacity_tokens))
        job.matched = result.matched_tokens
        job.prefill_left = job.total - job.matched
        job.start_s = max(now, self.free_at)
        job.finish_s = job.start_s + cfg.compute_s(job.total, job.matched)
        job.ttft_s = job.finish_s - job.arrival_s
        self.free_at = job.finish_s
        self._active.append(job)
        self._active_uncached += job.prefill_left
        self.routed += 1


class BatchedReplica(ReplicaModel):
    def __init__(self, replica_id: int, capacity_tokens: int, config: ServiceConfig) -> None:
        super().__init__(replica_id, capacity_tokens, config)
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._step_end: float | None = None
        self._step_chunks: list[tuple[Job, int]] = []
        self._step_decodes: list[Job] = []
        self._waiting_uncached = 0  # routing-time estimate for jobs not yet admitted
        self._memory_blocked = False  # the last admission stopped for lack of cache room
        self._reserved = 0  # cache_on_compute: running prompts' tokens not computed (in the tree) yet
        # cache_on_compute: what a gateway matches against (the sidecar's mirror, every routed prompt
        # inserted when routed) — the engine's tree holds computed tokens only. By default the engine
        # inserts at admission, close enough to routing that its tree serves as the mirror.
        self.mirror: RadixTree | None = RadixTree(capacity_tokens) if config.cache_on_compute else None

    def sidecar_tree(self) -> RadixTree:
        return self.tree if self.mirror is None else self.mirror

    # -- what a policy may see ----------------------------------------------------------------

    def view(self, request: RouteRequest, gateway: int = 0) -> ReplicaState:
        cfg = self.config
        now = request.now
        running_prefill = sum(j.prefill_left for j in self._running if j.prefill_left > 0)
        pending = running_prefill + self._waiting_uncached
        decoding = sum(1 for j in self._running if j.prefill_left == 0)
        step_overhead = cfg.decode_base_s + cfg.decode_s_per_seq * decoding
        per_step = max(cfg.step_token_budget - decoding, 1)
        drain = pending * cfg.prefill_s_per_token + math.ceil(pending / per_step) * step_overhead
        occupancy = len(self._running) + len(self._waiting)
        # When the last admission stopped for lack of cache room held by running requests, only as
        # many requests fit as run now: this one must wait for enough of them to finish.
        slots = max(len(self._running), 1) if self._memory_blocked else cfg.max_running
        slot_wait = 0.0
        if occupancy >= slots:
            need = occupancy - slots + 1
            left = sorted(j.output_left for j in self._running)
            if need <= len(left):
                slot_wait = left[need - 1] * step_overhead
            else:
                later = [j.output_left for j in self._waiting]
                mean_out = sum(later) / len(later) if later else 1.0
                longest = left[-1] if left else 0
                slot_wait = (longest + (need - len(left)) / slots * mean_out) * step_overhead
        in_step = max(0.0, self._step_end - now) if self._step_end is not None else 0.0
        known = self.sidecar_tree()
        matched = known.matched_tokens(request.tokens)
        if self.mirror is not None:  # a gateway matches hash blocks, as the emulator model does
            matched -= matched % DEFAULT_BLOCK_TOKENS
        return ReplicaState(
            replica_id=self.replica_id,
            matched_tokens=matched,
            cached_tokens=known.cached_tokens,
            capacity_tokens=known.capacity_tokens,
            in_flight=occupancy,
            queued=len(self._waiting),
            pending_prefill_tokens=pending,
            # + the fixed cost of the step that will carry this request's prefill
            wait_s=in_step + max(drain, slot_wait) + step_overhead,
        )

    def prefill_backlog(self, now: float) -> int:
        return len(self._waiting) + sum(1 for j in self._running if math.isnan(j.ttft_s))

    # -- service ------------------------------------------------------------------------------

    def accept(self, job: Job, now: float, gateway: int = 0) -> None:
        if self.mirror is not None:
            _mirror_forward(self.mirror, _cacheable(job.tokens, self.mirror.capacity_tokens))
        self._waiting.append(job)
        self._waiting_uncached += job.est_uncached
        self.routed += 1
        if self._step_end is None:
            self._start_step(now)

    def next_event_s(self) -> float | None:
        return self._step_end

    def _admit(self, now: float) -> None:
        cfg = self.config
        self._memory_blocked = False
        while self._waiting and len(self._running) < cfg.max_running:
            job = self._waiting[0]
            key = _cacheable(job.tokens, self.tree.capacity_tokens)
            if cfg.cache_on_compute:
                matched = self.tree.matched_tokens(key)
                pinned = self._pin_matched(key, matched)
            else:
                try:  # an empty prompt pins nothing (its finish releases no pin)
                    pinned, matched = key, self.tree.insert(key, pin=True).matched_tokens if key else 0
                except CacheFullError:
                    pinned = None
            if pinned is None:
                self._memory_blocked = True
                break  # no room while running requests hold their prefixes: wait for one to finish
            self._waiting.popleft()
            self._waiting_uncached -= job.est_uncached
            job.pin_tokens = pinned
            job.matched = matched
            job.prefill_left = job.total - job.matched
            job.start_s = now
            self._running.append(job)

    def _pin_matched(self, key: bytes, matched: int) -> bytes | None:
        """cache_on_compute admission: pin the cached prefix, make room for the rest (None: no room)."""
        tree = self.tree
        prefix = key[: matched * TOKEN_BYTES]
        if matched:
            tree.insert(prefix, pin=True)  # nothing new to cache: cannot overflow
        uncached = len(key) // TOKEN_BYTES - matched
        overflow = tree.cached_tokens + self._reserved + uncached - tree.capacity_tokens
        if overflow > 0:
            try:
                tree.evict(overflow)
            except CacheFullError:
                if matched:
                    tree.release_pin(prefix)
                return None
        self._reserved += uncached
        return prefix

    def _first_chunk_waits(self, job: Job, batch: list[bytes]) -> bool:
        """cache_on_compute, before a job's first chunk: take in what was computed since its admission
        (a job here can wait several steps for prefill budget), then say whether it should wait one
        more step because it shares an uncached prefix with ``batch``, this step's prefills."""
        key = _cacheable(job.tokens, self.tree.capacity_tokens)
        matched = self.tree.matched_tokens(key)
        if matched > job.matched:
            self._pin_upto(job, matched)
            job.matched = matched
            job.prefill_left = job.total - matched
        return shares_uncached_prefix(key, matched, batch)

    def _pin_upto(self, job: Job, upto: int) -> None:
        """Extend the job's pinned path over its first ``upto`` prompt tokens, once computed (a no-op
        when the whole prompt was pinned at admission): from now on other requests find them cached."""
        key = _cacheable(job.tokens, self.tree.capacity_tokens)
        upto = min(upto, len(key) // TOKEN_BYTES)
        held = len(job.pin_tokens) // TOKEN_BYTES
        if upto <= held:
            return
        try:
            self.tree.insert(key[: upto * TOKEN_BYTES], pin=True)
        except CacheFullError:  # the reservation rules this out; if not, they stay private
            return
        if held:
            self.tree.release_pin(job.pin_tokens)
        self._reserved -= upto - held
        job.pin_tokens = key[: upto * TOKEN_BYTES]

    def _start_step(self, now: float) -> None:
        cfg = self.config
        admitted_before = len(self._running)
        self._admit(now)
        if not self._running:
            self._step_end = None
            return
        decodes = [j for j in self._running if j.prefill_left == 0 and not math.isnan(j.ttft_s)]
        budget = cfg.step_token_budget - len(decodes)
        chunks: list[tuple[Job, int]] = []
        prefill_tokens = 0
        batch: list[bytes] = []  # prompts whose prefill begins in this step (not the chunked ones)
        for job in self._running:
            if not math.isnan(job.ttft_s):
                continue
            if cfg.cache_on_compute and not job.began_prefill and self._first_chunk_waits(job, batch):
                continue  # SGLang's in-batch prefix check: it finds that prefix cached next step
            take = min(job.prefill_left, max(budget, 0))
            if take == 0 and job.prefill_left > 0:
                break  # budget spent; later jobs wait in admission order
            if not job.began_prefill:
                batch.append(job.tokens)
                job.began_prefill = True
            chunks.append((job, take))
            budget -= take
            prefill_tokens += take
        fixed = sum(
            cfg.request_overhead_s + j.matched * cfg.cached_s_per_token
            for j in self._running[admitted_before:]
        )
        duration = (
            cfg.decode_base_s
            + cfg.decode_s_per_seq * len(decodes)
            + prefill_tokens * cfg.prefill_s_per_token
            + fixed
        )
        self._step_chunks = chunks
        self._step_decodes = decodes
        self._step_end = now + duration

    def on_event(self, now: float) -> list[Job]:
        finished: list[Job] = []
        for job, take in self._step_chunks:
            job.prefill_left -= take
            if self.config.cache_on_compute:  # by default the whole prompt is pinned from admission
                self._pin_upto(job, job.total - job.prefill_left)
            if job.prefill_left == 0:
                job.ttft_s = now - job.arrival_s  # the step that ends prefill emits the first token
                job.output_left -= 1
        for job in self._step_decodes:
            job.output_left -= 1
        still: list[Job] = []
        for job in self._running:
            if job.output_left <= 0:
                job.finish_s = now
                if self.config.cache_on_compute:  # its uncomputed rest was reserved (none by default)
                    key_tokens = len(_cacheable(job.tokens, self.tree.capacity_tokens)) // TOKEN_BYTES
                    self._reserved -= key_tokens - len(job.pin_tokens) // TOKEN_BYTES
                if job.pin_tokens:
                    self.tree.release_pin(job.pin_tokens)
                finished.append(job)
            else:
                still.append(job)
        self._running = still
        self._step_chunks, self._step_decodes = [], []
        self._step_end = None
        if self._running or self._waiting:
            self._start_step(now)
        return finished


@dataclass(slots=True)
class _LoadRecord:
    """One load record a sidecar pushes to the gateways (router/records.py ``LoadReport``)."""

    ts: float
    in_flight: int = 0
    queued: int = 0
    pending_prefill_tokens: int = 0
    prefill_tokens_per_s: float = 1.0
    fixed_latency_s: float = 0.0
    # the sidecar's decayed rates at ``ts`` (ServiceConfig.report_rates; None: not reported)
    arrivals_per_s: float | None = None
    write_tokens_per_s: float | None = None


@dataclass(slots=True)
class _Send:
    """A gateway's own request to this replica (router/view.py keeps these per worker)."""

    sent_at: float
    uncached_tokens: int
    done_at: float = math.inf


class _FrozenPrefixes:
    """A published summary: an immutable copy of a radix tree's cached prefixes, for matching only.

    Copying shares the (immutable) edge bytes, so it costs one step per node, not per token.
    """

    __slots__ = ("_root",)

    def __init__(self, tree: RadixTree) -> None:
        self._root: tuple[bytes, dict[bytes, Any]] = (b"", {})
        stack = [(self._root[1], tree.root())]
        while stack:
            into, node = stack.pop()
            for key, child in node.children.items():
                copy: tuple[bytes, dict[bytes, Any]] = (child.edge, {})
                into[key] = copy
                stack.append((copy[1], child))

    def matched_tokens(self, key: bytes) -> int:
        children, pos, n = self._root[1], 0, len(key)
        while pos < n:
            child = children.get(key[pos : pos + TOKEN_BYTES])
            if child is None:
                break
            edge, grandchildren = child
            if not key.startswith(edge, pos):
                return pos // TOKEN_BYTES + common_prefix_bytes(edge, key, pos)
            pos += len(edge)
            children = grandchildren
        return pos // TOKEN_BYTES


class _Overlay:
    """One gateway's recent sends to one replica (router/view.py's overlay): prompts it counts as
    cached there until a summary generated ``slack`` after the send covers them."""

    def __init__(self) -> None:
        self.sends: list[tuple[float, bytes]] = []  # (sent at, prompt); peers' arrive late
        self.tree = RadixTree(1 << 40)  # holds every prompt in ``sends``; never evicts
        self.notices_seen = 0  # how many of the replica's send notices this gateway has taken in

    def add(self, sent_at: float, tokens: bytes) -> None:
        self.sends.append((sent_at, tokens))
        self.tree.insert(tokens)

    def matched_tokens(self, tokens: bytes, floor: float) -> int:
        if any(sent_at < floor for sent_at, _ in self.sends):
            self.sends = [(t, kept) for t, kept in self.sends if t >= floor]
            self.tree = RadixTree(1 << 40)
            for _, kept in self.sends:
                self.tree.insert(kept)
        return self.tree.matched_tokens(tokens)


class EmulatedReplica(ReplicaModel):
    """An emulated engine behind its sidecar, as the local fleet runs it (see the module docstring).

    Requests reach the engine when routed and wait for the next iteration, as in the emulator's
    scheduler loop. The sidecar is modelled by what gateways learn from it: its cache mirror (every
    forwarded prompt inserted when forwarded, the answer's tokens when it ends; matched in whole
    hash blocks) and its :class:`LoadTracker`, fed the events the sidecar sees, pushed as a load
    record at most once per ``report_gap_s`` and seen by gateways ``report_delay_s`` later. Each
    gateway adds its own sends the latest record it has does not count yet and takes out those that
    record counts but that have ended since — as ``router/view.py`` does. With a
    ``summary_interval_s`` gateways match prompts against the mirror's last summary they adopted
    plus their own recent sends (which they count even where the mirror has evicted them since).
    """

    def __init__(
        self, replica_id: int, capacity_tokens: int, config: ServiceConfig, rng: random.Random | None = None
    ) -> None:
        super().__init__(replica_id, capacity_tokens, config)
        self.rng = rng  # given: forwarding delays are exponential with mean forward_delay_s
        self.engine = EngineModel(config.emulator_config(capacity_tokens))
        self.tree = self.engine.tree
        self.mirror = RadixTree(capacity_tokens)  # the sidecar's prediction of the engine's cache
        # A sidecar in front of the emulator starts from the speed and the fixed cost per iteration
        # (a prefill pass, then a decode step) the emulator states, then measures both.
        self.load = LoadTracker(1.0 / config.prefill_s_per_token)
        self.load.fixed_latency_s = config.prefill_pass_s + config.decode_base_s
        self._jobs: dict[str, tuple[Job, int, _Send]] = {}  # rid -> (job, tracker handle, send)
        self._step: Iteration | None = None
        self._step_end: float | None = None
        self._record = _LoadRecord(
            -math.inf,
            prefill_tokens_per_s=self.load.prefill_tokens_per_s,
            fixed_latency_s=self.load.fixed_latency_s,
        )
        self._in_transit: deque[tuple[float, _LoadRecord]] = deque()
        self._push_at: float | None = None
        self._last_push = -math.inf
        self._sends: dict[int, list[_Send]] = {}  # gateway -> its sends here not yet irrelevant
        # what gateways match against: None = the mirror itself (no summary lag)
        self._summary: _FrozenPrefixes | None = None
        self._summary_generated = -math.inf
        self._summary_at: float | None = None  # next summary publish (the mirror changed)
        self._summaries: deque[tuple[float, float, _FrozenPrefixes]] = deque()  # (seen at, generated, ...)
        self._overlays: dict[int, _Overlay] = {}
        self._notices: list[tuple[float, float, int, bytes]] = []  # (seen at, sent at, gateway, prompt)
        self._forwarded: list[tuple[float, int, Job, _Send]] = []  # heap: (reaches the sidecar at, ...)
        # the sidecar's counts of every request it forwards, whatever gateway sent it (report_rates)
        self._arrivals = DecayedRate()
        self._writes = DecayedRate()

    def sidecar_tree(self) -> RadixTree:
        return self.mirror

    def carry_sidecar_from(self, earlier: EmulatedReplica) -> None:
        """Keep the sidecar of ``earlier`` with everything it measured (prefill rate, fixed latency):
        a live sidecar outlives the cache flush between two ``up`` policy runs. ``earlier`` must
        have finished every request."""
        if earlier.load.in_flight:
            raise ValueError("a sidecar can be carried over only once its requests have finished")
        self.load = earlier.load
        self._record.prefill_tokens_per_s = self.load.prefill_tokens_per_s
        self._record.fixed_latency_s = self.load.fixed_latency_s

    def view(self, request: RouteRequest, gateway: int = 0) -> ReplicaState:
        rec = self._record
        now = request.now
        own = self._sends.get(gateway, ())
        unreported = [s for s in own if s.sent_at > rec.ts and s.done_at > now]
        ended = [s for s in own if s.sent_at <= rec.ts < s.done_at <= now]
        pending = max(
            rec.pending_prefill_tokens
            + sum(s.uncached_tokens for s in unreported)
            - sum(s.uncached_tokens for s in ended),
            0,
        )
        matched = self._matched_tokens(request, gateway)
        return ReplicaState(
            replica_id=self.replica_id,
            matched_tokens=matched,  # already floored to whole blocks
            cached_tokens=self.mirror.cached_tokens,
            capacity_tokens=self.mirror.capacity_tokens,
            in_flight=max(rec.in_flight + len(unreported) - len(ended), 0),
            queued=rec.queued + len(unreported),
            pending_prefill_tokens=pending,
            wait_s=pending / rec.prefill_tokens_per_s + rec.fixed_latency_s,
            reported_arrivals_per_s=rec.arrivals_per_s,
            reported_write_tokens_per_s=rec.write_tokens_per_s,
            reported_at=rec.ts if rec.arrivals_per_s is not None else 0.0,
        )

    def _matched_tokens(self, request: RouteRequest, gateway: int) -> int:
        if self._summary is None and not self.config.summary_interval_s:
            matched = self.mirror.matched_tokens(request.tokens)
        else:
            summary = self._summary.matched_tokens(request.tokens) if self._summary is not None else 0
            overlay = self._overlays.setdefault(gateway, _Overlay())
            notices = self._notices
            while overlay.notices_seen < len(notices) and notices[overlay.notices_seen][0] <= request.now:
                _, sent_at, sender, tokens = notices[overlay.notices_seen]
                if sender != gateway:
                    overlay.add(sent_at, tokens)  # a peer's send, stamped with its send time
                overlay.notices_seen += 1
            floor = self._summary_generated - self.config.overlay_slack_s
            own = overlay.matched_tokens(request.tokens, floor)
            matched = max(summary, own)  # both are prefix-closed: their union's prefix is the longer
        return matched - matched % DEFAULT_BLOCK_TOKENS

    def prefill_backlog(self, now: float) -> int:
        return self.load.queued

    def accept(self, job: Job, now: float, gateway: int = 0) -> None:
        if job.total + job.output_left > self.tree.capacity_tokens:
            # A live engine answers 400; a simulated fleet that cannot serve its workload is a setup error.
            raise ValueError(
                f"request #{job.index}: {job.total} prompt + {job.output_left} output tokens exceed the "
                f"{self.tree.capacity_tokens}-token KV pool of an emulated engine, which would refuse it"
            )
        # The gateway's side, now: its own send (counted until a load record counts it) and overlay.
        send = _Send(now, job.est_uncached)
        self._sends.setdefault(gateway, []).append(send)
        if self.config.summary_interval_s:
            self._overlays.setdefault(gateway, _Overlay()).add(now, job.tokens)
            if self.config.share_sends:
                self._notices.append((now + self.config.share_delay_s, now, gateway, job.tokens))
        self.routed += 1
        delay = self.config.forward_delay_s
        if delay and self.rng is not None:
            delay = self.rng.expovariate(1.0 / delay)
        heapq.heappush(self._forwarded, (now + delay, job.index, job, send))
        if not delay:
            self._arrive(now)

    def _arrive(self, now: float) -> None:
        """Forwarded requests reach the sidecar (mirror, load tracker) and the engine's queue."""
        while self._forwarded and self._forwarded[0][0] <= now:
            _, _, job, send = heapq.heappop(self._forwarded)
            rid = str(job.index)
            # The emulator's deterministic continuation: it is cached with the prompt when done.
            words = generated_words(generation_seed(job.tokens), job.output_left)
            output = as_token_bytes(generated_tokens(words))
            self.engine.submit(EngineRequest(rid, job.tokens, job.output_left, output, now))
            predicted = self._mirror_admit(job.tokens, now)
            handle = self.load.admit(job.total - predicted, now, timed=True)
            if self.config.report_rates:  # as the sidecar counts them: the prompt past its mirror's match
                self._arrivals.add(1.0, now, RATE_WINDOW_S)
                self._writes.add(max(job.total - predicted, 0), now, RATE_WINDOW_S)
            self._jobs[rid] = (job, handle, send)
            job.start_s = now
            self._load_changed(now)
        if self._step is None:
            self._plan(now)

    def _mirror_admit(self, tokens: bytes, now: float) -> int:
        """As the sidecar's ``CacheMirror.admit``: returns the tokens it predicted cached."""
        matched = _mirror_forward(self.mirror, tokens)
        if matched * TOKEN_BYTES != len(tokens):
            self._mirror_changed(now)
        return matched

    def _mirror_changed(self, now: float) -> None:
        interval = self.config.summary_interval_s
        if interval and self._summary_at is None:
            # the sidecar's periodic publish round after the change
            self._summary_at = (math.floor(now / interval) + 1) * interval

    def _publish_summary(self, now: float) -> None:
        # (a summary holds whole blocks only: matches are floored to blocks when shown)
        self._summary_at = None
        self._summaries.append((now + self.config.summary_delay_s, now, _FrozenPrefixes(self.mirror)))

    def _load_changed(self, now: float) -> None:
        if self._push_at is None:
            self._push_at = max(now, self._last_push + self.config.report_gap_s)

    def _plan(self, now: float) -> None:
        self._step = self.engine.plan(now)
        self._step_end = None if self._step is None else now + self._step.duration

    def next_event_s(self) -> float | None:
        times = [t for t in (self._step_end, self._push_at, self._summary_at) if t is not None]
        if self._forwarded:
            times.append(self._forwarded[0][0])
        if self._in_transit:
            times.append(self._in_transit[0][0])
        if self._summaries:
            times.append(self._summaries[0][0])
        return min(times, default=None)

    def on_event(self, now: float) -> list[Job]:
        finished = self._commit(now) if self._step_end is not None and self._step_end <= now else []
        if self._forwarded and self._forwarded[0][0] <= now:
            self._arrive(now)
        if self._push_at is not None and self._push_at <= now:
            self._push(now)
        while self._in_transit and self._in_transit[0][0] <= now:
            self._record = self._in_transit.popleft()[1]
            self._forget_settled_sends()
        if self._summary_at is not None and self._summary_at <= now:
            self._publish_summary(now)
        while self._summaries and self._summaries[0][0] <= now:
            _, self._summary_generated, self._summary = self._summaries.popleft()
        return finished

    def _push(self, now: float) -> None:
        load = self.load
        record = _LoadRecord(
            ts=now,
            in_flight=load.in_flight,
            queued=load.queued,
            pending_prefill_tokens=load.pending_prefill_tokens(now),
            prefill_tokens_per_s=load.prefill_tokens_per_s,
            fixed_latency_s=load.fixed_latency_s,
        )
        if self.config.report_rates:
            record.arrivals_per_s = self._arrivals.rate(now, RATE_WINDOW_S)
            record.write_tokens_per_s = self._writes.rate(now, RATE_WINDOW_S)
        self._push_at, self._last_push = None, now
        self._in_transit.append((now + self.config.report_delay_s, record))

    def _forget_settled_sends(self) -> None:
        ts = self._record.ts
        for gateway, sends in self._sends.items():
            self._sends[gateway] = [s for s in sends if s.done_at > ts]

    def _commit(self, now: float) -> list[Job]:
        step, self._step = self._step, None
        assert step is not None
        finished: list[Job] = []
        for progress in self.engine.commit(step, now):
            request = progress.request
            job, handle, send = self._jobs[request.rid]
            if progress.first:
                job.matched = request.cached_tokens
                job.ttft_s = now - job.arrival_s
                self.load.first_byte(handle, now)
                self.load.report_uncached(handle, request.uncached_tokens)
            if progress.finished:
                job.finish_s = now
                send.done_at = now
                self.load.finish(handle, now)
                with contextlib.suppress(ValueError, CacheFullError):
                    self.mirror.insert(request.prompt + request.output[: request.generated * TOKEN_BYTES])
                self._mirror_changed(now)
                del self._jobs[request.rid]
                finished.append(job)
        self._load_changed(now)
        self._plan(now)
        return finished


def make_replica(replica_id: int, capacity_tokens: int, config: ServiceConfig) -> ReplicaModel:
    cls = {"fifo": FifoReplica, "batched": BatchedReplica, "emulator": EmulatedReplica}[config.service]
    return cls(replica_id, capacity_tokens, config)
