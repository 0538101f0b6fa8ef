"""The elastic fleet removes a drained replica only once every request sent to it has finished.

With the ``emulator`` service model and a ``forward_delay_s``, a request routed to a replica just
before it was drained can still be on its way to the sidecar when the next control round reads the
replica's load: no load record built meanwhile counts it (as live), so the plan lists the replica
as idle. Removing it then dropped the request, and ``sim-autoscale`` ended in a RuntimeError
("requests never got a first token").
"""

from __future__ import annotations

import math

from prefixfleet.operator.autoscale import ScalePolicy
from prefixfleet.sim.autoscale import ElasticConfig, simulate_elastic
from prefixfleet.sim.engine import ServiceConfig
from prefixfleet.sim.scenarios import build_scenario

# One minute of a small viral burst on 1-3 replicas: uniform scales up and drains within it.
SMALL_VIRAL = {
    "duration_s": "60",
    "tenants": "6",
    "prefix_tokens_min": "300",
    "prefix_tokens_max": "1500",
    "unique_tokens_min": "50",
    "unique_tokens_max": "400",
    "output_tokens": "8",
    "rate_rps": "3",
    "viral_start_s": "10",
    "ramp_s": "5",
    "hold_s": "20",
    "fade_s": "5",
    "viral_prefix_tokens": "2000",
    "surge": "6",
}


def test_a_drained_replica_is_removed_only_after_the_requests_still_in_transit_to_it() -> None:
    requests = build_scenario("viral", seed=43, **SMALL_VIRAL).requests
    # a 3 s trip from gateway to sidecar, control rounds every second
    service = ServiceConfig("emulator", prefill_s_per_token=0.0002, forward_delay_s=3.0)
    policy = ScalePolicy(
        mode="uniform",
        min_replicas=1,
        max_replicas=3,
        target_ttft_s=1.0,
        prefill_s_per_token=service.prefill_s_per_token,
        lead_time_s=10.0,
        scale_up_cooldown_s=5.0,
        scale_down_stabilization_s=0.0,
    )
    config = ElasticConfig(
        cache_tokens=8000,
        policy=policy,
        service=service,
        initial_replicas=2,
        startup_delay_s=10.0,
        control_interval_s=1.0,
    )
    run = simulate_elastic(requests, config, progress=False)  # raised RuntimeError before

    assert len(run.ttft_s) == len(requests)
    assert all(math.isfinite(t) and t >= service.forward_delay_s for t in run.ttft_s)
    removed = [m for m in run.members if m.removed_s is not None]
    assert removed, "the scenario should drain and remove a replica"
    index = {m.name: i for i, m in enumerate(run.members)}
    for m in removed:
        mine = [i for i, who in enumerate(run.member) if who == index[m.name]]
        served = [run.arrival_s[i] + run.ttft_s[i] for i in mine]
        # every request sent to it got its first token while it still existed
        assert all(done <= m.removed_s for done in served), m.name
