"""Non-finite samples in a sidecar's /metrics (the autoscaler's fallback when Prometheus is absent or
down): a NaN or infinite counter or queue gauge is no reading, as the Prometheus path already drops
non-finite values (prometheus_source.values_by_pod); a non-finite token counter makes the whole
sample none. Before, a NaN ``sglang:num_queue_reqs`` reached
observe_fleet's ``int()`` and every round raised ValueError; a NaN counter made a NaN prefill load,
which plan_scale's ``math.ceil`` refused the same way."""

from __future__ import annotations

import pytest

from prefixfleet.operator.autoscale import ScalePolicy, plan_scale
from prefixfleet.operator.autoscale_observe import engine_reading, observe_fleet, parse_token_counters
from prefixfleet.operator.planner import ObservedPod
from prefixfleet.router.records import LoadReport

LOAD = LoadReport(
    seq=1, ts=0.0, state="ready", engine_ok=True, in_flight=0, queued=1, pending_prefill_tokens=0,
    prefill_tokens_per_s=4000.0, cached_tokens=0, capacity_tokens=60000, summary_version=0,
)  # fmt: skip


def exposition(prompt: str, cached: str, queue: str) -> str:
    return (
        f"sglang:prompt_tokens_total {prompt}\nsglang:cached_tokens_total {cached}\n"
        f"sglang:num_queue_reqs {queue}\n"
    )


@pytest.mark.parametrize(
    ("later", "rated", "queue"),
    [
        (exposition("8000", "0", "NaN"), True, None),  # the queue gauge alone: the rates still count
        # a counter: no reading this round (a 0 would read as an engine restart, then a spike)
        (exposition("NaN", "0", "3"), False, None),
        (exposition("+Inf", "-Inf", "+Inf"), False, None),
    ],
)
def test_a_non_finite_sample_is_no_reading_and_the_round_plans(
    later: str, rated: bool, queue: float | None
) -> None:
    before = parse_token_counters(exposition("0", "0", "0"), 0.0)
    now = parse_token_counters(later, 1.0)
    assert before is not None
    reading = engine_reading(["p"], {"p": before}, {"p": now} if now is not None else {})
    assert ("p" in reading.rates) == rated
    assert reading.queues().get("p") == queue
    pod = ObservedPod(name="p", phase="Running", ready=True, pod_ip="127.0.0.1")
    observed = observe_fleet(1.0, 1, [pod], {"p": LOAD}, reading.prefill_loads({"p": LOAD}), (),
                             reading.queues())  # fmt: skip
    [replica] = observed.replicas
    assert replica.queued == max(LOAD.queued, int(queue or 0))
    assert replica.prefill_load == (2.0 if rated else 0.0)  # 8000 uncached tokens/s over 4000/s
    plan_scale(observed, ScalePolicy())  # plans (it raised ValueError on the NaN)
