"""An independent audit of `prefixfleet sim-autoscale`'s numbers (docs/autoscaling.md, the README table).

The command runs on a small viral scenario while every engine step, control round and phase change
is logged from outside (wrappers around the simulator's methods; nothing in the simulator is
changed). Each reported per-scaler metric is then recomputed by brute force from those raw logs —
not from the fields the report reads — and compared with the JSON the command wrote:

* TTFT of every request = end of the engine step that carried the last chunk of its prefill minus
  its arrival; a request no step carried counts as a miss (infinite TTFT), never as absent;
* cached tokens = prompt − the prefill tokens the steps actually charged, and that must equal the
  longest prefix the request shares with a prompt admitted earlier on the same replica (the run
  never evicts; eviction is checked on its own below);
* replica-seconds = the integral of the fleet's size (every replica, starting, warming, draining)
  over [0, last arrival], the size taken from the membership changes the control rounds made;
* a new replica's 30-s window starts when its phase turned ready (it starts serving);
* scale events = control rounds that added a replica or started a drain.

Also checked: every scaler ran on the same request objects with the same routing policy and fleet
(the configs differ in the scaler mode only), each step's duration is the documented batched formula,
the start-up delay holds for every scaler, and a pre-warm takes the new replica's own time.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prefixfleet.sim.autoscale_cli as autoscale_cli
from prefixfleet.cli import main
from prefixfleet.operator.autoscale import SCALER_MODES
from prefixfleet.router.radix import TOKEN_BYTES
from prefixfleet.sim.autoscale import ElasticConfig, ElasticFleet, ElasticRun
from prefixfleet.sim.autoscale_report import scaler_metrics
from prefixfleet.sim.engine import BatchedReplica, Job, ServiceConfig
from prefixfleet.sim.workloads import WorkloadRequest

pytestmark = pytest.mark.slow

# ~690 requests over 100 s on 1-4 replicas: every scaler but fixed_max scales up and drains, the
# pre-warm scaler warms a new replica before it serves, and nothing is evicted (2M-token caches),
# so hits can be recomputed from prompts alone. A few seconds per scaler.
SCENARIO = {
    "duration_s": 100,
    "tenants": 6,
    "prefix_tokens_min": 500,
    "prefix_tokens_max": 1500,
    "unique_tokens_min": 200,
    "unique_tokens_max": 600,
    "output_tokens": 8,
    "rate_rps": 3,
    "viral_start_s": 15,
    "ramp_s": 10,
    "hold_s": 35,
    "fade_s": 10,
    "viral_prefix_tokens": 2000,
    "surge": 5,
}
STARTUP_S = 8.0
PREFILL_S = 0.0001
CACHED_S = 0.00001  # non-zero so the cached-token term of the step formula is exercised
BUDGET = 1024
ARGV = [
    "sim-autoscale", "--scenario", "viral", "--seed", "1", "--min", "1", "--max", "4",
    "--cache-tokens", "2000000", "--startup-delay-s", str(STARTUP_S), "--control-interval-s", "2",
    "--scale-up-cooldown-s", "10", "--scale-down-stabilization-s", "15", "--no-progress",
    "--engine", f"prefill_s_per_token={PREFILL_S}", "--engine", f"cached_s_per_token={CACHED_S}",
    "--engine", f"step_token_budget={BUDGET}",
    *[f"--set={k}={v}" for k, v in SCENARIO.items()],
]  # fmt: skip
WINDOW_S = 30.0


@dataclass
class Step:
    """One engine step as logged when it was scheduled."""

    replica: int
    start: float
    end: float
    chunks: list[tuple[Job, int]]  # (job, prefill tokens it carries)
    decodes: int
    admitted: list[Job]  # admitted when this step was scheduled, in admission order


@dataclass
class Round:
    """What one control round's execution changed in the fleet."""

    t: float
    added: list[str]
    removed: list[str]
    drained: list[str]


@dataclass
class Log:
    steps: list[Step] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    phases: list[tuple[float, str, str]] = field(default_factory=list)  # (t, replica, phase after)


@dataclass
class Audit:
    reported: dict[str, Any]
    runs: dict[str, ElasticRun]
    requests: dict[str, Sequence[WorkloadRequest]]
    configs: dict[str, ElasticConfig]
    logs: dict[str, Log]


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audit]:
    out = tmp_path_factory.mktemp("audit") / "viral.json"
    runs: dict[str, ElasticRun] = {}
    requests: dict[str, Sequence[WorkloadRequest]] = {}
    configs: dict[str, ElasticConfig] = {}
    logs: dict[str, Log] = {}
    current: list[Log] = []
    simulate = autoscale_cli.simulate_elastic
    start_step, execute = BatchedReplica._start_step, ElasticFleet.execute
    transition = ElasticFleet._transition

    def logged_simulate(reqs, config, **kw):
        current[:] = [Log()]
        run = simulate(reqs, config, **kw)
        runs[run.scaler], requests[run.scaler], configs[run.scaler] = run, reqs, config
        logs[run.scaler] = current[0]
        return run

    def logged_start_step(self: BatchedReplica, now: float) -> None:
        before = {id(j) for j in self._running}
        start_step(self, now)
        if self._step_end is not None:
            admitted = [j for j in self._running if id(j) not in before]
            decodes = len(self._step_decodes)
            current[0].steps.append(
                Step(self.replica_id, now, self._step_end, list(self._step_chunks), decodes, admitted)
            )

    def logged_execute(self: ElasticFleet, plan, observed, now: float) -> None:
        before = {m.name: m.phase for m in self.live}
        execute(self, plan, observed, now)
        after = {m.name: m.phase for m in self.live}
        current[0].rounds.append(
            Round(
                now,
                added=[n for n in after if n not in before],
                removed=[n for n in before if n not in after],
                drained=[n for n, p in after.items() if p == "draining" and before.get(n) != "draining"],
            )
        )

    def logged_transition(self: ElasticFleet, member, now: float) -> None:
        transition(self, member, now)
        current[0].phases.append((now, member.name, member.phase))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(autoscale_cli, "simulate_elastic", logged_simulate)
        mp.setattr(BatchedReplica, "_start_step", logged_start_step)
        mp.setattr(ElasticFleet, "execute", logged_execute)
        mp.setattr(ElasticFleet, "_transition", logged_transition)
        assert main([*ARGV, "--json", str(out)]) == 0
    yield Audit(json.loads(Path(out).read_text()), runs, requests, configs, logs)


def lcp_tokens(a: bytes, b: bytes) -> int:
    """Tokens two prompts share from their start (binary search over slice comparisons)."""
    lo, hi = 0, min(len(a), len(b)) // TOKEN_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: mid * TOKEN_BYTES] == b[: mid * TOKEN_BYTES]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Recomputed:
    ttft_s: list[float]  # inf: no step finished its prefill
    replica: list[int]  # the replica whose steps carried it (-1: none)
    prefill: list[int]  # prefill tokens the steps charged
    first_token_s: dict[int, float]  # id(job) -> end of its last prefill chunk, warm-ups included
    matched: dict[int, int]  # id(job) -> longest prefix shared with an earlier admission there
    jobs: dict[int, Job]


def recompute_requests(log: Log, requests: Sequence[WorkloadRequest]) -> Recomputed:
    n = len(requests)
    ttft, replica, prefill = [math.inf] * n, [-1] * n, [0] * n
    first_token: dict[int, float] = {}
    matched: dict[int, int] = {}
    jobs: dict[int, Job] = {}
    admitted_before: dict[int, list[bytes]] = defaultdict(list)  # per replica, sorted prompts
    for step in log.steps:  # the log is in simulated-time order (the simulator is sequential)
        prompts = admitted_before[step.replica]
        for job in step.admitted:
            k = bisect.bisect_left(prompts, job.tokens)
            neighbours = prompts[max(k - 1, 0) : k + 1]  # the longest common prefix is a neighbour's
            matched[id(job)] = max((lcp_tokens(job.tokens, p) for p in neighbours), default=0)
            prompts.insert(k, job.tokens)
            jobs[id(job)] = job
        for job, take in step.chunks:
            first_token[id(job)] = step.end  # the last step carrying a chunk finishes its prefill
            if job.index >= 0:
                prefill[job.index] += take
                replica[job.index] = step.replica
                ttft[job.index] = step.end - requests[job.index].arrival_s
    return Recomputed(ttft, replica, prefill, first_token, matched, jobs)


def fleet_size_integral(log: Log, initial: int, horizon: float) -> float:
    size, last, total = initial, 0.0, 0.0
    for r in log.rounds:
        if r.t > horizon:
            break
        total += size * (r.t - last)
        size += len(r.added) - len(r.removed)
        last = r.t
    return total + size * (horizon - last)


def ready_times(log: Log) -> dict[str, float]:
    out: dict[str, float] = {}
    for t, name, phase in log.phases:
        if phase == "ready":
            out.setdefault(name, t)
    return out


def brute_force_metrics(audit: Audit, scaler: str, target_s: float) -> dict[str, Any]:
    log, requests, config = audit.logs[scaler], audit.requests[scaler], audit.configs[scaler]
    rec = recompute_requests(log, requests)
    n = len(requests)
    ttft_ms = np.array(rec.ttft_s) * 1000.0
    new = [name for r in log.rounds for name in r.added]
    ready = ready_times(log)
    rates = []
    for name in new:
        k = int(name[1:])
        if name not in ready:
            continue
        t0 = ready[name]
        chosen = [i for i in range(n) if rec.replica[i] == k and t0 <= requests[i].arrival_s < t0 + WINDOW_S]
        prompt = sum(len(requests[i].tokens) // TOKEN_BYTES for i in chosen)
        cached = sum(len(requests[i].tokens) // TOKEN_BYTES - rec.prefill[i] for i in chosen)
        if prompt:
            rates.append(cached / prompt)
    return {
        "slo_attainment": sum(1 for t in rec.ttft_s if t <= target_s) / n,
        "p99_ttft_ms": float(np.percentile(ttft_ms, 99)),  # numpy's default: linear interpolation
        "replica_seconds": fleet_size_integral(log, config.initial, max(r.arrival_s for r in requests)),
        "new_replica_hit_rate_30s": sum(rates) / len(rates) if rates else None,
        "scale_events": sum(1 for r in log.rounds if r.added or r.drained),
    }


def assert_same(reported: dict[str, Any], recomputed: dict[str, Any], what: str) -> None:
    assert reported["slo_attainment"] == pytest.approx(recomputed["slo_attainment"], abs=5e-5), what
    assert reported["p99_ttft_ms"] == pytest.approx(recomputed["p99_ttft_ms"], abs=0.05), what
    assert reported["replica_seconds"] == pytest.approx(recomputed["replica_seconds"], abs=0.05), what
    if recomputed["new_replica_hit_rate_30s"] is None:
        assert reported["new_replica_hit_rate_30s"] is None, what
    else:
        hit = recomputed["new_replica_hit_rate_30s"]
        assert reported["new_replica_hit_rate_30s"] == pytest.approx(hit, abs=5e-5), what
    assert reported["scale_events"] == recomputed["scale_events"], what


def test_the_scenario_exercises_what_is_audited(audit: Audit) -> None:
    assert set(audit.runs) == set(SCALER_MODES)
    for scaler in ("uniform", "prefix_aware", "prefix_aware_prewarm"):
        log = audit.logs[scaler]
        assert any(r.added for r in log.rounds) and any(r.removed for r in log.rounds), scaler
    assert any(phase == "warming" for _, _, phase in audit.logs["prefix_aware_prewarm"].phases)
    for run in audit.runs.values():  # hits below are recomputed from prompts: nothing may be evicted
        assert all(m.model.tree.evicted_tokens_total == 0 for m in run.members)


def test_every_reported_metric_matches_a_brute_force_recomputation(audit: Audit) -> None:
    target = audit.reported["settings"]["target_ttft_ms"] / 1000.0
    for scaler in SCALER_MODES:
        recomputed = brute_force_metrics(audit, scaler, target)
        assert_same(audit.reported["scalers"][scaler], recomputed, scaler)
        # the TTFT target of the run meets every request here; tighter ones split them
        for tight in (0.15, 0.25, 0.4):
            reported = scaler_metrics(audit.runs[scaler], tight)
            assert_same(reported, brute_force_metrics(audit, scaler, tight), f"{scaler} at {tight}s")
            assert 0.0 < reported["slo_attainment"] < 1.0 or scaler == "fixed_max"


def test_every_request_is_served_once_and_counted_where_it_ran(audit: Audit) -> None:
    for scaler, run in audit.runs.items():
        rec = recompute_requests(audit.logs[scaler], audit.requests[scaler])
        assert all(math.isfinite(t) and t > 0 for t in rec.ttft_s), scaler  # no request left behind
        assert rec.replica == run.member, scaler
        assert run.ttft_s == pytest.approx(rec.ttft_s, abs=1e-9), scaler


def test_hits_are_the_shared_prefix_and_are_subtracted_from_prefill(audit: Audit) -> None:
    for scaler, run in audit.runs.items():
        rec = recompute_requests(audit.logs[scaler], audit.requests[scaler])
        by_index = {job.index: job for job in rec.jobs.values() if job.index >= 0}
        for i, req in enumerate(audit.requests[scaler]):
            total = len(req.tokens) // TOKEN_BYTES
            shared = rec.matched[id(by_index[i])]
            assert rec.prefill[i] == total - shared, (scaler, i)
            assert run.cached_tokens[i] == shared, (scaler, i)


def test_every_step_takes_the_documented_batched_time(audit: Audit) -> None:
    """decode_base + decode_s_per_seq × decoding + prefill tokens × prefill_s_per_token + cached tokens
    of newly admitted requests × cached_s_per_token, within the token budget; a request decodes in
    exactly output_tokens − 1 steps after the one that gave its first token."""
    for scaler in audit.runs:
        config = audit.configs[scaler].service
        rec = recompute_requests(audit.logs[scaler], audit.requests[scaler])
        steps_of: dict[int, list[Step]] = defaultdict(list)
        for step in audit.logs[scaler].steps:
            steps_of[step.replica].append(step)
        for replica, steps in steps_of.items():
            jobs = [j for step in steps for j in step.admitted]  # requests and warm-ups it ran
            # a job decodes in the steps starting in [its first token, its finish): count by bisection
            starts = [step.start for step in steps]
            began = sorted(rec.first_token_s[id(j)] for j in jobs)
            ended = sorted(j.finish_s for j in jobs)
            for step in steps:
                decoding = bisect.bisect_right(began, step.start) - bisect.bisect_right(ended, step.start)
                assert step.decodes == decoding, (scaler, replica, step.start)
                tokens = sum(take for _, take in step.chunks)
                assert tokens <= max(config.step_token_budget - decoding, 0)
                expected = (
                    config.decode_base_s
                    + config.decode_s_per_seq * decoding
                    + tokens * config.prefill_s_per_token
                    + sum(config.cached_s_per_token * rec.matched[id(j)] for j in step.admitted)
                )
                assert step.end - step.start == pytest.approx(expected, abs=1e-9), (scaler, step.start)
            for j in jobs:
                decoded = bisect.bisect_left(starts, j.finish_s) - bisect.bisect_left(
                    starts, rec.first_token_s[id(j)]
                )
                outputs = SCENARIO["output_tokens"] if j.index >= 0 else 1
                assert decoded == outputs - 1, (scaler, j.index)


def test_all_scalers_ran_on_one_trace_with_one_routing_policy_and_fleet(audit: Audit) -> None:
    first = audit.requests["fixed_max"]
    base = audit.configs["uniform"]
    for scaler in SCALER_MODES:
        assert audit.requests[scaler] is first
        config = audit.configs[scaler]
        assert config.routing_policy == "queue_aware"
        # the same fleet, engine, start-up and control loop: only the scaler's mode differs
        assert dataclasses.replace(base, policy=dataclasses.replace(base.policy, mode=scaler)) == config
        rec = recompute_requests(audit.logs[scaler], first)
        arrivals = sorted(first[i].arrival_s for i in range(len(first)) if math.isfinite(rec.ttft_s[i]))
        assert arrivals == [r.arrival_s for r in first]
    assert audit.reported["settings"]["seed"] == 1


def test_start_up_delay_holds_for_every_scaler_and_prewarm_takes_the_new_replicas_time(audit: Audit) -> None:
    for scaler, run in audit.runs.items():
        log = audit.logs[scaler]
        rec = recompute_requests(log, audit.requests[scaler])
        ready = ready_times(log)
        created = {name: r.t for r in log.rounds for name in r.added}
        for name, t0 in created.items():
            k = int(name[1:])
            first_phase = next((t, p) for t, n, p in log.phases if n == name)
            assert first_phase[0] == pytest.approx(t0 + STARTUP_S), (scaler, name)
            its_steps = [s for s in log.steps if s.replica == k]
            assert all(s.start >= t0 + STARTUP_S for s in its_steps), (scaler, name)  # no work while starting
            served = [i for i, r in enumerate(rec.replica) if r == k]
            assert all(audit.requests[scaler][i].arrival_s >= ready[name] for i in served), (scaler, name)
            if first_phase[1] != "warming":
                assert ready[name] == first_phase[0]
                continue
            # warming: only its warm-ups run until it turns ready, which is when their last chunk ends
            before_ready = [s for s in its_steps if s.start < ready[name]]
            assert before_ready and all(j.index < 0 for s in before_ready for j, _ in s.chunks)
            assert ready[name] == max(s.end for s in before_ready)
            warm_tokens = sum(take for s in before_ready for _, take in s.chunks)
            assert ready[name] - first_phase[0] >= warm_tokens * PREFILL_S > 0
            assert run.members[k].created_s == t0


def serve(replica: BatchedReplica, arrivals: Sequence[tuple[float, bytes, int]]) -> list[Job]:
    """Drive one replica through ``arrivals`` (time, prompt, output tokens) until it is idle."""
    jobs = []
    for i, (t, tokens, out) in enumerate(arrivals):
        while (ev := replica.next_event_s()) is not None and ev <= t:
            replica.on_event(ev)
        job = Job(i, t, tokens, out)
        job.est_uncached = job.total
        replica.accept(job, t)
        jobs.append(job)
    while (ev := replica.next_event_s()) is not None:
        replica.on_event(ev)
    return jobs


def prompt(start: int, n: int) -> bytes:
    return b"".join(k.to_bytes(TOKEN_BYTES, "little") for k in range(start, start + n))


def test_a_replicas_cache_survives_idle_time_and_is_evicted_lru_only_at_capacity() -> None:
    config = ServiceConfig(service="batched", prefill_s_per_token=PREFILL_S, step_token_budget=BUDGET)
    replica = BatchedReplica(0, 3000, config)
    p = prompt(0, 1000)  # a shared prefix
    arrivals = [
        (0.0, p + prompt(10_000, 200), 1),  # cold: 1200 tokens, two steps
        (1000.0, p + prompt(20_000, 200), 1),  # idle for 1000 s: the prefix is still there
        (1001.0, prompt(30_000, 800), 1),
        (1002.0, prompt(40_000, 800), 1),  # 3000 tokens cached: full, nothing evicted yet
        (1003.0, p + prompt(50_000, 200), 1),  # a hit; its 200 new tokens evict the LRU leaf (t=0)
        (1004.0, prompt(60_000, 1500), 1),  # evicts 1500+: the two 800s and the 1000-s tail
        (1005.0, prompt(70_000, 1400), 1),  # evicts the prefix's last tail, then the prefix
        (1006.0, p + prompt(80_000, 200), 1),  # a miss
    ]
    jobs = serve(replica, arrivals)
    assert [j.matched for j in jobs] == [0, 1000, 0, 0, 1000, 0, 0, 0]
    base = config.decode_base_s
    assert jobs[0].ttft_s == pytest.approx(2 * base + 1200 * PREFILL_S)  # ceil(1200 / 1024) steps
    assert jobs[1].ttft_s == pytest.approx(base + 200 * PREFILL_S)  # the hit is not prefilled again
    assert replica.tree.cached_tokens <= 3000
