"""The simulator's ``batched`` replica as the virtual-clock tests set it up (no I/O, no wall time).

Shared by tests/test_insert_timing.py and tests/test_sim_gateway_view.py.
"""

from __future__ import annotations

from prefixfleet.sim.engine import BatchedReplica, ServiceConfig


def batched_replica(cache_on_compute: bool, *, capacity: int, budget: int = 200) -> BatchedReplica:
    """Replica 0 of ``capacity`` cached tokens: 1 ms a prefill token, ``budget`` tokens a step,
    10 ms a decode step whatever the batch."""
    cfg = ServiceConfig(
        "batched",
        prefill_s_per_token=0.001,
        max_running=8,
        step_token_budget=budget,
        decode_base_s=0.01,
        decode_s_per_seq=0.0,
        cache_on_compute=cache_on_compute,
    )
    return BatchedReplica(0, capacity, cfg)
