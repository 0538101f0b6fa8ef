"""Scale a trace down by sampling whole prefix groups, keeping its reuse structure and arrival rate.

Taking the first N requests of a Mooncake trace keeps almost none of its reuse: conversations span
the whole trace, so its first 600 requests reuse ~11% of tokens where the whole trace reuses ~65%.
In such a trace two requests share a prefix only if they share their first block, i.e. the same
``group``. Sampling whole groups therefore keeps every sampled request's reuse intact; compressing
the timeline by the sampled fraction then restores the original aggregate arrival rate and the
number of distinct tokens touched per unit of time (cache pressure), with N requests instead of all.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any


def _group_key(group: object, seed: int) -> int:
    return zlib.crc32(f"{seed}:{group}".encode())


def sample_groups(workload: Any, target_requests: int, *, seed: int = 0) -> Any:
    """A :class:`Workload` of whole groups totalling about ``target_requests`` requests.

    Groups are taken in a seed-determined pseudo-random order until the target is reached; arrival
    times are multiplied by the sampled fraction of requests. Returns ``workload`` unchanged when
    it already has at most ``target_requests`` requests.
    """
    if target_requests < 1:
        raise ValueError(f"target_requests must be at least 1, got {target_requests}")
    total = len(workload.requests)
    if total <= target_requests:
        return workload
    sizes: dict[object, int] = {}
    for req in workload.requests:
        sizes[req.group] = sizes.get(req.group, 0) + 1
    chosen: set[object] = set()
    count = 0
    for group in sorted(sizes, key=lambda g: (_group_key(g, seed), str(g))):
        if count >= target_requests:
            break
        chosen.add(group)
        count += sizes[group]
    fraction = count / total
    kept = [r for r in workload.requests if r.group in chosen]
    t0 = kept[0].arrival_s
    scaled = [replace(r, arrival_s=(r.arrival_s - t0) * fraction) for r in kept]
    settings = {
        **workload.settings,
        "sampled_groups": len(chosen),
        "sampled_requests": len(scaled),
        "sampled_fraction": round(fraction, 4),
        "sample_seed": seed,
        "sampling": "whole prefix groups; timeline compressed by the sampled fraction",
    }
    return replace(workload, requests=scaled, settings=settings)


def build_scaled_workload(spec: str, requests: int, /, *, seed: int = 0, **overrides: Any) -> Any:
    """``build_workload`` sized to about ``requests`` requests (0: as defined).

    A trace is cut down with :func:`sample_groups`; a generator with a ``num_requests`` setting gets
    it (so its arrival process is not cut short); others are built as defined and the caller takes
    the first ``requests``. Raises ``ValueError`` for a bad spec or setting.
    """
    from prefixfleet.sim.workloads import build_workload

    if spec.startswith("trace:"):
        workload = build_workload(spec, seed=seed, **overrides)
        return sample_groups(workload, requests, seed=seed) if requests else workload
    if requests and "num_requests" not in overrides:
        try:
            return build_workload(spec, seed=seed, num_requests=requests, **overrides)
        except ValueError as exc:
            if "has no setting 'num_requests'" not in str(exc):
                raise
    return build_workload(spec, seed=seed, **overrides)
